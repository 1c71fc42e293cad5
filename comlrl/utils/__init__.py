"""Public helpers CoMLRL users import from ``comlrl.utils`` (re-exported from where they live)."""

from comlrl.models.sources import infer_model_name, resolve_model_sources
from comlrl.rollout.formatters import build_formatters, chat_formatters
from comlrl.checkpoint.layout import read_checkpoint_metadata
from comlrl.parallel.context import DistributedContext, local_context, unwrap_model
from comlrl.trainers.reference_kl import (
    clone_reference_models,
    load_reference_models_from_sources,
    reference_kl_coef,
    reference_kl_enabled,
    reference_kl_for_sequence,
    resolve_reference_devices,
    validate_reference_kl_config,
)
from comlrl.rollout.reward_processors import RewardProcessors
from comlrl.rollout.rewards import call_reward_function, normalize_reward_lengths, resolve_reward_range, set_reward_range
from comlrl.models.tokenizers import apply_tokenizer_specials, ensure_pad_token, ensure_tokenizer, resolve_tokenizers

__all__ = [
    "DistributedContext",
    "RewardProcessors",
    "apply_tokenizer_specials",
    "build_formatters",
    "call_reward_function",
    "chat_formatters",
    "clone_reference_models",
    "ensure_pad_token",
    "ensure_tokenizer",
    "infer_model_name",
    "load_reference_models_from_sources",
    "local_context",
    "read_checkpoint_metadata",
    "normalize_reward_lengths",
    "reference_kl_coef",
    "reference_kl_enabled",
    "reference_kl_for_sequence",
    "resolve_model_sources",
    "resolve_reference_devices",
    "resolve_reward_range",
    "resolve_tokenizers",
    "set_reward_range",
    "unwrap_model",
    "validate_reference_kl_config",
]
