"""Training entities: agents, critics with value heads, tokenizers, loading and export."""

from comlrl.models.value_head import ActorCriticOutput, CausalLMWithValueHead, ValueHead

__all__ = ["ActorCriticOutput", "CausalLMWithValueHead", "ValueHead"]
