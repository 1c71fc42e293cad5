"""Request bodies and response parsing of the completion API formats.

Each format says how one request for ``count`` candidates of one prompt looks, how many
candidates one request may ask for, how the key is sent, and where the texts are in the reply.

| format | aliases | one request asks for | texts read from |
|---|---|---|---|
| ``generic`` | | ``num_return_sequences`` candidates | ``response_field`` (dotted path), else ``completions`` / ``responses`` / ``outputs`` / ``choices`` |
| ``openai`` | ``openai_chat``, ``chat`` | ``n`` candidates (DeepSeek endpoints without a cap: 1) | ``choices[].message.content`` or ``choices[].text`` |
| ``anthropic`` | ``anthropic_messages``, ``messages`` | one candidate | the first ``content[]`` block of type ``text`` |
| ``openai_responses`` | ``responses``, ``codex`` | one candidate | the ``output_text`` / ``text`` blocks of ``output[].content[]`` |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

API_FORMAT_ALIASES: Dict[str, Tuple[str, ...]] = {
    "generic": (),
    "openai": ("openai_chat", "chat"),
    "anthropic": ("anthropic_messages", "messages"),
    "openai_responses": ("responses", "codex"),
}

_CANONICAL = {alias: name for name, aliases in API_FORMAT_ALIASES.items() for alias in (name, *aliases)}

ANTHROPIC_VERSION = "2023-06-01"


class MalformedResponse(ValueError):
    """A reply whose JSON does not have the shape the format expects (the client adds the URL)."""


def _format_choices() -> str:
    return "; ".join(
        f"{name} (aliases: {', '.join(aliases)})" if aliases else name for name, aliases in API_FORMAT_ALIASES.items()
    )


def validate_api_format(name: Any, field: str = "comparator_api_format") -> str:
    """The canonical format for ``name`` (case and surrounding spaces ignored, ``-`` read as ``_``).

    An unknown name is a ValueError that lists every format and alias (CoMLRL 1.4.3 silently used
    the generic format for any unknown name).
    """
    if isinstance(name, str):
        canonical = _CANONICAL.get(name.strip().lower().replace("-", "_"))
        if canonical is not None:
            return canonical
    raise ValueError(f"{field} must be one of: {_format_choices()}; got {name!r}.")


@dataclass(frozen=True)
class Sampling:
    """The per-call generation settings shared by every request of one ``complete`` call."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: Optional[int] = None


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data: arrays/tensors via ``tolist()``, non-finite floats and unknown
    objects as strings, mapping keys as strings, sets sorted."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return [json_safe(item) for item in sorted(value, key=repr)]
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    return str(value)


def _merge(body: Dict[str, Any], extra: Optional[Mapping[str, Any]], drop_none: bool) -> Dict[str, Any]:
    """``body`` updated with ``extra``; a key that ``extra`` sets to None is removed (the way to
    leave out a field a format sends by default), and with ``drop_none`` every None is removed."""
    merged = dict(body)
    for key, value in (extra or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    if drop_none:
        merged = {key: value for key, value in merged.items() if value is not None}
    return merged


def _user_messages(prompt: str) -> List[Dict[str, str]]:
    return [{"role": "user", "content": prompt}]


# --------------------------------------------------------------------------- request bodies


def _generic_body(prompt, count, sampling, model, agent_idx, batch_item, extra):
    body = {
        "prompt": prompt,
        "agent_idx": agent_idx,
        "num_return_sequences": count,
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "batch_item": json_safe(batch_item),
    }
    if model is not None:
        body["model"] = model
    return _merge(body, extra, drop_none=False)


def _openai_body(prompt, count, sampling, model, agent_idx, batch_item, extra):
    body = {
        "model": model,
        "messages": _user_messages(prompt),
        "n": count,
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    return _merge(body, extra, drop_none=True)


def _anthropic_body(prompt, count, sampling, model, agent_idx, batch_item, extra):
    body = {
        "model": model,
        "max_tokens": sampling.max_new_tokens,
        "messages": _user_messages(prompt),
        "temperature": sampling.temperature,
    }
    return _merge(body, extra, drop_none=True)


def _responses_body(prompt, count, sampling, model, agent_idx, batch_item, extra):
    body = {
        "model": model,
        "input": prompt,
        "max_output_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    return _merge(body, extra, drop_none=True)


# --------------------------------------------------------------------------- response parsing

_MISSING = object()
_GENERIC_KEYS = ("completions", "responses", "outputs", "choices")
_TEXT_KEYS = ("text", "content", "completion", "response")


def _dotted(payload: Any, path: str) -> Any:
    node = payload
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _item_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping):
        for key in _TEXT_KEYS:
            if isinstance(item.get(key), str):
                return item[key]
        message = item.get("message")
        if isinstance(message, Mapping) and isinstance(message.get("content"), str):
            return message["content"]
        raise MalformedResponse(
            f"a completion object needs a string field {', '.join(_TEXT_KEYS)} or message.content; "
            f"got keys {sorted(map(str, item))}"
        )
    if item is None:
        raise MalformedResponse("a completion is null")
    return str(item)


def _parse_generic(payload: Any, response_field: Optional[str]) -> List[str]:
    found = _dotted(payload, response_field) if response_field else _MISSING
    if found is _MISSING and isinstance(payload, Mapping):
        found = next((payload[key] for key in _GENERIC_KEYS if key in payload), _MISSING)
    if found is _MISSING and isinstance(payload, list):
        found = payload
    if isinstance(found, str):
        found = [found]
    if not isinstance(found, list):
        where = f"the field {response_field!r} or one of " if response_field else ""
        raise MalformedResponse(f"expected a list of completions under {where}{', '.join(_GENERIC_KEYS)}")
    return [_item_text(item) for item in found]


def _parse_openai(payload: Any, response_field: Optional[str]) -> List[str]:
    choices = payload.get("choices") if isinstance(payload, Mapping) else None
    if not isinstance(choices, list):
        raise MalformedResponse("expected an OpenAI chat completion with a 'choices' list")
    texts = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, Mapping) else None
        if isinstance(message, Mapping) and "content" in message:
            texts.append(message["content"] or "")
        elif isinstance(choice, Mapping) and isinstance(choice.get("text"), str):
            texts.append(choice["text"])
        else:
            raise MalformedResponse("expected every choice to carry message.content or text")
    return texts


def _parse_anthropic(payload: Any, response_field: Optional[str]) -> List[str]:
    blocks = payload.get("content") if isinstance(payload, Mapping) else None
    if not isinstance(blocks, list):
        raise MalformedResponse("expected an Anthropic message with a 'content' list of blocks")
    for block in blocks:
        if isinstance(block, Mapping) and block.get("type") == "text":
            return [str(block.get("text") or "")]
    return [""]  # the model produced no text block (e.g. it stopped at once)


def _parse_responses(payload: Any, response_field: Optional[str]) -> List[str]:
    output = payload.get("output") if isinstance(payload, Mapping) else None
    if not isinstance(output, list):
        if isinstance(payload, Mapping) and isinstance(payload.get("output_text"), str):
            return [payload["output_text"]]
        raise MalformedResponse("expected an OpenAI Responses object with an 'output' list")
    parts = []
    for item in output:
        content = item.get("content") if isinstance(item, Mapping) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, Mapping) and block.get("type") in ("output_text", "text"):
                parts.append(str(block.get("text") or ""))
    return ["".join(parts)]


