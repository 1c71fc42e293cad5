"""Group baselines and advantage normalisation (pure tensor maths).

A *group* is the set of K samples drawn for one prompt (one node of a rollout tree) by one agent.
Every function here works on the last dimension as the group dimension, so a ``[G, K]`` tensor holds
G independent groups.

Baselines and standardisation are computed in float64 and returned in the input's dtype: in float32
``mean`` of K equal values is not always that value, and AdamW turns such a rounding residue into a
full-size update. In float64 a group of equal (float32) returns has exactly zero advantages.
"""

from __future__ import annotations

import torch

from comlrl.core.registry import advantage_names, get_advantage, register_advantage

# The baselines of CoMLRL 1.4.3 (the registry may hold more: ``advantage_names()``).
ADVANTAGE_MODES = ("mean", "max", "rloo", "raw")


@register_advantage("mean")
def mean_baseline(returns: torch.Tensor) -> torch.Tensor:
    """GRPO / MAGRPO (Shao et al. 2024, eq. 3 before scaling): ``A_j = R_j - mean_k R_k``. ``[..., K] -> [..., K]``."""
    wide = returns.double()
    return (wide - wide.mean(dim=-1, keepdim=True)).to(returns.dtype)


@register_advantage("max")
def max_baseline(returns: torch.Tensor) -> torch.Tensor:
    """ReMax-style group max (MAReMax): ``A_j = R_j - max_k R_k``. ``[..., K] -> [..., K]``."""
    wide = returns.double()
    return (wide - wide.amax(dim=-1, keepdim=True)).to(returns.dtype)


@register_advantage("rloo")
def rloo_baseline(returns: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): ``A_j = R_j - mean_{k != j} R_k = (K R_j - sum R) / (K - 1)``;
    with K = 1 there is no other sample and the mean baseline (zero advantage) is used. ``[..., K] -> [..., K]``."""
    k = returns.shape[-1]
    if k <= 1:
        return mean_baseline(returns)
    wide = returns.double()
    return ((k * wide - wide.sum(dim=-1, keepdim=True)) / (k - 1)).to(returns.dtype)


@register_advantage("raw")
def no_baseline(returns: torch.Tensor) -> torch.Tensor:
    """REINFORCE without a baseline (MAREINFORCE): ``A_j = R_j``. ``[..., K] -> [..., K]``."""
    return returns.clone()


def group_advantages(returns: torch.Tensor, mode: str) -> torch.Tensor:
    """Advantages of K samples against a baseline computed from the same group: the estimator
    registered as ``mode`` (built in: "mean", "max", "rloo", "raw"; see their docstrings).

    Args:
        returns: ``[..., K]`` returns of the K samples of each group.
    Returns:
        ``[..., K]`` advantages, same dtype as ``returns``.
    """
    if mode not in advantage_names():
        raise ValueError(f"advantage mode must be one of {', '.join(advantage_names())}, got {mode!r}.")
    return get_advantage(mode)(returns)


def normalize_groups(advantages: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Standardise each group: ``(A - mean(A)) / max(std(A), eps)`` with the population std.

    Groups of one sample are returned unchanged (there is nothing to standardise against).
    ``eps`` keeps a group of identical values at zero instead of dividing by zero.

    Args:
        advantages: ``[..., K]``.
    Returns:
        ``[..., K]``.
    """
    if advantages.shape[-1] <= 1:
        return advantages.clone()
    wide = advantages.double()
    mean = wide.mean(dim=-1, keepdim=True)
    std = wide.std(dim=-1, unbiased=False, keepdim=True).clamp_min(eps)
    return ((wide - mean) / std).to(advantages.dtype)


def normalize_flat(values: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Standardise a 1-D batch as one group (used for critic advantages per agent and turn)."""
    return normalize_groups(values.reshape(1, -1), eps).reshape(values.shape)
