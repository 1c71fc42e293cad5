"""IAC: Independent Actor-Critic. Each actor learns from its own critic, which sees only that
actor's prompt (V) or prompt and completion (Q).

Critic arrangements:
- ``use_separate_critic=True``: ``critics=[c_0, ..., c_{N-1}]`` (ids, directories or model objects)
  or ``critic_model=c`` broadcast: an id or directory is loaded once and copied per agent
  (independent critics); one model object is shared by all agents (one critic trained on every
  agent's samples, stepped once per update). Critic i reads agent i's token ids.
- ``use_separate_critic=False``: a value head on each actor's backbone (``trainer.agents[i].value_head``);
  one forward scores the log-probs and the values, one backward and one step optimise
  ``policy loss + value_loss_coef * value loss``. ``critic_model``/``critics`` are refused.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from comlrl.models.critics import CriticPlan, plan_critics
from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase
from comlrl.trainers.actor_critic.config import IACConfig
from comlrl.trainers.actor_critic.export import ExportEntry, agent_dirs
from comlrl.trainers.actor_critic.samples import RolloutSample

__all__ = ["IACConfig", "IACTrainer", "RolloutSample"]


class IACTrainer(ActorCriticTrainerBase):
    """Independent Actor-Critic trainer (see the module docstring and ``IACConfig``).

    Actors: ``agent_model`` (an id or directory; ``args.num_agents`` independent copies) or
    ``agents`` (one id, directory or model object per actor). ``tokenizer`` (one, or a list with one
    per actor) is required with ``agents`` and loaded from ``agent_model`` when omitted.
    """

    default_config_cls = IACConfig
    config_family = IACConfig
    algorithm_name = "IAC"

    def _check_critic_arguments(self, args: IACConfig, critic_model: Any, critics: Any) -> None:
        if not args.use_separate_critic and (critic_model is not None or critics is not None):
            given = "critic_model" if critic_model is not None else "critics"
            raise ValueError(
                f"{given} was given but use_separate_critic=False puts a value head on each actor's own backbone, so "
                f"there is no critic model to load. Drop {given}, or set IACConfig(use_separate_critic=True)."
            )

    def _plan_critics(self, args: IACConfig, critic_model: Any, critics: Any, count: int) -> Optional[CriticPlan]:
        if not args.use_separate_critic:
            return None
        if critic_model is None and critics is None:
            raise ValueError(
                "Either critic_model or critics must be provided when use_separate_critic=True: give critic_model=<id "
                "or directory> (one independent copy per agent) or critics=[...] with one per agent, or set "
                "use_separate_critic=False for value heads on the actors."
            )
        return plan_critics(critic_model=critic_model, critics=critics, count=count, label=f"num_agents ({count})")

    def _resolve_critic_devices(self, count: int) -> List[torch.device]:
        if not self.args.use_separate_critic:
            self.critic_devices: List[torch.device] = []
        elif self.args.critic_devices is None:
            self.critic_devices = list(self.agent_devices)
        else:
            self.critic_devices = self._model_devices(self.args.critic_devices, count, "critic_devices")
        return self.critic_devices

    @property
    def critic_type(self) -> str:
        return self.args.critic_type

    @property
    def critic_optimizers(self) -> List[torch.optim.Optimizer]:
        """One AdamW per critic (the same object for critics that share one model)."""
        return [optimizer.optimizer for optimizer in self._critic_optimizers]

    def _named_critic_optimizers(self) -> List[Tuple[str, torch.optim.Optimizer]]:
        return [(f"critic_optimizers.{i}", optimizer) for i, optimizer in enumerate(self.critic_optimizers)]

    def _critic_slots(self) -> List[Optional[int]]:
        return list(range(self.num_agents)) if self.args.use_separate_critic else [None] * self.num_agents

    def _critic_reader(self, slot: int) -> int:
        return slot

    def _actors_carry_value_heads(self) -> bool:
        return not self.args.use_separate_critic

    def _actor_head_dim(self, args: IACConfig, model_config: Dict[str, Any]) -> Optional[int]:
        return self._head_dim(args, model_config, "value_head_hidden_dim")

    def _value_clip_range(self) -> Optional[float]:
        return self.args.value_clip_range

    def _critic_input(self, agent: int, node: Any, j: int, prompt_ids: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
        """V reads the agent's prompt (its history); Q reads the prompt and the agent's completion."""
        return prompt_ids if self.args.critic_type == "v" else torch.cat([prompt_ids, completion_ids])

    def _wandb_run_config(self) -> Dict[str, Any]:
        a = self.args
        return {
            "algorithm": self.algorithm_name, "num_agents": self.num_agents, "num_turns": a.num_turns,
            "agent_learning_rate": a.agent_learning_rate, "critic_learning_rate": a.critic_learning_rate,
            "rollout_buffer_size": a.rollout_buffer_size, "train_batch_size": a.train_batch_size,
            "value_loss_coef": a.value_loss_coef, "max_new_tokens": a.max_new_tokens,
            "use_separate_critic": a.use_separate_critic, "critic_type": a.critic_type,
            "reference_kl_enabled": a.reference_kl_enabled, "reference_kl_coef": a.reference_kl_coef,
            "reference_devices": a.reference_devices,
        }

    def _export_entries(self, output_dir: str) -> List[ExportEntry]:
        """N > 1: ``agent_i/`` (backbone, ``value_head.pt`` with shared heads, tokenizer i) and
        ``agent_i/critic/`` (separate critic + ``value_head.pt``). N == 1: the same files directly
        in ``output_dir`` (CoMLRL 1.4.3 layout)."""
        critics = self.critics if self.critics else [None] * self.num_agents
        if self.num_agents == 1:
            return [ExportEntry(output_dir, self.agents[0], self.tokenizers[0], critics[0], into_existing=True)]
        return [
            ExportEntry(path, agent, tokenizer, critic)
            for path, agent, tokenizer, critic in zip(agent_dirs(output_dir, self.num_agents), self.agents, self.tokenizers, critics)
        ]
