"""MAGRPO's credit: from the groups one agent drew at one turn to one advantage per completion.

The maths is in ``comlrl.core`` (the registered estimators, ``core.credit``); this module only picks
it from the config's fields (``advantage_mode``, ``advantage_normalization``, ``scale_rewards``,
``advantage_grouping``, ``counterfactual_credit``) and reads the samples.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from comlrl.core.advantages import group_advantages, normalize_groups
from comlrl.core.credit import counterfactual_advantages, mean_pairwise_correlation, pooled_advantages, scale_advantages
from comlrl.rollout.tree import GroupSample


def kl_in_reward(args) -> bool:
    """Whether the reference KL is a penalty in the returns (``reference_kl_mode="reward"``, CoMLRL
    1.4.3) rather than its own loss term (the default)."""
    return bool(args.reference_kl_enabled) and args.reference_kl_mode == "reward"


def credited_returns(sample: GroupSample, args) -> torch.Tensor:
    """``[K]`` returns; with ``reference_kl_mode="reward"`` minus ``reference_kl_coef * (log pi - log pi_ref)``
    (see ``core.kl.sequence_log_ratio`` for why the penalty is k1, not the logged k3)."""
    returns = sample.returns.float()
    if kl_in_reward(args) and sample.reference_log_ratio is not None:
        returns = returns - args.reference_kl_coef * sample.reference_log_ratio.float()
    return returns


def _penalised_joint(sample: GroupSample, args) -> torch.Tensor:
    """``[K, M]`` joint returns of the sample's completions (in "reward" mode the KL penalty on each completion's row)."""
    joint = sample.joint_returns.float()
    if kl_in_reward(args) and sample.reference_log_ratio is not None:
        joint = joint - args.reference_kl_coef * sample.reference_log_ratio.float().unsqueeze(-1)
    return joint


def turn_advantages(samples: Sequence[GroupSample], args) -> List[torch.Tensor]:
    """One ``[K]`` advantage tensor per sample (all of one agent at one turn), as the config says."""
    normalise = args.advantage_normalization
    if args.counterfactual_credit:
        if any(s.joint_returns is None for s in samples):
            raise ValueError('counterfactual_credit needs the joint returns of cross mode (joint_mode="cross").')
        per_context = normalise and args.scale_rewards == "group"
        raw = [counterfactual_advantages(_penalised_joint(s, args), args.advantage_mode, per_context) for s in samples]
        return scale_advantages(raw, "batch") if normalise and args.scale_rewards == "batch" else raw
    returns = [credited_returns(s, args) for s in samples]
    if args.advantage_grouping == "agent_turn":
        raw = pooled_advantages(returns, args.advantage_mode)
        if not normalise or args.scale_rewards == "none":
            return raw
        # one pooled group: its group std and its batch std are the same number
        sizes = [r.numel() for r in raw]
        return list(torch.split(normalize_groups(torch.cat(raw).reshape(1, -1)).reshape(-1), sizes))
    raw = [group_advantages(r, args.advantage_mode) for r in returns]
    if not normalise:
        return raw
    return scale_advantages(raw, args.scale_rewards)  # "group": normalize_groups per group, CoMLRL 1.4.3


def credit_correlation(samples: Sequence[GroupSample], args, num_agents: int, k: int) -> Optional[float]:
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
        for s, a in zip(group, turn_advantages(group, args)):
            advantages[(s.node_key, s.agent_idx)] = a
    columns = []
    for key in {s.node_key for s in samples}:
        per_agent = [advantages.get((key, agent)) for agent in range(num_agents)]
        if any(a is None or a.numel() != k for a in per_agent):
            continue
        columns.append(torch.stack([_joint_view(a, agent, num_agents, args.joint_mode) for agent, a in enumerate(per_agent)]))
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
