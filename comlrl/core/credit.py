"""Multi-agent credit assignment and advantage scaling (pure tensor maths).

Shapes: G groups of K samples (one agent's K completions at one node), as ``[G, K]`` or a list of
``[K]`` tensors. Estimators come from the registry (``comlrl.core.registry``); these functions decide
*which* samples form a group, what the advantages are divided by, and how an agent's credit is
separated from the other agents' choices.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from comlrl.core.advantages import normalize_groups
from comlrl.core.registry import get_advantage

SCALE_REWARDS = ("group", "batch", "agent", "none")


def scale_advantages(advantages: Sequence[torch.Tensor], scale: str, rewards: Optional[Sequence[torch.Tensor]] = None,
                     eps: float = 1e-6) -> List[torch.Tensor]:
    """Scale a batch of groups' advantages (TRL's ``scale_rewards``; Dr. GRPO, Liu et al. 2025). Every std
    is the population std (``unbiased=False``, as 1.4.3's group std; TRL uses Bessel's correction,
    a factor ``sqrt(n / (n - 1))`` apart).

    - ``"group"`` (CoMLRL 1.4.3, GRPO): ``(A - mean_g A) / max(std_g A, eps)`` within each group.
    - ``"batch"`` (TRL): ``A / max(std_B(R), eps)``: the baseline's advantages divided by one std of the
      raw ``rewards`` R over every group of the batch B (so two prompts whose rewards lie far apart
      keep small advantages; with the mean baseline exactly TRL's ``(R - mean_g R) / std_B(R)``).
    - ``"agent"``: ``(A - mean_g A) / max(std_B(A - mean_g A), eps)``: centred within each group, divided
      by one std of the centred values over the batch. A batch only ever holds one agent's groups, so
      this is a per-agent scale, never pooled with another agent's (the point of Dr. MAS, Feng et al.
      2026); every batch ends with std exactly 1.
    - ``"none"``: ``A`` unchanged (Dr. GRPO: no std division, no difficulty bias).

    Args:
        advantages: G tensors ``[K_g]``.
        rewards: G tensors (any shapes) of the rewards the advantages were computed from; ``"batch"`` only.
    Returns:
        G tensors ``[K_g]`` (input dtypes).
    """
    if scale == "group":
        return [normalize_groups(a, eps) for a in advantages]
    if scale == "none":
        return [a.clone() for a in advantages]
    if scale == "batch":
        if rewards is None:
            raise ValueError('scale_advantages(..., "batch") needs the raw rewards of the batch.')
        flat = torch.cat([r.double().reshape(-1) for r in rewards]) if rewards else torch.zeros(0, dtype=torch.float64)
        if flat.numel() <= 1:
            return [a.clone() for a in advantages]
        std = flat.std(unbiased=False).clamp_min(eps)
        return [(a.double() / std).to(a.dtype) for a in advantages]
    if scale != "agent":
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {scale!r}.")
    centred = [a.double() - a.double().mean() for a in advantages]
    flat = torch.cat(centred) if centred else torch.zeros(0, dtype=torch.float64)
    if flat.numel() <= 1:
        return [a.clone() for a in advantages]
    std = flat.std(unbiased=False).clamp_min(eps)
    return [(c / std).to(a.dtype) for c, a in zip(centred, advantages)]


def soft_overlong_penalty(lengths: torch.Tensor, max_length: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, overlong reward shaping) of completions of ``lengths`` tokens:

        0                                      if |y| <= L_max - L_cache
        (L_max - L_cache - |y|) / L_cache      if L_max - L_cache < |y| <= L_max
        -1                                     if |y| > L_max

    with ``L_max = max_length`` and ``L_cache = cache``: a ramp from 0 to -1 over the last ``cache``
    tokens. Shapes: ``[...] -> [...]`` (float64).
    """
    if not 1 <= cache < max_length:
        raise ValueError(f"the soft overlong punishment needs 1 <= cache < max_length, got cache={cache}, max_length={max_length}.")
    length = lengths.double()
    ramp = (max_length - cache - length) / cache
    return torch.where(length <= max_length - cache, torch.zeros_like(length), torch.where(length <= max_length, ramp, -torch.ones_like(length)))


