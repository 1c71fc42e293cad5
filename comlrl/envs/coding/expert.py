"""``external.mode=expert_edits``: edit suggestions from an external LLM for the next turn's prompts.

What the original (OpenMLRL/LLM_Collab_Code_Generation, ``external/expert_edits.py``) does, and so
what happens here:

1. After a turn, the problem (the row's ``prompt``) and the joint response, combined as the reward
   combines it (the prompt's imports, then the cleaned aux completion, then the cleaned main one),
   go to the expert in one user message that asks for JSON ``{"aux": ..., "main": ...}`` (one agent:
   only the main function and ``{"main": ...}``). The original asks for edits "that would help pass
   the provided unit tests" but sends none; ``external.expert_include_tests=true`` adds the feedback
   asserts (``external.sandbox_slice``) and how the code fared on each.
2. The expert is picked by ``external.expert_model`` (default ``deepseek-coder``), the first match of:

   | model name contains | endpoint | format | key variable | temperature |
   |---|---|---|---|---|
   | ``claude`` | ``https://api.anthropic.com/v1/messages`` | anthropic | ``ANTHROPIC_API_KEY`` | not sent |
   | ``deepseek`` | ``https://api.deepseek.com/chat/completions`` | openai | ``DEEPSEEK_API_KEY`` | 0.3 |
   | ``qwen3-coder`` | ``https://dashscope-intl.aliyuncs.com/compatible-mode/v1/chat/completions`` | openai | ``DASHSCOPE_API_KEY`` | 0.3 |

   with at most 2048 new tokens; ``external.expert_api_url`` / ``expert_api_format`` /
   ``expert_api_key_env`` / ``expert_temperature`` / ``expert_max_tokens`` override them (any
   other model needs ``expert_api_url``). A provider's key variable is read only for its own URL:
   another ``expert_api_url`` gets no key unless ``expert_api_key_env`` names one. Requests go
   through ``comlrl.adapters.CompletionClient``.
3. The edits are the ``aux`` and ``main`` fields of the last JSON object in the reply (a missing
   or null field: no edits for that agent).
4. A reply without a JSON object, or an endpoint still unavailable after the client's retries, is
   asked again, ``external.expert_attempts`` (3) requests in all; then the original's fallback: no
   edits this turn, with a warning (``external.expert_on_failure=raise`` stops the run instead).
   An endpoint that refuses the request (4xx: a wrong key, model or URL; 402: no balance) stops
   the run at once, since every later request would fail the same way.

The key is read from its environment variable by the client; it never appears in a config, a
log line or an error text. ``docs/environments.md`` has the user-facing summary.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from comlrl.adapters import (
    CompletionAPIRequestError, CompletionAPIResponseError, CompletionAPIUnavailable, CompletionClient, InsufficientBalanceError,
    redact_url, validate_api_format,
)
from comlrl.envs.coding import analysis
from comlrl.envs.sandbox.cleaning import clean_text

logger = logging.getLogger(__name__)

FAILURE_POLICIES = ("fallback", "raise")


@dataclass(frozen=True)
class Provider:
    """An expert endpoint the original supports, chosen by a substring of the model name."""

    marker: str
    url: str
    api_format: str
    key_env: str
    temperature: Optional[float]
    """None: no temperature is sent (the provider's default)."""


PROVIDERS: Tuple[Provider, ...] = (
    Provider("claude", "https://api.anthropic.com/v1/messages", "anthropic", "ANTHROPIC_API_KEY", None),
    Provider("deepseek", "https://api.deepseek.com/chat/completions", "openai", "DEEPSEEK_API_KEY", 0.3),
    Provider("qwen3-coder", "https://dashscope-intl.aliyuncs.com/compatible-mode/v1/chat/completions", "openai", "DASHSCOPE_API_KEY", 0.3),
)
DEFAULT_TEMPERATURE = 0.3
"""Sampling temperature of an endpoint the table does not know (the original's OpenAI-compatible value)."""
MAX_REPLY_CHARS = 256 * 1024
"""Characters of an expert's reply searched for its JSON object."""
MAX_JSON_ATTEMPTS = 512
"""Braces of a reply that start no JSON object tried before the search stops."""
EDIT_CAP = 64 * 1024
"""Characters of an agent's edits kept in its next prompt (cleaned of control and format characters)."""


class ExpertEditsError(RuntimeError):
    """The expert gave no edits and ``external.expert_on_failure=raise`` stops the run."""


class ExpertRequestRefused(ExpertEditsError, ValueError):
    """The endpoint refused the request (a wrong key, model or URL, or no balance): a configuration error."""


@dataclass(frozen=True)
class ExpertSettings:
    """The resolved expert endpoint (every field checked; see ``resolve_settings``)."""

    model: str
    url: str
    api_format: str
    key_env: Optional[str]
    """The variable holding the key (None: no key is sent)."""
    temperature: Optional[float]
    max_tokens: int
    timeout: float
    attempts: int
    on_failure: str
    include_tests: bool


def _provider(model: str) -> Optional[Provider]:
    lowered = model.lower()
    return next((p for p in PROVIDERS if p.marker in lowered), None)


def _positive(key: str, value: Any, kind: type) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (kind is int and not isinstance(value, int)):
        raise ValueError(f"{key} must be a positive {'integer' if kind is int else 'number'}, got {value!r}.")
    return kind(value)


def _key_variable(name: Any, model: str) -> Optional[str]:
    """The key's variable (None: no key); it must be set, but only its name is ever shown."""
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"external.expert_api_key_env must name an environment variable, got {name!r}.")
    name = name.strip()
    if not os.environ.get(name, "").strip():
        raise ValueError(
            f"external.mode=expert_edits with external.expert_model={model!r} reads its API key from ${name}, which is not set "
            f"or empty: export it (the key never goes into a config), name another variable with external.expert_api_key_env, "
            f"or choose another external.mode."
        )
    return name


