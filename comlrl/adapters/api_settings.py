"""Validation of the completion client's settings and the resolution of its API key.

Messages name the constructor argument and the iterative preference configs' field that sets it,
and never show a key.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from comlrl.adapters.api_formats import Sampling
from comlrl.telemetry.redaction import redact_url

# Constructor argument -> the iterative preference configs' field that sets it.
CONFIG_FIELDS: Dict[str, str] = {
    "url": "comparator_api_url",
    "api_format": "comparator_api_format",
    "model": "comparator_api_model",
    "timeout": "comparator_api_timeout",
    "headers": "comparator_api_headers",
    "api_key": "comparator_api_key",
    "api_key_env": "comparator_api_key_env",
    "key_header": "comparator_api_key_header",
    "key_prefix": "comparator_api_key_prefix",
    "response_field": "comparator_api_response_field",
    "extra_body": "comparator_api_extra_body",
    "max_n_per_request": "comparator_api_max_n_per_request",
}


def label(name: str) -> str:
    field = CONFIG_FIELDS.get(name)
    return f"{name} ({field})" if field else name


def invalid(name: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"CompletionClient {label(name)} must be {expected}; got {value!r}.")


def optional_str(name: str, value: Any) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise invalid(name, value, "a string or None")
    return value


def int_at_least(name: str, value: Any, low: int, allow_none: bool = False) -> Optional[int]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise invalid(name, value, f"an integer >= {low}" + (" or None" if allow_none else ""))
    return value


def finite_number(name: str, value: Any, low: float, allow_none: bool = False, strict: bool = False) -> Optional[float]:
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (strict and value == low):
        bound = f"> {low}" if strict else f">= {low}"
        raise invalid(name, value, f"a finite number {bound}" + (" or None" if allow_none else ""))
    return float(value)


def check_url(url: Any) -> str:
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        shown = redact_url(url) if isinstance(url, str) else url
        raise invalid("url", shown, "an http:// or https:// URL such as 'https://api.openai.com/v1/chat/completions'")
    return url


def check_mapping(name: str, value: Any, str_values: bool) -> Optional[Dict[str, Any]]:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"CompletionClient {label(name)} must be a dict with string keys or None, got {type(value).__name__}.")
    if str_values:
        bad = [k for k, v in value.items() if not isinstance(v, str)]
        if bad:
            raise ValueError(f"CompletionClient {label(name)} values must be strings; {bad[0]!r} is not.")
    else:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"CompletionClient {label(name)} must be JSON-serialisable ({exc}).") from None
    return dict(value)


def check_key(key: str, source: str) -> str:
    if any(not 33 <= ord(char) < 127 for char in key):
        raise ValueError(
            f"The API key from {source} contains whitespace, control or non-ASCII characters and cannot be "
            "sent in an HTTP header; check the value (it is not shown here)."
        )
    return key


def resolve_key(api_key: Any, api_key_env: Optional[str], default_env: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """``(key, source)``: ``api_key``, else ``$api_key_env`` (must be set), else the format's usual
    variable when it is set, else no key. ``source`` is ``"api_key"``, a variable name, or None."""
    if api_key is not None:
        if not isinstance(api_key, str):
            raise TypeError(f"CompletionClient {label('api_key')} must be a string, got {type(api_key).__name__}.")
        key = api_key.strip()
        return (check_key(key, "api_key"), "api_key") if key else (None, None)
    if api_key_env is not None:
        key = os.environ.get(api_key_env, "").strip()
        if not key:
            raise ValueError(
                f"CompletionClient {label('api_key_env')} names the environment variable {api_key_env!r}, "
                "which is not set or empty; export it or pass the key as api_key (comparator_api_key)."
            )
        return check_key(key, f"${api_key_env}"), api_key_env
    key = os.environ.get(default_env, "").strip() if default_env else ""
    return (check_key(key, f"${default_env}"), default_env) if key else (None, None)


def per_prompt(name: str, values: Optional[Sequence[Any]], shared: Any, count: int, shared_name: str) -> List[Any]:
    if values is None:
        return [shared] * count
    if shared is not None:
        raise ValueError(f"complete_many takes {name} (one per prompt) or {shared_name} (shared), not both.")
    values = list(values)
    if len(values) != count:
        raise ValueError(f"complete_many {name} must have one entry per prompt ({count}), got {len(values)}.")
    return values


def check_sampling(max_new_tokens: Any, temperature: Any, top_p: Any, top_k: Any) -> Sampling:
    int_at_least("max_new_tokens", max_new_tokens, 1)
    finite_number("temperature", temperature, 0.0)
    top_p = finite_number("top_p", top_p, 0.0, strict=True)
    if top_p > 1.0:
        raise invalid("top_p", top_p, "in (0, 1]")
    int_at_least("top_k", top_k, 0, allow_none=True)
    return Sampling(max_new_tokens, float(temperature), top_p, top_k)
