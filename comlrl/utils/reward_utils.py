"""Reward helpers of the CoMLRL 1.4.x public API."""

from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

from comlrl.rollout.rewards import call_reward_function

__all__ = ["call_reward_function", "normalize_reward_lengths", "resolve_reward_range", "set_reward_range"]


def set_reward_range(reward_func: Callable[..., Any], minimum: float, maximum: float) -> Callable[..., Any]:
    """Attach ``reward_range = (minimum, maximum)`` to ``reward_func`` (two finite numbers, min < max)."""
    low, high = _checked_range((minimum, maximum), reward_func)
    reward_func.reward_range = (low, high)
    return reward_func


def resolve_reward_range(reward_func: Callable[..., Any]) -> Optional[Tuple[float, float]]:
    """The ``reward_range`` declared on ``reward_func`` (or on what a ``functools.partial`` wraps), else None."""
    for candidate in (reward_func, getattr(reward_func, "func", None)):
        declared = getattr(candidate, "reward_range", None)
        if declared is not None:
            return _checked_range(declared, reward_func)
    return None


def _checked_range(value: Any, reward_func: Any) -> Tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"reward_range of {reward_func!r} must be two numbers (min, max), got {value!r}.") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise ValueError(f"reward_range must be two finite numbers with min < max, got {value!r}.")
    return low, high


def normalize_reward_lengths(rewards: Sequence[float], *, num_agents: int, num_generations: int, algorithm: str) -> List[float]:
    """Check a per-prompt reward list of an actor-critic trainer: 1 value (shared), N (one per
    agent) or K (one per generation) values; a single agent passes through."""
    values = [float(r) for r in rewards]
    if num_agents == 1 or len(values) in (1, num_agents, num_generations):
        return values
    raise ValueError(
        f"Reward function must return 1 value, {num_generations} (one per generation) or {num_agents} "
        f"(one per agent) values per prompt for multi-agent {algorithm}; got {len(values)}."
    )
