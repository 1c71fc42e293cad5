"""Keeping credentials out of reprs, error texts, logs and files written to disk.

A field is a credential when one of the words of its name is a secret marker (``key``, ``apikey``,
``token``, ``secret``, ``password``, ``auth``, ``authorization``, ``credential``, ``cookie``, ...,
and their plurals ``secrets``, ``passwords``, ``apikeys``, ...). Names are split into words at
``_``, ``-``, ``.``, spaces and camelCase humps, so ``comparator_api_key``, ``X-Api-Key``,
``X-Auth-Token``, ``x_auth`` and ``apiKey`` are secrets while ``max_new_tokens`` ("tokens"),
``tokenizer``, ``monkey``, ``author`` and ``authors`` are not. The plurals ``keys`` and ``tokens``
count only after a word that makes them credentials (``api_keys``, ``access_tokens``; not
``sort_keys`` or ``num_tokens``). A name whose last word says it describes a secret rather than
holds one (``api_key_env``, ``key_header``, ``key_prefix``, ``token_file``, ``pad_token_id``) and
the special-token names of a tokenizer (``pad_token``, ``eos_token``, ...) are not credentials.

Values are masked too, whatever their field's name: a URL (alone or inside a longer text) loses the
password of its user part and the values of its credential query and fragment parameters (the
names above plus ``sig``, ``signature``, ``pass``, ``pwd``, ``hmac``), keeping scheme, host, path
and the other parameters; an authorization value (``Bearer ...``, ``Basic ...``, ``Token ...``)
keeps only its scheme (outside HTTP headers only when the credential is not a plain word, so
"Basic arithmetic" stays). Any credential found this way is also masked wherever else it appears in
the same value (a key pasted into a second, innocently named field or an object's repr).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, List, Mapping, Set
from urllib.parse import unquote_plus, urlsplit, urlunsplit

MASK = "***"

_SECRET_WORDS = frozenset(
    {
        "key", "apikey", "apikeys", "token", "secret", "secrets", "password", "passwords", "passwd",
        "passphrase", "authorization", "auth", "oauth", "credential", "credentials", "creds", "bearer",
        "cookie", "cookies", "jwt", "privatekey",
    }
)
# Plurals that are usually counts or collections (``num_tokens``, ``sort_keys``) and credentials
# only after one of these words.
_QUALIFIED_PLURALS = frozenset({"keys", "tokens"})
_CREDENTIAL_QUALIFIERS = frozenset(
    {"api", "access", "auth", "secret", "private", "client", "refresh", "session", "bearer", "hf", "ssh", "signing"}
)
# Query-parameter names that carry a credential in URLs (signed URLs, SAS tokens, basic forms).
_QUERY_SECRET_WORDS = frozenset({"sig", "signature", "pass", "pwd", "hmac"})
# A last word that makes the field a description of a secret, not the secret itself.
_DESCRIPTIVE_LAST_WORDS = frozenset(
    {"env", "var", "header", "prefix", "id", "ids", "name", "names", "type", "field", "file", "path",
     "length", "len", "count", "set"}
)
# Tokenizer special tokens ("pad_token", "eos_token", ...) are vocabulary, not credentials.
_SPECIAL_TOKEN_WORDS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "additional"})

_WORD_SPLIT = re.compile(r"[^0-9A-Za-z]+|(?<=[a-z0-9])(?=[A-Z])")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_AUTH_VALUE = re.compile(r"^(\s*(?:bearer|basic|token)\s+)(\S+)(\s*)$", re.IGNORECASE)
# A credential found in one place is masked elsewhere in the same value only when it is this long
# (shorter strings would mask ordinary words).
_MIN_PROPAGATED = 6


def _words(name: str) -> list:
    return [word.lower() for word in _WORD_SPLIT.split(name) if word]


def _has_secret_word(words: List[str], extra: frozenset = frozenset()) -> bool:
    for position, word in enumerate(words):
        if word in _SECRET_WORDS or word in extra:
            return True
        if word in _QUALIFIED_PLURALS and position and words[position - 1] in _CREDENTIAL_QUALIFIERS:
            return True
    return False


def is_secret_name(name: Any) -> bool:
    """Whether a mapping key names a credential (see the module docstring for the rule)."""
    return _is_secret(name, frozenset())


def _is_secret(name: Any, extra: frozenset) -> bool:
    if not isinstance(name, str):
        return False
    words = _words(name)
    if not _has_secret_word(words, extra):
        return False
    if words[-1] in _DESCRIPTIVE_LAST_WORDS:
        return False
    if words[-1] == "token" and len(words) > 1 and words[-2] in _SPECIAL_TOKEN_WORDS:
        return False
    return True


def is_secret_header(name: Any, value: Any) -> bool:
    """Whether an HTTP header carries a credential: its name is a secret name (``Authorization``,
    ``Proxy-Authorization``, ``X-Auth*``, ``*-Token``, ``*-Key``, ``Cookie``) or its value is an
    authorization value (``Bearer ...``, ``Basic ...``, ``Token ...``)."""
    return is_secret_name(name) or (isinstance(value, str) and _AUTH_VALUE.match(value) is not None)


def _masked_params(text: str, found: List[str]) -> str:
    """``a=1&key=s`` with the values of credential parameters masked, the rest byte for byte."""
    pieces = []
    for piece in text.split("&"):
        name, sep, item = piece.partition("=")
        if sep and item and _is_secret(unquote_plus(name), _QUERY_SECRET_WORDS):
            found.extend((item, unquote_plus(item)))
            piece = f"{name}={MASK}"
        pieces.append(piece)
    return "&".join(pieces)


def _mask_url(url: str, found: List[str]) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, colon, password = userinfo.partition(":")
        found.append(password if colon else user)
        netloc = f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"
    query = _masked_params(parts.query, found) if parts.query else parts.query
    fragment = _masked_params(parts.fragment, found) if "=" in parts.fragment else parts.fragment
    if (netloc, query, fragment) == (parts.netloc, parts.query, parts.fragment):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_url(url: str) -> str:
    """``url`` with the password of its user part (or a bare token there) and the value of every
    credential query or fragment parameter masked; scheme, host, path and other parameters stay."""
    return _mask_url(url, [])


def _mask_text(text: str, found: List[str], header: bool = False) -> str:
    """``text`` with its URLs masked and, if it is an authorization value, its credential: any
    word after the scheme in a header value, elsewhere only a word that is not all letters (so a
    text such as "Basic arithmetic" stays)."""
    text = _URL.sub(lambda match: _mask_url(match.group(0), found), text)
    auth = _AUTH_VALUE.match(text)
    if auth and (header or not auth.group(2).isalpha()):
        found.append(auth.group(2))
        text = f"{auth.group(1)}{MASK}{auth.group(3)}"
    return text


def secrets_in(text: str) -> List[str]:
    """The credentials inside ``text``: URL passwords, credential parameter values and the
    credential of an authorization value (what ``redact_text`` masks)."""
    found: List[str] = []
    _mask_text(text, found)
    return [secret for secret in found if secret]


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with credentials in the URLs it contains masked, an authorization value reduced to
    its scheme, and every occurrence of each of ``secrets`` replaced by ``"***"``."""
    found: List[str] = []
    return mask_values(_mask_text(text, found), list(secrets) + found)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _strings(item)


