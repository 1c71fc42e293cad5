"""Keeping credentials out of reprs, error texts, logs and files written to disk.

A field is a credential when one of the words of its name is a secret marker (``key``, ``apikey``,
``token``, ``secret``, ``password``, ``authorization``, ...). Names are split into words at
``_``, ``-``, ``.``, spaces and camelCase humps, so ``comparator_api_key``, ``X-Api-Key`` and
``apiKey`` are secrets while ``max_new_tokens`` ("tokens"), ``tokenizer`` and ``monkey`` are not.
A name whose last word says it describes a secret rather than holds one (``api_key_env``,
``key_header``, ``key_prefix``, ``token_file``, ``pad_token_id``) and the special-token names of a
tokenizer (``pad_token``, ``eos_token``, ...) are not credentials either.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

_SECRET_WORDS = frozenset(
    {
        "key", "apikey", "token", "secret", "password", "passwd", "passphrase", "authorization",
        "credential", "credentials", "bearer", "cookie",
    }
)
# A last word that makes the field a description of a secret, not the secret itself.
_DESCRIPTIVE_LAST_WORDS = frozenset(
    {"env", "var", "header", "prefix", "id", "ids", "name", "names", "type", "field", "file", "path",
     "length", "len", "count", "set"}
)
# Tokenizer special tokens ("pad_token", "eos_token", ...) are vocabulary, not credentials.
_SPECIAL_TOKEN_WORDS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "additional"})

_WORD_SPLIT = re.compile(r"[^0-9A-Za-z]+|(?<=[a-z0-9])(?=[A-Z])")


def _words(name: str) -> list:
    return [word.lower() for word in _WORD_SPLIT.split(name) if word]


def is_secret_name(name: Any) -> bool:
    """Whether a mapping key names a credential (see the module docstring for the rule)."""
    if not isinstance(name, str):
        return False
    words = _words(name)
    if not any(word in _SECRET_WORDS for word in words):
        return False
    if words[-1] in _DESCRIPTIVE_LAST_WORDS:
        return False
    if words[-1] == "token" and len(words) > 1 and words[-2] in _SPECIAL_TOKEN_WORDS:
        return False
    return True


def redact_secrets(value: Any, *, drop: bool = False) -> Any:
    """A copy of ``value`` (nested mappings, lists, tuples) with every credential field masked.

    Values under a credential-named key become ``"***"`` (``None`` stays ``None``, so a dump still
    shows that no key was set); with ``drop=True`` such entries are removed instead. Other values
    are copied unchanged, so ``redact_secrets(config_dict)`` is safe to write to disk or to W&B.
    """
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if is_secret_name(key):
                if not drop:
                    result[key] = None if item is None else MASK
            else:
                result[key] = redact_secrets(item, drop=drop)
        return result
    if isinstance(value, (list, tuple)):
        return type(value)(redact_secrets(item, drop=drop) for item in value)
    return value


def redact_url(url: str) -> str:
    """``url`` with any password in its user part and every credential query parameter masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(name) for name, _ in pairs):
            query = urlencode([(name, MASK if is_secret_name(name) else item) for name, item in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def mask_values(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each non-empty secret string replaced by ``"***"``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
