"""Public helpers CoMLRL users import from ``comlrl.utils`` (re-exported from where they live)."""

from comlrl.models.loading import freeze_model, resolve_model_kwargs
from comlrl.models.sources import infer_model_name, resolve_model_sources
from comlrl.models.tokenizers import ensure_pad_token, ensure_tokenizer, resolve_tokenizers
from comlrl.rollout.formatters import build_formatters
from comlrl.rollout.rewards import call_reward_function
from comlrl.training.devices import resolve_devices, resolve_single_device
from comlrl.utils.reward_processor import RewardProcessors

__all__ = [
    "RewardProcessors",
    "build_formatters",
    "call_reward_function",
    "ensure_pad_token",
    "ensure_tokenizer",
    "freeze_model",
    "infer_model_name",
    "resolve_devices",
    "resolve_model_kwargs",
    "resolve_model_sources",
    "resolve_single_device",
    "resolve_tokenizers",
]
