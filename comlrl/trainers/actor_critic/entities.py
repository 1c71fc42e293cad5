"""Who the actors and critics of an IAC / MAAC run are, and loading them (``ActorCriticEntities``, a
mixin of ``ActorCriticTrainerBase``; IAC and MAAC override where their critics sit)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from comlrl.models.critics import CriticPlan, check_critic_reads, load_critics
from comlrl.models.entities import AgentPlan, check_plan_sources, load_agents
from comlrl.models.preflight import check_sources_loadable
from comlrl.models.tokenizers import pad_token_id, tokenizer_fix
from comlrl.models.value_head import CausalLMWithValueHead
from comlrl.trainers.optim import AgentOptimizer


class ActorCriticEntities:
    """The actors and critics of an actor-critic trainer: the argument rules, where each agent's critic
    is (``_critic_slots``: an index into ``critics``, or None for a value head on the actor), whose
    tokens it reads, and loading them all before training."""

    # ------------------------------------------------------------------ validation (before loading)
    def _check_arguments(self, args, agent_model, agents, tokenizer, reward_func, transition, metrics_callback, critic_args) -> None:
        """The CoMLRL 1.4.3 checks, in its order (the critic's presence is checked by ``_plan_critics``)."""
        name = self.algorithm_name
        if reward_func is None or not callable(reward_func):
            raise ValueError(f"reward_func must be a callable that scores joint responses, got {reward_func!r}.")
        if agent_model is None and agents is None:
            raise ValueError("Either agent_model or agents must be provided (a model id, a directory, or a list of them).")
        self._check_critic_arguments(args, *critic_args)
        if agents is None and isinstance(agent_model, nn.Module) and args.num_agents > 1:
            raise ValueError(
                f"Multi-agent IAC/MAAC requires `agent_model` to be a pretrained identifier string: {args.num_agents} "
                f"agents cannot share one {type(agent_model).__name__} object. Pass a model id or directory, or "
                f"agents=[model_0, model_1, ...] with one model object per agent."
            )
        if agents is not None and tokenizer is None:
            raise ValueError(
                f"Tokenizer must be provided when using agents: {name} takes tokenizer=<one tokenizer> or a list with "
                f"one tokenizer per entry of agents (also when agents are ids or directories, as in CoMLRL). "
                f"{tokenizer_fix(agents)}"
            )
        self._check_transition(args, transition, name)
        if metrics_callback is not None and not callable(metrics_callback):
            raise ValueError(f"metrics_callback must be callable (rollouts -> dict), got {type(metrics_callback).__name__}.")

    def _check_critic_arguments(self, args, critic_model: Any, critics: Any) -> None:
        """Refuse critic arguments the arrangement cannot use (before anything loads)."""

    def _plan_critics(self, args, critic_model: Any, critics: Any, count: int) -> Optional[CriticPlan]:
        raise NotImplementedError

    @staticmethod
    def _head_dim(args, model_config: Dict[str, Any], field: str) -> Optional[int]:
        """A value-head width from the config field or ``model_config[field]`` (they must agree)."""
        from_config = getattr(args, field)
        from_model_config = model_config.get(field)
        if from_model_config is not None and from_config is not None and from_model_config != from_config:
            raise ValueError(
                f"{field} is {from_config!r} in the trainer config but {from_model_config!r} in model_config; set it once."
            )
        return from_config if from_config is not None else from_model_config

    # ------------------------------------------------------------------ entities
    def _resolve_critic_devices(self, count: int) -> List[torch.device]:
        """One device per critic slot (and the public ``critic_devices`` / ``critic_device``)."""
        raise NotImplementedError

    def _critic_slots(self) -> List[Optional[int]]:
        """For each agent, the index into ``critics`` of its critic (None: the head on its backbone)."""
        raise NotImplementedError

    def _critic_reader(self, slot: int) -> int:
        """The agent whose tokenizer makes the ids critic ``slot`` reads."""
        raise NotImplementedError

    def _actors_carry_value_heads(self) -> bool:
        return False

    def _actor_head_dim(self, args, model_config: Dict[str, Any]) -> Optional[int]:
        return None

    def _load_entities(self, plan: AgentPlan, critic_plan: Optional[CriticPlan], model_config: Dict[str, Any], critic_devices,
                       reference_devices, head_dims, peft_configs) -> None:
        args = self.args
        actor_dim, critic_dim = head_dims
        if critic_plan:  # every missing path is named before the first model loads
            check_sources_loadable(critic_plan.sources, "critics")
        check_plan_sources(plan)
        agent_peft, critic_peft = peft_configs
        options = self._load_options(model_config)
        if self._lora is not None and critic_plan:  # a critic over the agents' base is refused before the agents load
            self._lora.refuse_sharing((plan.sources, agent_peft, self.agent_devices, "agent"),
                                      (critic_plan.sources, critic_peft, critic_devices, "critic"))
        backbones, self.tokenizers = load_agents(plan, model_config, self.agent_devices, options, agent_peft, self._lora,
                                                 self.prompt_check)
        self.tokenizer = self.tokenizers[0]
        self.agents = [self._wrap_actor(m, s, actor_dim) for m, s in zip(backbones, plan.sources)]
        self.critics = (
            load_critics(critic_plan, model_config, critic_devices, critic_dim, options, critic_peft, self._lora) if critic_plan else []
        )
        self._critic_sources = list(critic_plan.sources) if critic_plan else []
        self._critic_of_agent = self._critic_slots()
        for slot, critic in enumerate(self.critics):
            reader = self._critic_reader(slot)
            check_critic_reads(critic, self.tokenizers[reader], f"critics[{slot}]", f"the tokenizer of agents[{reader}]")
        self._build_policies([a.model for a in self.agents], self.agents, plan.sources, reference_devices)
        self.agent_optimizers = [p.optimizer.optimizer for p in self.policies]
        made: Dict[int, AgentOptimizer] = {}
        for critic in self.critics:  # critics that are one shared object get one optimizer
            if id(critic) not in made:
                made[id(critic)] = self._make_optimizer(critic.parameters(), args.critic_learning_rate)
        self._critic_optimizers = [made[id(critic)] for critic in self.critics]
        self._critic_pad_ids = [pad_token_id(self.tokenizers[self._critic_reader(s)]) for s in range(len(self.critics))]

    def _wrap_actor(self, model: nn.Module, source: Any, dim: Optional[int]) -> CausalLMWithValueHead:
        """The actor as a ``CausalLMWithValueHead``; with shared heads, a fresh head unless the model
        object already carries one (a directory's saved ``value_head.pt`` is loaded only on request:
        ``trainer.agents[i].load_value_head(directory)``)."""
        heads = self._actors_carry_value_heads()
        if isinstance(model, CausalLMWithValueHead):
            actor = model
            if heads and actor.value_head is None:
                actor.attach_value_head(dim)
        else:
            actor = CausalLMWithValueHead(model, value_head_hidden_dim=dim, attach_value_head=heads)
        return actor.eval()  # dropout stays off: updates score the distribution that sampled
