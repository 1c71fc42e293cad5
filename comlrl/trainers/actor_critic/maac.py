"""MAAC: Multi-Agent Actor-Critic with one centralized critic.

The critic (``critic_model`` = an id, directory or model object, or ``critics=[one]``) reads the
joint history: every agent's prompt (V), plus every agent's completion (Q), written as

    [Agent 0] <prompt 0>\\n\\n[Agent 1] <prompt 1> ...   (V)
    ... \\n\\n[Joint Action]\\n\\n[Agent 0 action]\\n<completion 0> ...   (Q)

(the CoMLRL 1.4.3 template, so a critic trained there keeps its meaning) and tokenized with the
first agent's tokenizer, whose vocabulary must fit the critic's embedding. Each joint history is
evaluated once per update for all agents, and the critic takes one optimizer step per minibatch on
every agent's TD targets together (``CentralCritic``).
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from comlrl.models.critics import CriticPlan, plan_critics
from comlrl.rollout.tree import Node
from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase
from comlrl.trainers.actor_critic.config import MAACConfig
from comlrl.trainers.actor_critic.entities import CriticArrangement
from comlrl.trainers.actor_critic.export import CRITIC_DIR, ExportEntry, agent_dirs
from comlrl.trainers.team import Team

__all__ = ["CentralCritic", "MAACConfig", "MAACTrainer", "joint_critic_text"]


def joint_critic_text(prompts: Sequence[str], completions: Optional[Sequence[str]] = None) -> str:
    """The centralized critic's input text: the agents' prompts, and their completions for Q."""
    text = "\n\n".join(f"[Agent {i}] {prompt}" for i, prompt in enumerate(prompts))
    if completions is None:
        return text
    actions = ["[Joint Action]"] + [f"[Agent {i} action]\n{completion}" for i, completion in enumerate(completions)]
    return text + "\n\n" + "\n\n".join(actions)


class CentralCritic(CriticArrangement):
    """MAAC's arrangement: one critic for every agent, reading the joint history in agent 0's tokens."""

    name = "MAAC"

    def plan(self, critic_model: Any, critics: Any, count: int) -> Optional[CriticPlan]:
        if critic_model is None and critics is None:
            raise ValueError(
                "Either critic_model or critics must be provided for MAAC: give critic_model=<id, directory or model> "
                "or critics=[<one of them>] for the centralized critic."
            )
        return plan_critics(critic_model=critic_model, critics=critics, count=1, label="1 critic")

    def devices(self, team: Team, count: int) -> List[torch.device]:
        spec = self.args.critic_devices
        if isinstance(spec, (list, tuple)) and len(spec) != 1:
            raise ValueError(
                f"critic_devices names {len(spec)} devices but MAAC has one centralized critic; give one device, "
                f"e.g. critic_devices='cuda:1'."
            )
        return [team.devices[0] if spec is None else team.model_devices(spec, 1, "critic_devices")[0]]

    def slots(self, count: int) -> List[Optional[int]]:
        return [0] * count

    def reader(self, slot: int) -> int:
        return 0

    def metric_prefix(self, slot: int) -> str:
        return "critic/"

    def critic_input(self, tokenizers: Sequence[Any], agent: int, node: Node, j: int, prompt_ids: torch.Tensor,
                     completion_ids: torch.Tensor) -> torch.Tensor:
        completions = None
        if self.args.critic_type == "q":
            level = node.level.completions
            completions = [level[i].texts[node.completions[i][j]] for i in range(len(tokenizers))]
        encoded = tokenizers[0](joint_critic_text(node.prompts, completions))
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded.input_ids
        return torch.tensor(ids, dtype=torch.long)

    def export_entries(self, output_dir: str, agents: Sequence[nn.Module], tokenizers: Sequence[Any],
                       critics: Sequence[nn.Module]) -> List[ExportEntry]:
        """``agent_i/`` (backbone + tokenizer i) and ``critic/`` (backbone + ``value_head.pt``)."""
        actors = [ExportEntry(path, agent, tokenizer) for path, agent, tokenizer in zip(agent_dirs(output_dir, len(agents)), agents, tokenizers)]
        return actors + [ExportEntry(os.path.join(output_dir, CRITIC_DIR), critics[0])]

    def named_critic_optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> List[Tuple[str, torch.optim.Optimizer]]:
        return [("critic_optimizer", optimizers[0])]


class MAACTrainer(ActorCriticTrainerBase):
    """Multi-Agent Actor-Critic trainer (see the module docstring and ``MAACConfig``).

    Actors as in ``IACTrainer``; one critic from ``critic_model`` or a one-element ``critics``.
    The critic's value-head width is ``args.critic_value_head_hidden_dim`` or
    ``model_config["critic_value_head_hidden_dim"]``.
    """

    algorithm = "maac"
    algorithm_name = "MAAC"
    default_config_cls = MAACConfig
    config_family = MAACConfig
    arrangement_cls = CentralCritic

    @property
    def critic_device(self) -> torch.device:
        return self.critic_set.devices[0]

    @property
    def critic_optimizer(self) -> torch.optim.Optimizer:
        return self.critic_set.optimizers[0].optimizer
