"""Tokenizer helpers (CoMLRL 1.4.x import path); they live in ``comlrl.models.tokenizers``."""

from comlrl.models.tokenizers import apply_tokenizer_specials, ensure_pad_token, ensure_tokenizer, resolve_tokenizers

__all__ = ["apply_tokenizer_specials", "ensure_pad_token", "ensure_tokenizer", "resolve_tokenizers"]
