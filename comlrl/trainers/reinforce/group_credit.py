"""The credit stage of the MAGRPO-family step: from the groups one agent drew at one turn to one
advantage per completion.

The maths is in ``comlrl.core`` (the registered estimators, ``core.credit``); ``GroupCredit`` holds
the choices the config made (``advantage_mode``, ``advantage_normalization``, ``scale_rewards``,
``advantage_grouping``, ``counterfactual_credit``, the reference KL in the reward) as one frozen
value built once, and applies them to the samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from comlrl.core.advantages import group_advantages, normalize_groups
from comlrl.core.credit import counterfactual_advantages, mean_pairwise_correlation, pooled_advantages, scale_advantages
from comlrl.rollout.tree import GroupSample
from comlrl.trainers import reference_kl


@dataclass(frozen=True)
class GroupCredit:
    """How a MAGRPO-family config credits completions (see the module docstring)."""

    advantage_mode: str
    normalise: bool
    scale_rewards: str
    grouping: str  # "node" or "agent_turn"
    counterfactual: bool
    kl_penalty: Optional[float]  # the reward-mode KL coefficient (None: the KL is not in the returns)
    joint_mode: str

    @classmethod
    def from_config(cls, args: Any) -> "GroupCredit":
        return cls(
            advantage_mode=args.advantage_mode, normalise=bool(args.advantage_normalization), scale_rewards=args.scale_rewards,
            grouping=args.advantage_grouping, counterfactual=bool(args.counterfactual_credit),
            kl_penalty=reference_kl.penalty_coef(args), joint_mode=args.joint_mode,
        )

    def returns(self, sample: GroupSample) -> torch.Tensor:
        """``[K]`` returns; with the KL in the reward minus ``coef * (log pi - log pi_ref)`` (see
        ``core.kl.sequence_log_ratio`` for why the penalty is k1, not the logged k3)."""
        returns = sample.returns.float()
        if self.kl_penalty is not None and sample.reference_log_ratio is not None:
            returns = returns - self.kl_penalty * sample.reference_log_ratio.float()
        return returns

    def _penalised_joint(self, sample: GroupSample) -> torch.Tensor:
        """``[K, M]`` joint returns of the sample's completions (with the KL in the reward: the penalty on each completion's row)."""
        joint = sample.joint_returns.float()
        if self.kl_penalty is not None and sample.reference_log_ratio is not None:
            joint = joint - self.kl_penalty * sample.reference_log_ratio.float().unsqueeze(-1)
        return joint

    def advantages(self, samples: Sequence[GroupSample]) -> List[torch.Tensor]:
        """One ``[K]`` advantage tensor per sample (all of one agent at one turn)."""
        normalise = self.normalise
        if self.counterfactual:
            if any(s.joint_returns is None for s in samples):
                raise ValueError('counterfactual_credit needs the joint returns of cross mode (joint_mode="cross").')
            per_context = normalise and self.scale_rewards == "group"
            raw = [counterfactual_advantages(self._penalised_joint(s), self.advantage_mode, per_context) for s in samples]
            return scale_advantages(raw, "batch") if normalise and self.scale_rewards == "batch" else raw
        returns = [self.returns(s) for s in samples]
        if self.grouping == "agent_turn":
            raw = pooled_advantages(returns, self.advantage_mode)
            if not normalise or self.scale_rewards == "none":
                return raw
            # one pooled group: its group std and its batch std are the same number
            sizes = [r.numel() for r in raw]
            return list(torch.split(normalize_groups(torch.cat(raw).reshape(1, -1)).reshape(-1), sizes))
        raw = [group_advantages(r, self.advantage_mode) for r in returns]
        if not normalise:
            return raw
        return scale_advantages(raw, self.scale_rewards)  # "group": normalize_groups per group, CoMLRL 1.4.3

    def correlation(self, samples: Sequence[GroupSample], num_agents: int, k: int) -> Optional[float]:
        """Mean pairwise correlation of the agents' advantages over the joint responses they formed this
        step (each joint response gives every agent the advantage of its own completion in it). 1: every
        agent is credited identically, as a shared reward with per-node baselines does in aligned mode."""
        if num_agents < 2:
            return None
        by_agent_turn: Dict[tuple, List[GroupSample]] = {}
        for s in samples:
            by_agent_turn.setdefault((s.agent_idx, s.turn_idx), []).append(s)
        advantages: Dict[tuple, torch.Tensor] = {}
        for group in by_agent_turn.values():
            for s, a in zip(group, self.advantages(group)):
                advantages[(s.node_key, s.agent_idx)] = a
        columns = []
        for key in {s.node_key for s in samples}:
            per_agent = [advantages.get((key, agent)) for agent in range(num_agents)]
            if any(a is None or a.numel() != k for a in per_agent):
                continue
            columns.append(torch.stack([_joint_view(a, agent, num_agents, self.joint_mode) for agent, a in enumerate(per_agent)]))
        if not columns:
            return None
        return mean_pairwise_correlation(torch.cat(columns, dim=1))


def _joint_view(advantages: torch.Tensor, agent: int, num_agents: int, joint_mode: str) -> torch.Tensor:
    """``[J]``: the agent's advantage of its own completion in each joint response of a node."""
    if joint_mode != "cross":
        return advantages
    k = advantages.numel()
    shape = [1] * num_agents
    shape[agent] = k
    return advantages.reshape(shape).expand((k,) * num_agents).reshape(-1)
