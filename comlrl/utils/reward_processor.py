"""Reward processors (CoMLRL 1.4.x import path); they live in ``comlrl.rollout.reward_processors``."""

from comlrl.rollout.reward_processors import RewardProcessors

__all__ = ["RewardProcessors"]
