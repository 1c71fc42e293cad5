"""The critic's value loss (pure tensor maths): squared error to the TD targets, optionally PPO-clipped."""

from __future__ import annotations

from typing import Optional

import torch


def value_loss(
    values: torch.Tensor,
    targets: torch.Tensor,
    old_values: Optional[torch.Tensor] = None,
    clip_range: Optional[float] = None,
) -> torch.Tensor:
    """Mean squared value error, optionally with PPO value clipping.

    Unclipped: ``mean((T - V)^2)``. Clipped (``old_values`` and ``clip_range`` given):
    ``mean(max((T - V)^2, (T - V_clip)^2))`` with ``V_clip = V_old + clip(V - V_old, -eps, eps)``.

    Args:
        values: ``[B]`` current value estimates (with grad).
        targets: ``[B]`` value targets.
        old_values: ``[B]`` estimates at rollout time.
        clip_range: epsilon, or None.
    """
    targets = targets.to(values.dtype)
    err = (targets - values) ** 2
    if old_values is not None and clip_range is not None:
        old_values = old_values.to(values.dtype)
        clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
        err = torch.maximum(err, (targets - clipped_values) ** 2)
    return err.mean()
