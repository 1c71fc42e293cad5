"""Reward helpers (CoMLRL 1.4.x import path); they live in ``comlrl.rollout.rewards``."""

from comlrl.rollout.rewards import call_reward_function, normalize_reward_lengths, resolve_reward_range, set_reward_range

__all__ = ["call_reward_function", "normalize_reward_lengths", "resolve_reward_range", "set_reward_range"]
