"""An HTTP client for completion APIs, used by the API comparator and by LLM-feedback environments.

``CompletionClient(url, api_format=...)`` asks an endpoint for ``n`` completions of a prompt. It
speaks the four request/response formats of ``api_formats`` over httpx, batches candidates where
the format allows (``n`` / ``num_return_sequences``, at most ``max_n_per_request`` per request),
issues the requests of formats without ``n`` concurrently, retries 429, 5xx, timeouts and
connection errors with exponential backoff (honouring ``Retry-After``), and raises errors that
name the URL and the status. The API key lives in a private attribute and never appears in a
repr, an error text, a log line, ``to_dict()`` or a pickle.
"""

from __future__ import annotations

import copy
import email.utils
import json
import logging
import math
import os
import random
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import httpx

from comlrl.adapters.api_formats import (
    FORMATS,
    MalformedResponse,
    candidates_per_request,
    format_headers,
    auth_header,
    validate_api_format,
)
from comlrl.adapters.api_settings import (
    CONFIG_FIELDS,
    check_key,
    check_mapping,
    check_sampling,
    check_url,
    int_at_least,
    invalid,
    label,
    finite_number,
    optional_str,
    per_prompt,
    resolve_key,
)
from comlrl.telemetry.redaction import (
    MASK, is_secret_header, is_secret_name, mask_values, redact_headers, redact_secrets, redact_text, redact_url,
    secrets_in,
)

logger = logging.getLogger(__name__)


class _UrlRedactingFilter(logging.Filter):
    """Masks credential query parameters in the URLs that httpx logs (``HTTP Request: POST <url>``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(arg, httpx.URL) for arg in record.args):
            record.args = tuple(redact_url(str(arg)) if isinstance(arg, httpx.URL) else arg for arg in record.args)
        return True


_HTTPX_LOGGER = logging.getLogger("httpx")
if not any(isinstance(existing, _UrlRedactingFilter) for existing in _HTTPX_LOGGER.filters):
    _HTTPX_LOGGER.addFilter(_UrlRedactingFilter())

MAX_RETRY_DELAY_S = 60.0
"""Upper bound of one wait between attempts (also for a longer ``Retry-After``)."""

_RETRYABLE_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
_EXCERPT_CHARS = 300


class CompletionAPIError(Exception):
    """Base class of the client's errors; ``url`` (credentials masked) and ``status`` (or None)."""

    def __init__(self, message: str, url: Optional[str] = None, status: Optional[int] = None):
        super().__init__(message)
        self.url = url
        self.status = status


class CompletionAPIUnavailable(CompletionAPIError, RuntimeError):
    """429, 5xx, a timeout or a connection error persisted through every retry."""


class InsufficientBalanceError(CompletionAPIError, RuntimeError):
    """HTTP 402: the account behind the key has no balance or quota left."""


class CompletionAPIRequestError(CompletionAPIError, ValueError):
    """The endpoint refused the request (4xx other than 402 and 429, or an unexpected status)."""


class CompletionAPIResponseError(CompletionAPIError, ValueError):
    """The reply is not JSON, or its JSON holds no completions in the format's place."""


def retry_after_seconds(value: Optional[str], now: Optional[datetime] = None) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


