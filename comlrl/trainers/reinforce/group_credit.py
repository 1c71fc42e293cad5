"""The credit stage of the MAGRPO-family step: from the groups one agent drew at one turn to one
advantage per completion.

The maths is in ``comlrl.core`` (the registered estimators, ``core.credit``); ``GroupCredit`` holds
the choices the config made (``advantage_mode``, ``advantage_normalization``, ``scale_rewards``,
``advantage_grouping``, ``counterfactual_credit``, the reference KL in the reward, DAPO's soft
overlong punishment) as one frozen value built once, and applies them to the samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from comlrl.core.advantages import group_advantages, normalize_groups
from comlrl.core.credit import (
    counterfactual_advantages,
    mean_pairwise_correlation,
    pooled_advantages,
    scale_advantages,
    soft_overlong_penalty,
)
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
    max_length: int  # L_max of the soft overlong punishment: max_new_tokens
    overlong_cache: Optional[int]  # its L_cache (None: off)

    @classmethod
    def from_config(cls, args: Any) -> "GroupCredit":
        return cls(
            advantage_mode=args.advantage_mode, normalise=bool(args.advantage_normalization), scale_rewards=args.scale_rewards,
            grouping=args.advantage_grouping, counterfactual=bool(args.counterfactual_credit),
            kl_penalty=reference_kl.penalty_coef(args), joint_mode=args.joint_mode, max_length=args.max_new_tokens,
            overlong_cache=args.soft_overlong_cache,
        )

    def _penalty(self, sample: GroupSample) -> Optional[torch.Tensor]:
        """``[K]`` what is added to each completion's credit: minus the reward-mode KL penalty
        ``coef * (log pi - log pi_ref)`` (see ``core.kl.sequence_log_ratio`` for why it is k1, not the
        logged k3) plus DAPO's soft overlong punishment of its own length; None when neither is on."""
        out = None
        if self.kl_penalty is not None and sample.reference_log_ratio is not None:
            out = -self.kl_penalty * sample.reference_log_ratio.float()
        if self.overlong_cache is not None:
            lengths = torch.tensor([len(c) for c in sample.completion_ids])
            overlong = soft_overlong_penalty(lengths, self.max_length, self.overlong_cache).float()
            out = overlong if out is None else out + overlong
        return out

    def returns(self, sample: GroupSample) -> torch.Tensor:
        """``[K]`` the credited returns: the sample's returns plus its per-completion penalties."""
        penalty = self._penalty(sample)
        return sample.returns.float() if penalty is None else sample.returns.float() + penalty

    def _penalised_joint(self, sample: GroupSample) -> torch.Tensor:
        """``[K, M]`` joint returns of the sample's completions (each completion's penalties on its row)."""
        penalty = self._penalty(sample)
        joint = sample.joint_returns.float()
        return joint if penalty is None else joint + penalty.unsqueeze(-1)

    def signal_values(self, sample: GroupSample) -> torch.Tensor:
        """What the sample's advantages are computed from: its credited returns, or with counterfactual
        credit its joint returns against every context of the others."""
        return self._penalised_joint(sample) if self.counterfactual else self.returns(sample)

    def carries_signal(self, sample: GroupSample) -> bool:
        """Whether the group's credited rewards differ at all (DAPO's dynamic sampling keeps it)."""
        values = self.signal_values(sample).reshape(-1)
        return bool((values != values[0]).any())

    def advantages(self, samples: Sequence[GroupSample]) -> List[torch.Tensor]:
        """One ``[K]`` advantage tensor per sample (all of one agent at one turn)."""
        normalise = self.normalise
        if self.counterfactual:
            if any(s.joint_returns is None for s in samples):
                raise ValueError('counterfactual_credit needs the joint returns of cross mode (joint_mode="cross").')
            joints = [self._penalised_joint(s) for s in samples]
            per_context = normalise and self.scale_rewards == "group"
            raw = [counterfactual_advantages(j, self.advantage_mode, per_context) for j in joints]
            if not normalise or self.scale_rewards in ("group", "none"):
                return raw
            return scale_advantages(raw, self.scale_rewards, rewards=joints)
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
        return scale_advantages(raw, self.scale_rewards, rewards=returns)  # "group": normalize_groups per group, CoMLRL 1.4.3

    def correlation(self, samples: Sequence[GroupSample], num_agents: int, k: int) -> Optional[float]:
        """Mean pairwise correlation of the agents' advantages over the aligned joint responses they formed
        this step (joint response j gives every agent the advantage of its own j-th completion). 1: every
        agent is credited identically, as a shared reward with per-node baselines does; below 1 where
        per-agent terms (the reward-mode KL penalty, the soft overlong punishment) separate them.

        None in cross mode: there a node's K^N joint responses are a full grid, agent i's advantage varies
        only along axis i, and two functions of independent grid axes are uncorrelated whatever they are
        (identically 0 over a node, a mere mix of node means over several), so the number says nothing."""
        if num_agents < 2 or self.joint_mode == "cross":
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
            columns.append(torch.stack(per_agent))
        if not columns:
            return None
        return mean_pairwise_correlation(torch.cat(columns, dim=1))