def pooled_advantages(returns: Sequence[torch.Tensor], mode: str) -> List[torch.Tensor]:
    """Agent-and-turn grouping (AT-GRPO, PettingLLMs, Zhao et al. 2025): the baseline of ``mode`` over
    every sample one agent drew at one turn, ``A_s = f_mode(R_{agent, turn})_s``, instead of per node.

    Args:
        returns: G tensors ``[K_g]``: one agent's groups at one turn.
    Returns:
        G tensors ``[K_g]``: the pooled group's advantages, split back per node.
    """
    if not returns:
        return []
    sizes = [r.numel() for r in returns]
    pooled = get_advantage(mode)(torch.cat(list(returns)).reshape(1, -1)).reshape(-1)
    return list(torch.split(pooled, sizes))


def counterfactual_advantages(joint_returns: torch.Tensor, mode: str, standardise: bool, eps: float = 1e-6) -> torch.Tensor:
    """Counterfactual credit of one agent (leave-one-out credit with the others held fixed, C3 2025):

        A_i(j) = (1/M) sum_m f_mode(R[:, m])_j,

    where ``R[j, m]`` is the joint return of agent i's completion j with the m-th combination of the
    other agents' completions, and ``f_mode`` is the registered baseline applied over agent i's K
    completions *within one context m* (so the others' choices cancel out of the baseline); with
    ``standardise`` each context group is standardised first (``normalize_groups``). Needs every
    completion of agent i paired with the same contexts: cross mode's Cartesian product (M = K^(N-1)).
    Without standardisation and with a linear baseline ("mean", "rloo", "raw") this equals the
    baseline of the marginal credit ``mean_m R[j, m]``.

    Args:
        joint_returns: ``[K, M]``.
    Returns:
        ``[K]``.
    """
    per_context = get_advantage(mode)(joint_returns.transpose(0, 1))  # [M, K]: one group per context
    if standardise:
        per_context = normalize_groups(per_context, eps)
    return per_context.double().mean(dim=0).to(joint_returns.dtype)


def joint_returns_of_agent(joint_returns: torch.Tensor, agent: int, num_agents: int, k: int) -> torch.Tensor:
    """``[K^N]`` cross-mode joint returns (``itertools.product`` order) -> ``[K, K^(N-1)]``: row j holds
    the returns of agent ``agent``'s completion j against every combination of the others'."""
    grid = joint_returns.reshape((k,) * num_agents)
    return grid.movedim(agent, 0).reshape(k, -1)


def sequential_ratio(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, clip_range: Optional[float]) -> torch.Tensor:
    """The factor an earlier agent's update contributes to a later agent's advantage in a sequential
    (HAPPO-style, Kuba et al. 2022) update: ``M = clip(pi_new(a) / pi_old(a), 1 - eps, 1 + eps)`` of its
    whole completion (``exp`` of the summed log-probs); a later agent maximises ``E[M_{1:i-1} A]``.

    Args:
        new_logprobs, old_logprobs: ``[K]`` sequence log-probs after and before the earlier agent's update.
    Returns:
        ``[K]`` (unclipped when ``clip_range`` is None).
    """
    ratio = torch.exp(new_logprobs.double() - old_logprobs.double())
    if clip_range is not None:
        ratio = ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    return ratio.to(new_logprobs.dtype)


def mean_pairwise_correlation(values: torch.Tensor) -> Optional[float]:
    """Mean Pearson correlation over the pairs of rows of ``[N, J]`` (N agents' credits of the same J
    joint responses); pairs where a row is constant are skipped; None when no pair is defined."""
    wide = values.double()
    centred = wide - wide.mean(dim=1, keepdim=True)
    norms = centred.norm(dim=1)
    out = []
    for a in range(values.shape[0]):
        for b in range(a + 1, values.shape[0]):
            if float(norms[a]) > 1e-12 and float(norms[b]) > 1e-12:
                out.append(float((centred[a] * centred[b]).sum() / (norms[a] * norms[b])))
    return sum(out) / len(out) if out else None


def zero_signal_fraction(advantages: Sequence[torch.Tensor], tol: float = 1e-12) -> float:
    """Fraction of groups whose advantages are all (numerically) zero: groups that teach nothing."""
    if not advantages:
        return 0.0
    return sum(1 for a in advantages if float(a.abs().max()) <= tol) / len(advantages)