class CompletionClient:
    """A client for one completion endpoint (see the module docstring; formats in ``api_formats``).

    ``sleep`` (default ``time.sleep``) and ``rng`` (default an unseeded ``random.Random``) are the
    backoff's clock and jitter source, injectable for tests. ``max_concurrency`` bounds the requests
    in flight at once. A pickled client carries no credentials: it reads its key from the
    environment again when unpickled (a key passed as ``api_key`` is not restored).
    """

    def __init__(self, url, *, api_format="generic", model=None, timeout=120.0, headers=None,
                 api_key=None, api_key_env=None, key_header="Authorization", key_prefix="Bearer",
                 response_field="completions", extra_body=None, max_n_per_request=None,
                 max_retries=4, backoff_s=0.5, max_concurrency: int = 8,
                 sleep: Optional[Callable[[float], Any]] = None, rng: Optional[random.Random] = None):
        self.url = check_url(url)
        self.api_format = validate_api_format(api_format, field=f"CompletionClient {label('api_format')}")
        self.model = optional_str("model", model)
        self.timeout = finite_number("timeout", timeout, 0.0, allow_none=True, strict=True)
        self._headers = check_mapping("headers", headers, str_values=True) or {}
        self.api_key_env = optional_str("api_key_env", api_key_env)
        if not isinstance(key_header, str) or not key_header.strip():
            raise invalid("key_header", key_header, "a non-empty header name such as 'Authorization'")
        self.key_header = key_header.strip()
        self.key_prefix = optional_str("key_prefix", key_prefix)
        self.response_field = optional_str("response_field", response_field)
        self._extra_body = check_mapping("extra_body", extra_body, str_values=False)
        self.max_n_per_request = int_at_least("max_n_per_request", max_n_per_request, 1, allow_none=True)
        self.max_retries = int_at_least("max_retries", max_retries, 0)
        self.backoff_s = finite_number("backoff_s", backoff_s, 0.0)
        self.max_concurrency = int_at_least("max_concurrency", max_concurrency, 1)
        self._api_key, self._key_source = resolve_key(api_key, self.api_key_env, self._format.default_key_env)
        self._sleep = time.sleep if sleep is None else sleep
        self._rng = random.Random() if rng is None else rng
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._http: Optional[httpx.Client] = None
        self._pool: Optional[ThreadPoolExecutor] = None

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> "CompletionClient":
        """A client from the ``comparator_api_*`` fields of a config object (or a mapping holding
        them); fields the config lacks keep the constructor defaults, ``overrides`` win."""
        kwargs: Dict[str, Any] = {}
        for argument, field in CONFIG_FIELDS.items():
            if isinstance(config, Mapping):
                present, value = field in config, config.get(field)
            else:
                present, value = hasattr(config, field), getattr(config, field, None)
            if present:
                kwargs[argument] = value
        kwargs.update(overrides)
        if kwargs.get("url") is None:
            raise ValueError("comparator_api_url is required for the API comparator (comparator_policy='api').")
        return cls(kwargs.pop("url"), **kwargs)

    # ------------------------------------------------------------------ public settings

    @property
    def _format(self):
        return FORMATS[self.api_format]

    @property
    def headers(self) -> Dict[str, str]:
        """The extra request headers, credential ones masked (``is_secret_header``)."""
        return redact_headers(self._headers)

    @property
    def extra_body(self) -> Optional[Dict[str, Any]]:
        """The fields merged into every request body, credential-named ones masked."""
        return None if self._extra_body is None else redact_secrets(self._extra_body)

    @property
    def has_api_key(self) -> bool:
        return self._api_key is not None

    def to_dict(self) -> Dict[str, Any]:
        """The settings, safe to log or write to disk (the key shows only as ``"***"`` when set)."""
        return {
            "url": self._shown_url,
            "api_format": self.api_format,
            "model": self.model,
            "timeout": self.timeout,
            "headers": self.headers,
            "api_key": MASK if self._api_key else None,
            "api_key_env": self.api_key_env,
            "key_header": self.key_header,
            "key_prefix": self.key_prefix,
            "response_field": self.response_field,
            "extra_body": self.extra_body,
            "max_n_per_request": self.max_n_per_request,
            "max_retries": self.max_retries,
            "backoff_s": self.backoff_s,
            "max_concurrency": self.max_concurrency,
        }

    def describe(self) -> str:
        """A one-line summary without credentials."""
        if self._key_source == "api_key":
            key = "given"
        else:
            key = f"from ${self._key_source}" if self._key_source else "none"
        return (
            f"CompletionClient({self.api_format} at {self._shown_url}, model={self.model!r}, key={key}, "
            f"timeout={self.timeout}, max_n_per_request={self.max_n_per_request}, max_retries={self.max_retries})"
        )

    __repr__ = describe

    # ------------------------------------------------------------------ completions

    def complete(self, prompt: str, n: int, *, max_new_tokens: int, temperature: float, top_p: float,
                 top_k: Optional[int] = None, agent_idx: Optional[int] = None, batch_item: Any = None) -> List[str]:
        """``n`` completions of ``prompt``, in request order."""
        return self.complete_many(
            [prompt], n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
            top_k=top_k, agent_idx=agent_idx, batch_item=batch_item,
        )[0]

    def complete_many(self, prompts: Sequence[str], n: int, *, max_new_tokens: int, temperature: float,
                      top_p: float, top_k: Optional[int] = None, agent_idx: Optional[int] = None,
                      batch_item: Any = None, agent_indices: Optional[Sequence[Optional[int]]] = None,
                      batch_items: Optional[Sequence[Any]] = None) -> List[List[str]]:
        """``n`` completions for each prompt; every request of the call runs concurrently.

        ``agent_idx`` / ``batch_item`` are shared by all prompts; ``agent_indices`` /
        ``batch_items`` give one per prompt (generic format only sends them). Requests that
        return fewer candidates than asked for are followed by requests for the rest.
        """
        prompts = list(prompts)
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                raise TypeError(f"complete_many prompts[{index}] must be a string, got {type(prompt).__name__}.")
        int_at_least("n", n, 1)
        sampling = check_sampling(max_new_tokens, temperature, top_p, top_k)
        agents = per_prompt("agent_indices", agent_indices, agent_idx, len(prompts), "agent_idx")
        items = per_prompt("batch_items", batch_items, batch_item, len(prompts), "batch_item")
        per_request = candidates_per_request(self._format, self.url, self.model, self.max_n_per_request, n)
        results: List[List[str]] = [[] for _ in prompts]
        while True:
            jobs = []
            for index, collected in enumerate(results):
                missing = n - len(collected)
                while missing > 0:
                    count = min(per_request, missing)
                    jobs.append((index, count))
                    missing -= count
            if not jobs:
                return results
            bodies = [
                self._format.build_body(prompts[i], count, sampling, self.model, agents[i], items[i], self._extra_body)
                for i, count in jobs
            ]
            replies = self._map(self._request, list(zip(bodies, (count for _, count in jobs))))
            for (index, _), texts in zip(jobs, replies):
                results[index].extend(texts)

    def _map(self, function: Callable[[Any], Any], jobs: List[Any]) -> List[Any]:
        if len(jobs) == 1 or self.max_concurrency == 1:
            return [function(job) for job in jobs]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="comlrl-completion-api")
            pool = self._pool
        return list(pool.map(function, jobs))

    def _request(self, job: Tuple[Dict[str, Any], int]) -> List[str]:
        body, count = job
        payload = self._post(body)
        try:
            texts = self._format.parse(payload, self.response_field)
        except MalformedResponse as exc:
            raise CompletionAPIResponseError(
                self._mask(
                    f"Completion API {self._shown_url} ({self.api_format} format) returned JSON without completions: "
                    f"{exc}. Reply starts: {_excerpt(json.dumps(payload, ensure_ascii=False))}"
                ),
                url=self._shown_url, status=200,
            ) from None
        if not texts:
            raise CompletionAPIResponseError(
                f"Completion API {self._shown_url} ({self.api_format} format) returned no completions.",
                url=self._shown_url, status=200,
            )
        return texts[:count]

    # ------------------------------------------------------------------ HTTP

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None:
                self._http = httpx.Client(timeout=httpx.Timeout(self.timeout), follow_redirects=False)
            return self._http

    def _request_headers(self) -> httpx.Headers:
        headers = httpx.Headers({"Content-Type": "application/json", "Accept": "application/json"})
        headers.update(format_headers(self._format, self._headers))
        headers.update(self._headers)
        if self._api_key:
            name, value = auth_header(self._format, self.key_header, self.key_prefix, self._api_key)
            headers[name] = value
        return headers

    def _post(self, body: Dict[str, Any]) -> Any:
        """POST ``body`` and return the reply's JSON, retrying transient failures."""
        content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        failure, status = "", None
        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                response = self._client().post(self.url, content=content, headers=self._request_headers())
            except _RETRYABLE_TRANSPORT as exc:
                failure, status = f"{type(exc).__name__}: {exc or 'no detail'}", None
            except httpx.HTTPError as exc:
                raise CompletionAPIRequestError(
                    self._mask(f"Completion API request to {self._shown_url} failed: {type(exc).__name__}: {exc}"),
                    url=self._shown_url,
                ) from None
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return self._decode(response)
                if status != 429 and status < 500:
                    raise self._status_error(response)
                failure = f"HTTP {status} {response.reason_phrase}".rstrip()
                retry_after = retry_after_seconds(response.headers.get("Retry-After"))
            if attempt < self.max_retries:
                delay = self._retry_delay(attempt, retry_after)
                logger.warning(
                    "%s", self._mask(f"Completion API {self._shown_url}: {failure}; retry {attempt + 1} of "
                                     f"{self.max_retries} in {delay:.2f} s")
                )
                self._sleep(delay)
        raise CompletionAPIUnavailable(
            self._mask(
                f"Completion API {self._shown_url} failed after {self.max_retries + 1} attempt(s); last error: "
                f"{failure}. Check that the endpoint is up and reachable, or raise max_retries / timeout."
            ),
            url=self._shown_url, status=status,
        )

    def _retry_delay(self, attempt: int, retry_after: Optional[float]) -> float:
        """``Retry-After`` when the server sent one, else ``backoff_s * 2**attempt`` plus up to 10%
        jitter; at most ``MAX_RETRY_DELAY_S``."""
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_DELAY_S)
        base = self.backoff_s * (2.0 ** attempt)
        return min(base + self._rng.uniform(0.0, 0.1 * base), MAX_RETRY_DELAY_S)

    def _decode(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            content_type = response.headers.get("Content-Type", "none")
            raise CompletionAPIResponseError(
                self._mask(
                    f"Completion API {self._shown_url} returned HTTP {response.status_code} with a body that is not "
                    f"JSON (Content-Type {content_type}); expected a JSON object with completions "
                    f"({self.api_format} format). Body starts: {_excerpt(response.text)}"
                ),
                url=self._shown_url, status=response.status_code,
            ) from None

    def _status_error(self, response: httpx.Response) -> CompletionAPIError:
        status = response.status_code
        head = f"Completion API {self._shown_url} answered HTTP {status} {response.reason_phrase}".rstrip()
        body = _excerpt(response.text)
        if status == 402:
            message = (f"{head}: insufficient balance or quota on the account behind the API key; top up or use "
                       f"another key. Body: {body}")
            return InsufficientBalanceError(self._mask(message), url=self._shown_url, status=status)
        hint = " To leave out a body field the format sends, set it to None in extra_body (comparator_api_extra_body)."
        return CompletionAPIRequestError(
            self._mask(f"{head}. Body: {body}.{hint if status in (400, 422) else ''}"),
            url=self._shown_url, status=status,
        )

    # ------------------------------------------------------------------ credentials

    @property
    def _shown_url(self) -> str:
        return mask_values(redact_url(self.url), self._secret_values())

    def _secret_values(self) -> List[str]:
        values = [self._api_key] if self._api_key else []
        if self._api_key:
            values.append(auth_header(self._format, self.key_header, self.key_prefix, self._api_key)[1])
        values.extend(v for k, v in self._headers.items() if is_secret_header(k, v))
        values.extend(secret for v in self._headers.values() for secret in secrets_in(v))
        values.extend(secrets_in(self.url))
        values.extend(
            v for k, v in (self._extra_body or {}).items() if is_secret_name(k) and isinstance(v, str)
        )
        return values

    def _mask(self, text: str) -> str:
        return redact_text(text, self._secret_values())

    # ------------------------------------------------------------------ lifecycle, copies, pickles

    def close(self) -> None:
        """Close the connection pool and the worker threads (a later call opens them again)."""
        with self._lock:
            http, pool, self._http, self._pool = self._http, self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=True)
        if http is not None:
            http.close()

    def __enter__(self) -> "CompletionClient":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __getstate__(self) -> Dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_api_key", "_http", "_pool", "_lock", "_sleep")}
        state["_headers"] = redact_headers(self._headers, drop=True)
        if self._extra_body is not None:
            state["_extra_body"] = redact_secrets(self._extra_body, drop=True)
        state["url"] = redact_url(self.url)
        state["_dropped_credentials"] = (
            self._key_source == "api_key"
            or state["_headers"] != self._headers
            or state["url"] != self.url
            or (self._extra_body is not None and state["_extra_body"] != self._extra_body)
        )
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        dropped = state.pop("_dropped_credentials", False)
        self.__dict__.update(state)
        self._sleep = time.sleep
        self._init_runtime()
        self._api_key = None
        if self._key_source not in (None, "api_key"):
            key = os.environ.get(self._key_source, "").strip()
            self._api_key = check_key(key, f"${self._key_source}") if key else None
            dropped = dropped or not key
        if self._api_key is None:
            self._key_source = None
        if dropped:
            warnings.warn(
                "A CompletionClient was unpickled without the credentials it was given directly (keys and "
                "secret headers are never pickled); pass api_key_env so the key is read from the environment.",
                stacklevel=2,
            )

    def __copy__(self) -> "CompletionClient":
        clone = object.__new__(type(self))
        clone.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("_http", "_pool", "_lock")})
        clone._init_runtime()
        return clone

    def __deepcopy__(self, memo: Dict[int, Any]) -> "CompletionClient":
        clone = object.__new__(type(self))
        state = {k: v for k, v in self.__dict__.items() if k not in ("_http", "_pool", "_lock")}
        clone.__dict__.update(copy.deepcopy(state, memo))
        clone._init_runtime()
        return clone


def _excerpt(text: str) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= _EXCERPT_CHARS else flat[:_EXCERPT_CHARS] + "..."

