"""Reward processors: small float -> float callables applied to every reward before training."""

from __future__ import annotations

from typing import Callable, Sequence


class RewardProcessors:
    """Factories of reward processors (``reward_processor=RewardProcessors.scale(100.0)``)."""

    @staticmethod
    def identity() -> Callable[[float], float]:
        return lambda value: float(value)

    @staticmethod
    def scale(factor: float = 1.0) -> Callable[[float], float]:
        """``r -> factor * r``."""
        factor = float(factor)
        return lambda value: float(value) * factor

    @staticmethod
    def shift(value: float = 0.0) -> Callable[[float], float]:
        """``r -> r + value`` (e.g. minus the maximum reward, so returns are <= 0)."""
        offset = float(value)
        return lambda reward: float(reward) + offset

    @staticmethod
    def clip(low: float, high: float) -> Callable[[float], float]:
        """``r -> min(max(r, low), high)``."""
        if low > high:
            raise ValueError(f"clip needs low <= high, got low={low}, high={high}.")
        return lambda value: min(max(float(value), float(low)), float(high))

    @staticmethod
    def compose(processors: Sequence[Callable[[float], float]]) -> Callable[[float], float]:
        """Apply ``processors`` left to right."""
        chain = list(processors)

        def apply(value: float) -> float:
            for processor in chain:
                value = processor(value)
            return float(value)

        return apply
