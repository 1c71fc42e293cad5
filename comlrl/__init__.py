"""comlrl: cooperative multi-LLM reinforcement learning.

Several LLM agents (copies of one model, or different models with different tokenizers) learn to
collaborate under one shared reward. The public import paths follow CoMLRL 1.4.x:
``comlrl.trainers.reinforce``, ``comlrl.trainers.actor_critic``, ``comlrl.utils``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("comlrl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
