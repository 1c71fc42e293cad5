"""IAC: Independent Actor-Critic. Each actor learns from its own critic, which sees only that
actor's prompt (V) or prompt and completion (Q).

Critic arrangements (``IndependentCritics``):
- ``use_separate_critic=True``: ``critics=[c_0, ..., c_{N-1}]`` (ids, directories or model objects)
  or ``critic_model=c`` broadcast: an id or directory is loaded once and copied per agent
  (independent critics); one model object is shared by all agents (one critic trained on every
  agent's samples, stepped once per update). Critic i reads agent i's token ids.
- ``use_separate_critic=False``: a value head on each actor's backbone (``trainer.agents[i].value_head``);
  one forward scores the log-probs and the values, one backward and one step optimise
  ``policy loss + value_loss_coef * value loss``. ``critic_model``/``critics`` are refused.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from comlrl.models.critics import CriticPlan, plan_critics
from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase
from comlrl.trainers.actor_critic.config import IACConfig
from comlrl.trainers.actor_critic.entities import CriticArrangement, head_dim
from comlrl.trainers.actor_critic.export import ExportEntry, agent_dirs
from comlrl.trainers.actor_critic.samples import RolloutSample
from comlrl.trainers.team import Team

__all__ = ["IACConfig", "IACTrainer", "IndependentCritics", "RolloutSample"]


class IndependentCritics(CriticArrangement):
    """IAC's arrangement: a critic per agent (or a value head on each actor), reading that agent's tokens."""

    name = "IAC"

    def __init__(self, args: IACConfig):
        super().__init__(args)
        self.actor_value_heads = not args.use_separate_critic

    def check_critic_arguments(self, critic_model: Any, critics: Any) -> None:
        if not self.args.use_separate_critic and (critic_model is not None or critics is not None):
            given = "critic_model" if critic_model is not None else "critics"
            raise ValueError(
                f"{given} was given but use_separate_critic=False puts a value head on each actor's own backbone, so "
                f"there is no critic model to load. Drop {given}, or set IACConfig(use_separate_critic=True)."
            )

    def plan(self, critic_model: Any, critics: Any, count: int) -> Optional[CriticPlan]:
        if not self.args.use_separate_critic:
            return None
        if critic_model is None and critics is None:
            raise ValueError(
                "Either critic_model or critics must be provided when use_separate_critic=True: give critic_model=<id "
                "or directory> (one independent copy per agent) or critics=[...] with one per agent, or set "
                "use_separate_critic=False for value heads on the actors."
            )
        return plan_critics(critic_model=critic_model, critics=critics, count=count, label=f"num_agents ({count})")

    def devices(self, team: Team, count: int) -> List[torch.device]:
        if not self.args.use_separate_critic:
            return []
        if self.args.critic_devices is None:
            return list(team.devices)
        return team.model_devices(self.args.critic_devices, count, "critic_devices")

    def slots(self, count: int) -> List[Optional[int]]:
        return list(range(count)) if self.args.use_separate_critic else [None] * count

    def reader(self, slot: int) -> int:
        return slot

    def actor_head_dim(self, model_config: Dict[str, Any]) -> Optional[int]:
        return head_dim(self.args, model_config, "value_head_hidden_dim")

    @property
    def value_clip_range(self) -> Optional[float]:
        return self.args.value_clip_range

    def critic_input(self, tokenizers: Sequence[Any], agent: int, node: Any, j: int, prompt_ids: torch.Tensor,
                     completion_ids: torch.Tensor) -> torch.Tensor:
        """V reads the agent's prompt (its history); Q reads the prompt and the agent's completion."""
        return prompt_ids if self.args.critic_type == "v" else torch.cat([prompt_ids, completion_ids])

    def export_entries(self, output_dir: str, agents: Sequence[nn.Module], tokenizers: Sequence[Any],
                       critics: Sequence[nn.Module]) -> List[ExportEntry]:
        """N > 1: ``agent_i/`` (backbone, ``value_head.pt`` with shared heads, tokenizer i) and
        ``agent_i/critic/`` (separate critic + ``value_head.pt``). N == 1: the same files directly
        in ``output_dir`` (CoMLRL 1.4.3 layout)."""
        count = len(agents)
        critics = list(critics) if critics else [None] * count
        if count == 1:
            return [ExportEntry(output_dir, agents[0], tokenizers[0], critics[0], into_existing=True)]
        return [
            ExportEntry(path, agent, tokenizer, critic)
            for path, agent, tokenizer, critic in zip(agent_dirs(output_dir, count), agents, tokenizers, critics)
        ]

    def named_critic_optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> List[Tuple[str, torch.optim.Optimizer]]:
        return [(f"critic_optimizers.{i}", optimizer) for i, optimizer in enumerate(optimizers)]


class IACTrainer(ActorCriticTrainerBase):
    """Independent Actor-Critic trainer (see the module docstring and ``IACConfig``).

    Actors: ``agent_model`` (an id or directory; ``args.num_agents`` independent copies) or
    ``agents`` (one id, directory or model object per actor). ``tokenizer`` (one, or a list with one
    per actor) is required with ``agents`` and loaded from ``agent_model`` when omitted.
    """

    algorithm = "iac"
    algorithm_name = "IAC"
    default_config_cls = IACConfig
    config_family = IACConfig
    arrangement_cls = IndependentCritics

    @property
    def critic_devices(self) -> List[torch.device]:
        return self.critic_set.devices

    @property
    def critic_type(self) -> str:
        return self.args.critic_type

    @property
    def critic_optimizers(self) -> List[torch.optim.Optimizer]:
        """One AdamW per critic (the same object for critics that share one model)."""
        return [optimizer.optimizer for optimizer in self.critic_set.optimizers]