def resolve_settings(*, model: Any, url: Any, api_format: Any, key_env: Any, temperature: Any, max_tokens: Any, timeout: Any,
                     attempts: Any, on_failure: Any, include_tests: Any) -> ExpertSettings:
    """Check the ``external.expert_*`` options and fill in the provider's endpoint; errors name the
    option and the fix (and never show a key: only the variable's name is known here)."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"external.expert_model must name the expert model (e.g. 'deepseek-coder'), got {model!r}.")
    model = model.strip()
    provider = _provider(model)
    if url is None and provider is None:
        known = ", ".join(repr(p.marker) for p in PROVIDERS)
        raise ValueError(
            f"external.expert_model={model!r} matches no built-in expert endpoint (model names containing {known}); "
            f"set external.expert_api_url (and external.expert_api_format, external.expert_api_key_env) for another endpoint."
        )
    own_endpoint = url is None  # a provider's key goes only to that provider's URL
    url = url if url is not None else provider.url
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        shown = redact_url(url) if isinstance(url, str) else url
        raise ValueError(f"external.expert_api_url must be an http:// or https:// URL, got {shown!r}.")
    default_format = provider.api_format if provider is not None and api_format is None else "openai"
    api_format = validate_api_format(api_format if api_format is not None else default_format, field="external.expert_api_format")
    if temperature is None:
        temperature = provider.temperature if provider is not None else DEFAULT_TEMPERATURE
    elif isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"external.expert_temperature must be a number >= 0 or null (the provider's default), got {temperature!r}.")
    if on_failure not in FAILURE_POLICIES:
        raise ValueError(f"external.expert_on_failure must be one of {', '.join(FAILURE_POLICIES)}, got {on_failure!r}.")
    if not isinstance(include_tests, bool):
        raise ValueError(f"external.expert_include_tests must be true or false, got {include_tests!r}.")
    max_tokens = _positive("external.expert_max_tokens", max_tokens, int)
    timeout = _positive("external.expert_timeout", timeout, float)
    attempts = _positive("external.expert_attempts", attempts, int)
    key_env = _key_variable(key_env if key_env is not None or not own_endpoint else provider.key_env, model)
    return ExpertSettings(
        model=model, url=url, api_format=api_format, key_env=key_env, temperature=None if temperature is None else float(temperature),
        max_tokens=max_tokens, timeout=timeout, attempts=attempts, on_failure=on_failure, include_tests=include_tests,
    )


# ----------------------------------------------------------------------------- the request and the reply


def request_text(problem: str, aux_text: str, main_text: str, *, agents: int, entry_point: str,
                 tests: Optional[Sequence[Tuple[str, str]]] = None) -> str:
    """The user message to the expert: the problem, the combined code, what to answer.

    ``tests``: (assert, outcome) pairs to include (``expert_include_tests``), else None.
    """
    code = analysis.combine(aux_text if agents == 2 else "", main_text, analysis.prompt_imports(problem))
    if agents == 2:
        lines = [
            f"You are an expert reviewing Python code that two agents wrote together for this task:\n{problem}",
            f"The auxiliary agent writes a helper function aux; the main agent writes the entry function {entry_point}.",
            "",
            'Propose edits for each agent, as a JSON object with the keys "aux" and "main":',
            "1. If a function is missing, give a minimal correct implementation as its edit.",
            "2. If both functions exist, give concise edits that would make the unit tests pass.",
            "3. If a function needs no change, write: No changes needed.",
            "",
            'Answer with the JSON object only: {"aux": "<edits or replacement>", "main": "<edits or replacement>"}',
        ]
    else:
        lines = [
            f"You are an expert reviewing Python code that one agent wrote for this task:\n{problem}",
            "",
            f'Propose edits to the function {entry_point}, as a JSON object with the key "main":',
            "1. If the function is missing, give a minimal correct implementation as the edit.",
            "2. If it exists, give concise edits that would make the unit tests pass.",
            "3. If it needs no change, write: No changes needed.",
            "",
            'Answer with the JSON object only: {"main": "<edits or replacement>"}',
        ]
    lines += ["", "The current code:", code or "(no code)"]
    if tests is not None:
        lines += ["", "Unit tests and how the current code fared:"]
        lines += [f"- {case} -> {outcome}" for case, outcome in tests] or ["- (no test cases found)"]
    return "\n".join(lines) + "\n"


def last_json_object(text: str) -> Optional[dict]:
    """The last JSON object in ``text``: objects are read left to right, each scan resuming after
    the end of the one found (so objects nested in strings of a found one are not candidates).
    Bounded: only the first ``MAX_REPLY_CHARS`` are read, at most ``MAX_JSON_ATTEMPTS`` braces that
    start no object are tried (each failure costs the decoder time linear in its position), and
    JSON nested too deeply to decode is no object."""
    decoder = json.JSONDecoder()
    found: Optional[dict] = None
    text = (text or "")[:MAX_REPLY_CHARS]
    index = text.find("{")
    failures = 0
    while index != -1 and failures < MAX_JSON_ATTEMPTS:
        try:
            value, end = decoder.raw_decode(text, index)
        except (json.JSONDecodeError, RecursionError):
            failures += 1
            index = text.find("{", index + 1)
            continue
        if isinstance(value, dict):
            found = value
        index = text.find("{", end)
    return found


def _field(reply: dict, name: str) -> str:
    value = reply.get(name)
    if value is None:
        return ""
    if not isinstance(value, (dict, list)):
        return value if isinstance(value, str) else str(value)
    try:
        return json.dumps(value)
    except (ValueError, RecursionError):  # nested deeper than the encoder goes
        return ""


class ExpertEditor:
    """Asks the expert endpoint for edits (see the module docstring).

    ``client``: a ready ``CompletionClient`` (tests); default one built from ``settings``.
    ``requests`` and ``fallbacks`` count the calls and the turns that went without edits.
    """

    def __init__(self, settings: ExpertSettings, client: Optional[CompletionClient] = None):
        self.settings = settings
        self.client = client or self._client(settings)
        self.requests = 0
        self.fallbacks = 0

    @staticmethod
    def _client(s: ExpertSettings) -> CompletionClient:
        drop = {"temperature": None} if s.temperature is None else {}
        if s.api_format in ("openai", "openai_responses"):
            drop.update(top_p=None)  # the original sends model, messages, max_tokens and temperature only
        if s.api_format == "openai":
            drop.update(n=None)
        key = {"api_key_env": s.key_env} if s.key_env else {"api_key": ""}  # no variable: send no key at all
        return CompletionClient(s.url, api_format=s.api_format, model=s.model, timeout=s.timeout, extra_body=drop or None,
                                max_concurrency=1, **key)

    def describe(self) -> str:
        return f"expert {self.settings.model!r} at {redact_url(self.settings.url)}"

    def edits(self, text: str) -> Tuple[str, str]:
        """``(aux edits, main edits)`` for the request ``text`` ("" each after a failure with the
        fallback policy)."""
        s = self.settings
        temperature = 1.0 if s.temperature is None else s.temperature  # None: removed from the body (extra_body)
        problem = "no reply yet"
        for _ in range(s.attempts):
            self.requests += 1
            try:
                reply = self.client.complete(text, 1, max_new_tokens=s.max_tokens, temperature=temperature, top_p=1.0)[0]
            except (CompletionAPIRequestError, InsufficientBalanceError) as error:
                raise ExpertRequestRefused(f"external.mode=expert_edits: the {self.describe()} refused the request: {error}") from error
            except (CompletionAPIUnavailable, CompletionAPIResponseError) as error:
                problem = f"{type(error).__name__}: {error}"
                continue
            logger.debug("expert_edits reply: %s", reply)
            parsed = last_json_object(reply)
            if parsed is not None:
                return _field(parsed, "aux"), _field(parsed, "main")
            problem = "the reply holds no JSON object"
        if s.on_failure == "raise":
            raise ExpertEditsError(f"external.mode=expert_edits: no edits from the {self.describe()} after {s.attempts} "
                                   f"request(s) ({problem}); external.expert_on_failure=fallback continues without them.")
        self.fallbacks += 1
        logger.warning("external.mode=expert_edits: no edits from the %s after %d request(s) (%s); this turn's prompts carry "
                       "none.", self.describe(), s.attempts, problem)
        return "", ""

    def close(self) -> None:
        self.client.close()


def expert_prompts(edits: Sequence[str], entry_point: str, prompt_history: Sequence[Sequence[str]],
                   response_history: Sequence[Sequence[str]], history: Any, agents: int) -> List[str]:
    """The next prompts: each agent's own history, the expert's edits for its part, the request to revise.

    ``history(prompts, responses, role) -> lines`` is the feedback modes' history block.
    """
    names = ["aux", entry_point] if agents == 2 else [entry_point]
    roles = ["aux(...)", "main"] if agents == 2 else [entry_point + "(...)"]
    out = []
    for index, (name, role, edit) in enumerate(zip(names, roles, edits[-agents:])):
        lines = history(prompt_history[index], response_history[index], role)
        lines += ["Edits suggested by an expert reviewer:", clean_text(edit, EDIT_CAP, multiline=True).strip() or "(none)", "",
                  f"Revise your {name}(...) accordingly. Output only the function code, nothing else."]
        out.append("\n".join(lines))
    return out
