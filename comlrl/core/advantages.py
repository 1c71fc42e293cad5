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

ADVANTAGE_MODES = ("mean", "max", "rloo", "raw")


def group_advantages(returns: torch.Tensor, mode: str) -> torch.Tensor:
    """Advantages of K samples against a baseline computed from the same group.

    Args:
        returns: ``[..., K]`` returns of the K samples of each group.
        mode: the baseline
            - ``"mean"`` (GRPO):   ``A_j = R_j - mean(R)``
            - ``"max"`` (ReMax):   ``A_j = R_j - max(R)``
            - ``"rloo"`` (RLOO):   ``A_j = R_j - mean_{k != j} R_k = (K R_j - sum R) / (K - 1)``;
              with K = 1 there is no other sample and the mean baseline (zero advantage) is used.
            - ``"raw"`` (REINFORCE without baseline): ``A_j = R_j``.

    Returns:
        ``[..., K]`` advantages, same dtype as ``returns``.
    """
    if mode == "raw":
        return returns.clone()
    wide = returns.double()
    if mode == "mean":
        out = wide - wide.mean(dim=-1, keepdim=True)
    elif mode == "max":
        out = wide - wide.amax(dim=-1, keepdim=True)
    elif mode == "rloo":
        k = returns.shape[-1]
        if k <= 1:
            out = wide - wide.mean(dim=-1, keepdim=True)
        else:
            out = (k * wide - wide.sum(dim=-1, keepdim=True)) / (k - 1)
    else:
        raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}.")
    return out.to(returns.dtype)


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