@dataclass(frozen=True)
class ApiFormat:
    """How one API format builds requests and reads replies."""

    name: str
    build_body: Callable[..., Dict[str, Any]]
    parse: Callable[[Any, Optional[str]], List[str]]
    batched: bool
    """Whether one request may ask for several candidates (``n`` / ``num_return_sequences``)."""
    default_key_env: Optional[str]
    """The environment variable read for the key when neither a key nor a variable is given."""


FORMATS: Dict[str, ApiFormat] = {
    "generic": ApiFormat("generic", _generic_body, _parse_generic, True, None),
    "openai": ApiFormat("openai", _openai_body, _parse_openai, True, "OPENAI_API_KEY"),
    "anthropic": ApiFormat("anthropic", _anthropic_body, _parse_anthropic, False, "ANTHROPIC_API_KEY"),
    "openai_responses": ApiFormat("openai_responses", _responses_body, _parse_responses, False, "OPENAI_API_KEY"),
}


def is_deepseek(url: str, model: Optional[str]) -> bool:
    """DeepSeek's OpenAI-compatible endpoint accepts only ``n=1``."""
    return "api.deepseek.com" in url.lower() or (model or "").lower().startswith("deepseek-")


def candidates_per_request(fmt: ApiFormat, url: str, model: Optional[str], cap: Optional[int], n: int) -> int:
    """How many of ``n`` candidates one request asks for: 1 for per-candidate formats; else
    ``min(cap, n)``; without a cap all ``n``, except 1 for DeepSeek's OpenAI-compatible endpoint."""
    if not fmt.batched:
        return 1
    if cap is None and fmt.name == "openai" and is_deepseek(url, model):
        return 1
    return max(1, min(cap or n, n))


def auth_header(fmt: ApiFormat, header: str, prefix: Optional[str], key: str) -> Tuple[str, str]:
    """The ``(name, value)`` header that carries ``key``: ``<header>: <prefix> <key>`` (a bare key
    without a prefix); Anthropic sends the default ``Authorization: Bearer`` as ``x-api-key: <key>``."""
    prefix = (prefix or "").strip() or None
    if fmt.name == "anthropic":
        if header.lower() == "authorization":
            header = "x-api-key"
        if prefix and prefix.lower() == "bearer":
            prefix = None
    return header, f"{prefix} {key}" if prefix else key


def format_headers(fmt: ApiFormat, headers: Mapping[str, str]) -> Dict[str, str]:
    """Headers a format always sends unless the caller set them (Anthropic's API version)."""
    lowered = {name.lower() for name in headers}
    if fmt.name == "anthropic" and "anthropic-version" not in lowered:
        return {"anthropic-version": ANTHROPIC_VERSION}
    return {}
