"""Tokenizer helpers of the CoMLRL 1.4.x public API."""

from __future__ import annotations

from typing import Any, Sequence

from comlrl.models.tokenizers import ensure_pad_token, ensure_tokenizer, resolve_tokenizers

__all__ = ["apply_tokenizer_specials", "ensure_pad_token", "ensure_tokenizer", "resolve_tokenizers"]


def apply_tokenizer_specials(tokenizer: Any, models: Sequence[Any]) -> None:
    """Write the tokenizer's pad id and eos id (pad when eos is missing) into each model's config.

    comlrl's trainers never need this (they pass the ids explicitly); it is kept for code that calls it.
    """
    pad = getattr(tokenizer, "pad_token_id", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    for model in models:
        inner = getattr(model, "model", None)
        config = getattr(inner, "config", None) if inner is not None and hasattr(model, "value_head") else None
        config = config if config is not None else getattr(model, "config", None)
        if config is None:
            continue
        if pad is not None:
            config.pad_token_id = pad
        if eos is not None or pad is not None:
            config.eos_token_id = eos if eos is not None else pad
