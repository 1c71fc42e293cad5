"""Formatter helpers of the CoMLRL 1.4.x public API."""

from comlrl.rollout.formatters import build_formatters, chat_formatters

__all__ = ["build_formatters", "chat_formatters"]
