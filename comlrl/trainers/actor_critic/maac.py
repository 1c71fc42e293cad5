"""MAAC: Multi-Agent Actor-Critic with one centralized critic.

The critic (``critic_model`` = an id, directory or model object, or ``critics=[one]``) reads the
joint history: every agent's prompt (V), plus every agent's completion (Q), written as

    [Agent 0] <prompt 0>\\n\\n[Agent 1] <prompt 1> ...   (V)
    ... \\n\\n[Joint Action]\\n\\n[Agent 0 action]\\n<completion 0> ...   (Q)

(the CoMLRL 1.4.3 template, so a critic trained there keeps its meaning) and tokenized with the
first agent's tokenizer, whose vocabulary must fit the critic's embedding. Each joint history is
evaluated once per update for all agents, and the critic takes one optimizer step per minibatch on
every agent's TD targets together.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from comlrl.models.critics import CriticPlan, plan_critics
from comlrl.rollout.tree import Node
from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase
from comlrl.trainers.actor_critic.config import MAACConfig
from comlrl.trainers.actor_critic.export import CRITIC_DIR, ExportEntry, agent_dirs

__all__ = ["MAACConfig", "MAACTrainer", "joint_critic_text"]


def joint_critic_text(prompts: Sequence[str], completions: Optional[Sequence[str]] = None) -> str:
    """The centralized critic's input text: the agents' prompts, and their completions for Q."""
    text = "\n\n".join(f"[Agent {i}] {prompt}" for i, prompt in enumerate(prompts))
    if completions is None:
        return text
    actions = ["[Joint Action]"] + [f"[Agent {i} action]\n{completion}" for i, completion in enumerate(completions)]
    return text + "\n\n" + "\n\n".join(actions)


class MAACTrainer(ActorCriticTrainerBase):
    """Multi-Agent Actor-Critic trainer (see the module docstring and ``MAACConfig``).

    Actors as in ``IACTrainer``; one critic from ``critic_model`` or a one-element ``critics``.
    The critic's value-head width is ``args.critic_value_head_hidden_dim`` or
    ``model_config["critic_value_head_hidden_dim"]``.
    """

    default_config_cls = MAACConfig
    config_family = MAACConfig
    algorithm_name = "MAAC"

    def _plan_critics(self, args: MAACConfig, critic_model: Any, critics: Any, count: int) -> Optional[CriticPlan]:
        if critic_model is None and critics is None:
            raise ValueError(
                "Either critic_model or critics must be provided for MAAC: give critic_model=<id, directory or model> "
                "or critics=[<one of them>] for the centralized critic."
            )
        return plan_critics(critic_model=critic_model, critics=critics, count=1, label="1 critic")

    def _resolve_critic_devices(self, count: int) -> List[torch.device]:
        spec = self.args.critic_devices
        if isinstance(spec, (list, tuple)) and len(spec) != 1:
            raise ValueError(
                f"critic_devices names {len(spec)} devices but MAAC has one centralized critic; give one device, "
                f"e.g. critic_devices='cuda:1'."
            )
        self.critic_device = self.agent_devices[0] if spec is None else self._model_devices(spec, 1, "critic_devices")[0]
        return [self.critic_device]

    @property
    def critic_optimizer(self) -> torch.optim.Optimizer:
        return self._critic_optimizers[0].optimizer

    def _named_critic_optimizers(self) -> List[Tuple[str, torch.optim.Optimizer]]:
        return [("critic_optimizer", self.critic_optimizer)]

    def _critic_slots(self) -> List[Optional[int]]:
        return [0] * self.num_agents

    def _critic_reader(self, slot: int) -> int:
        return 0

    def _critic_metric_prefix(self, slot: int) -> str:
        return "critic/"

    def _critic_input(self, agent: int, node: Node, j: int, prompt_ids: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
        completions = None
        if self.args.critic_type == "q":
            level = node.level.completions
            completions = [level[i].texts[node.completions[i][j]] for i in range(self.num_agents)]
        encoded = self.tokenizers[0](joint_critic_text(node.prompts, completions))
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded.input_ids
        return torch.tensor(ids, dtype=torch.long)

    def _wandb_run_config(self) -> Dict[str, Any]:
        a = self.args
        return {
            "algorithm": self.algorithm_name, "num_agents": self.num_agents, "num_turns": a.num_turns,
            "agent_learning_rate": a.agent_learning_rate, "critic_learning_rate": a.critic_learning_rate,
            "max_new_tokens": a.max_new_tokens, "num_generations": a.num_generations, "critic_type": a.critic_type,
            "reference_kl_enabled": a.reference_kl_enabled, "reference_kl_coef": a.reference_kl_coef,
            "reference_devices": a.reference_devices,
        }

    def _export_entries(self, output_dir: str) -> List[ExportEntry]:
        """``agent_i/`` (backbone + tokenizer i) and ``critic/`` (backbone + ``value_head.pt``)."""
        actors = [
            ExportEntry(path, agent, tokenizer)
            for path, agent, tokenizer in zip(agent_dirs(output_dir, self.num_agents), self.agents, self.tokenizers)
        ]
        return actors + [ExportEntry(os.path.join(output_dir, CRITIC_DIR), self.critics[0])]