def _is_headers(key: Any, item: Any) -> bool:
    return isinstance(key, str) and isinstance(item, Mapping) and _words(key)[-1:] in (["headers"], ["header"])


def _collect(value: Any, found: List[str], header: bool = False) -> None:
    """Every credential string in ``value``: values under secret names and those in texts."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if is_secret_name(key) and not isinstance(item, bool):
                found.extend(_strings(item))
            else:
                _collect(item, found, _is_headers(key, item) or (header and not isinstance(item, Mapping)))
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, found, header)
    elif isinstance(value, str):
        _mask_text(value, found, header)


def _redact(value: Any, drop: bool, secrets: Set[str], header: bool = False) -> Any:
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if is_secret_name(key) and not isinstance(item, bool):
                if not drop:
                    result[key] = None if item is None else MASK
            else:
                inner = _is_headers(key, item) or (header and not isinstance(item, Mapping))
                result[key] = _redact(item, drop, secrets, inner)
        return result
    if isinstance(value, (list, tuple)):
        return type(value)(_redact(item, drop, secrets, header) for item in value)
    if isinstance(value, str):
        return mask_values(_mask_text(value, [], header), secrets)
    return value


def _redacted(value: Any, drop: bool, header: bool) -> Any:
    found: List[str] = []
    _collect(value, found, header)
    return _redact(value, drop, {s for s in found if len(s) >= _MIN_PROPAGATED}, header)


def redact_secrets(value: Any, *, drop: bool = False) -> Any:
    """A copy of ``value`` (nested mappings, lists, tuples) with every credential masked.

    Values under a credential-named key become ``"***"`` (``None`` stays ``None``, so a dump still
    shows that no key was set; ``True``/``False`` stay, they are switches, not credentials); with
    ``drop=True`` such entries are removed instead. Every string value, whatever its key, has the
    credentials of the URLs in it and of an authorization value masked (``redact_text``), and any
    credential found anywhere in ``value`` is masked wherever it recurs. The input is not modified,
    so ``redact_secrets(config_dict)`` is safe to write to disk or to W&B. The values of a mapping
    under a ``*headers`` key are header values (``redact_headers``).
    """
    return _redacted(value, drop, False)


def redact_headers(headers: Mapping[str, Any], *, drop: bool = False) -> dict:
    """A copy of HTTP ``headers`` with every credential header (``is_secret_header``) masked, or
    removed with ``drop=True``."""
    if drop:
        headers = {name: value for name, value in headers.items() if not is_secret_header(name, value)}
    return _redacted(dict(headers), drop, True)


def mask_values(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each non-empty secret string replaced by ``"***"``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
