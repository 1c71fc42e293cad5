"""Reward helpers of the CoMLRL 1.4.x public API."""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

from comlrl.rollout.rewards import call_reward_function, checked_reward_range, resolve_reward_range

__all__ = ["call_reward_function", "normalize_reward_lengths", "resolve_reward_range", "set_reward_range"]


def set_reward_range(reward_func: Callable[..., Any], minimum: float, maximum: float) -> Callable[..., Any]:
    """Attach ``reward_range = (minimum, maximum)`` to ``reward_func`` (two finite numbers, min < max)."""
    low, high = checked_reward_range((minimum, maximum), reward_func)
    reward_func.reward_range = (low, high)
    return reward_func


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
