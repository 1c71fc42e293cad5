"""CompletionClient against a scripted HTTP server on 127.0.0.1: request bodies and parsing of every
format, batching, concurrency, retries, errors and key hygiene. No test reaches the internet; backoff
sleeps are recorded instead of slept."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import pickle
import random
import socket
import threading
from datetime import datetime, timezone
from typing import Optional

import numpy as np
import pytest
from tests.helpers.common import REPO_ROOT

from comlrl.adapters import (
    CompletionAPIRequestError,
    CompletionAPIResponseError,
    CompletionAPIUnavailable,
    CompletionClient,
    InsufficientBalanceError,
    is_secret_name,
    redact_secrets,
    redact_url,
    validate_api_format,
)
from comlrl.adapters.completion_api import retry_after_seconds
from tests.helpers.local_http import LocalServer, Reply

KEY = "sk-test-Secret-0123456789"
SAMPLING = dict(max_new_tokens=16, temperature=0.7, top_p=0.9)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No proxy or vendor key from the outer environment may reach these tests."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "COMLRL_TEST_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server():
    with LocalServer() as srv:
        yield srv


class Sleeps(list):
    """An injectable ``sleep`` that records the delays instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def client_for(server, path, sleeps=None, **kwargs) -> CompletionClient:
    kwargs.setdefault("sleep", sleeps if sleeps is not None else Sleeps())
    return CompletionClient(server.url(path), **kwargs)


def numbered(prefix: str, count: int):
    return [f"{prefix}{i}" for i in range(count)]


def barrier_route(parties: int, make_reply):
    """A route whose replies wait until ``parties`` requests are in flight together (proof of
    concurrency); a sequential client breaks the barrier and gets a 500."""
    barrier = threading.Barrier(parties, timeout=5)

    def route(request):
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return Reply(500, {"error": "requests were not concurrent"})
        return make_reply(request)

    return route


# --------------------------------------------------------------------------- formats


def test_validate_api_format_canonical_names_aliases_and_typos():
    expected = {
        "generic": "generic", "openai": "openai", "openai_chat": "openai", "chat": "openai",
        "anthropic": "anthropic", "anthropic_messages": "anthropic", "messages": "anthropic",
        "openai_responses": "openai_responses", "responses": "openai_responses", "codex": "openai_responses",
        " OpenAI-Chat ": "openai",
    }
    for name, canonical in expected.items():
        assert validate_api_format(name) == canonical
    with pytest.raises(ValueError) as info:
        validate_api_format("opnai")
    text = str(info.value)
    assert "comparator_api_format" in text and "'opnai'" in text
    for listed in ("generic", "openai_chat", "anthropic_messages", "openai_responses", "codex"):
        assert listed in text
    with pytest.raises(ValueError, match="api_format"):
        CompletionClient("http://127.0.0.1:9/x", api_format="antropic")
    with pytest.raises(ValueError):
        validate_api_format(None)


def test_generic_body_extra_body_and_parsing(server):
    server.route("/gen", lambda r: Reply(body={"completions": numbered("g", r.body["num_return_sequences"])}))
    item = {"id": np.int64(7), "scores": np.array([0.5, 1.5]), "pair": (1, 2), "bad": float("nan"), 3: {"x"}}
    with client_for(server, "/gen", model="local-model", extra_body={"seed": 11, "top_k": None}) as client:
        texts = client.complete("Write a poem", 3, top_k=5, agent_idx=1, batch_item=item, **SAMPLING)
    assert texts == ["g0", "g1", "g2"]
    (request,) = server.requests_to("/gen")
    assert request.body == {
        "prompt": "Write a poem", "agent_idx": 1, "num_return_sequences": 3, "max_new_tokens": 16,
        "temperature": 0.7, "top_p": 0.9, "model": "local-model", "seed": 11,
        # JSON-safe batch item: numpy values via tolist(), tuples as lists, NaN and sets as text/lists.
        "batch_item": {"id": 7, "scores": [0.5, 1.5], "pair": [1, 2], "bad": "nan", "3": ["x"]},
    }  # top_k was removed by extra_body's None
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers  # no key configured, none sent


def test_generic_response_field_path_fallback_keys_and_item_shapes(server):
    server.script("/nested", Reply(body={"data": {"outputs": [{"text": "a"}, {"message": {"content": "b"}}, 3]}}))
    server.script("/fallback", Reply(body={"outputs": [{"completion": "x"}, {"response": "y"}]}))
    server.script("/bare", Reply(body=["only"]))
    with client_for(server, "/nested", response_field="data.outputs") as client:
        assert client.complete("p", 3, **SAMPLING) == ["a", "b", "3"]
    with client_for(server, "/fallback") as client:  # "completions" absent: the documented fallbacks
        assert client.complete("p", 2, **SAMPLING) == ["x", "y"]
    with client_for(server, "/bare") as client:
        assert client.complete("p", 1, **SAMPLING) == ["only"]


def test_generic_loops_until_n_collected_when_replies_are_short(server):
    # The server returns at most 2 completions per request: asking for 5 takes requests of 5, 3, 1.
    counter = iter(range(100))
    server.route("/short", lambda r: Reply(body={"completions": [
        f"c{next(counter)}" for _ in range(min(2, r.body["num_return_sequences"]))]}))
    with client_for(server, "/short") as client:
        texts = client.complete("p", 5, **SAMPLING)
    assert texts == ["c0", "c1", "c2", "c3", "c4"]
    assert [r.body["num_return_sequences"] for r in server.requests_to("/short")] == [5, 3, 1]


def test_openai_body_key_header_and_parsing(server):
    server.script("/v1/chat/completions", Reply(body={"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "first"}},
        {"index": 1, "text": "second"},
        {"index": 2, "message": {"role": "assistant", "content": None}},
    ]}))
    client = client_for(server, "/v1/chat/completions", api_format="openai", model="gpt-x", api_key=KEY,
                        extra_body={"seed": 3})
    with client:
        assert client.complete("Hello", 3, top_k=40, agent_idx=0, **SAMPLING) == ["first", "second", ""]
    (request,) = server.requests
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body == {"model": "gpt-x", "messages": [{"role": "user", "content": "Hello"}], "n": 3,
                            "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 3}


def test_openai_batches_n_up_to_max_n_per_request(server):
    server.route("/b", lambda r: Reply(body={"choices": [{"message": {"content": f"n{r.body['n']}"}}] * r.body["n"]}))
    with client_for(server, "/b", api_format="chat", model="m", max_n_per_request=3) as client:
        texts = client.complete("p", 7, **SAMPLING)
    # 7 candidates at most 3 per request: requests for 3, 3 and 1, issued together, results in job order.
    assert sorted(r.body["n"] for r in server.requests) == [1, 3, 3]
    assert texts == ["n3"] * 6 + ["n1"]


@pytest.mark.parametrize("url_path, model", [("/v1/chat/completions", "deepseek-chat"), ("/api.deepseek.com/v1", "x")])
def test_openai_deepseek_endpoints_ask_for_one_candidate_per_request(server, url_path, model):
    server.route(url_path, lambda r: Reply(body={"choices": [{"message": {"content": "d"}}] * r.body["n"]}))
    with client_for(server, url_path, api_format="openai", model=model) as client:
        assert client.complete("p", 3, **SAMPLING) == ["d", "d", "d"]
    assert [r.body["n"] for r in server.requests] == [1, 1, 1]
    server.requests.clear()
    with client_for(server, url_path, api_format="openai", model=model, max_n_per_request=2) as client:
        assert client.complete("p", 3, **SAMPLING) == ["d", "d", "d"]  # an explicit cap wins, as in 1.4.3
    assert sorted(r.body["n"] for r in server.requests) == [1, 2]


def test_anthropic_body_headers_parsing_and_concurrent_requests(server):
    reply = {"type": "message", "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "claude"}]}
    server.route("/v1/messages", barrier_route(3, lambda r: Reply(body=reply)))
    with client_for(server, "/v1/messages", api_format="messages", model="claude-x", api_key=KEY,
                    max_retries=0) as client:
        assert client.complete("Hi", 3, top_k=4, **SAMPLING) == ["claude"] * 3
    assert len(server.requests) == 3  # one request per candidate, all in flight together
    for request in server.requests:
        assert request.headers["x-api-key"] == KEY  # no "Bearer" prefix
        assert "authorization" not in request.headers
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert request.body == {"model": "claude-x", "max_tokens": 16,
                                "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7}


def test_anthropic_keeps_a_given_version_header_and_reads_an_empty_reply_as_empty_text(server):
    server.script("/m", Reply(body={"content": []}))
    with client_for(server, "/m", api_format="anthropic", headers={"Anthropic-Version": "2099-01-01"}) as client:
        assert client.complete("p", 1, **SAMPLING) == [""]
    assert server.requests[0].headers["anthropic-version"] == "2099-01-01"


def test_openai_responses_body_parsing_and_field_removal(server):
    reply = {"output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "content": [{"type": "output_text", "text": "part one, "},
                                        {"type": "refusal", "refusal": "no"},
                                        {"type": "output_text", "text": "part two"}]},
    ]}
    server.route("/v1/responses", barrier_route(2, lambda r: Reply(body=reply)))
    with client_for(server, "/v1/responses", api_format="codex", model="codex-x", api_key=KEY, max_retries=0,
                    extra_body={"temperature": None, "reasoning": {"effort": "low"}}) as client:
        assert client.complete("Fix it", 2, **SAMPLING) == ["part one, part two"] * 2
    for request in server.requests:
        assert request.headers["authorization"] == f"Bearer {KEY}"
        # temperature removed through extra_body (reasoning models refuse it); top_p still sent.
        assert request.body == {"model": "codex-x", "input": "Fix it", "max_output_tokens": 16, "top_p": 0.9,
                                "reasoning": {"effort": "low"}}


def test_complete_many_runs_prompts_concurrently_and_keeps_their_order(server):
    server.route("/many", barrier_route(3, lambda r: Reply(body={"completions": [
        f"{r.body['prompt']}/{r.body['agent_idx']}/{i}" for i in range(r.body["num_return_sequences"])]})))
    with client_for(server, "/many", max_retries=0) as client:
        result = client.complete_many(["a", "b", "c"], 2, agent_indices=[0, 1, 2], **SAMPLING)
    assert result == [["a/0/0", "a/0/1"], ["b/1/0", "b/1/1"], ["c/2/0", "c/2/1"]]
    with pytest.raises(ValueError, match="agent_indices"):
        client.complete_many(["a", "b"], 1, agent_indices=[0], **SAMPLING)


# --------------------------------------------------------------------------- retries and errors


def test_retries_after_503_with_exponential_backoff_and_jitter(server, caplog):
    server.script("/r", Reply(503, "busy"), Reply(503, "busy"), Reply(body={"completions": ["ok"]}))
    sleeps = Sleeps()
    with caplog.at_level(logging.WARNING, logger="comlrl.adapters.completion_api"):
        with client_for(server, "/r", sleeps, backoff_s=0.5, rng=random.Random(0)) as client:
            assert client.complete("p", 1, **SAMPLING) == ["ok"]
    # delay_a = backoff_s * 2**a + U(0, 0.1 * backoff_s * 2**a), drawn from the same seeded RNG.
    rng = random.Random(0)
    expected = [0.5 + rng.uniform(0, 0.05), 1.0 + rng.uniform(0, 0.1)]
    assert sleeps == pytest.approx(expected)
    assert 0.5 <= sleeps[0] <= 0.55 and 1.0 <= sleeps[1] <= 1.1
    assert len(server.requests) == 3
    assert "HTTP 503" in caplog.text and server.url("/r") in caplog.text


def test_429_honours_retry_after(server):
    server.script("/limited", Reply(429, {"error": "slow down"}, headers={"Retry-After": "2"}),
                  Reply(body={"completions": ["fine"]}))
    sleeps = Sleeps()
    with client_for(server, "/limited", sleeps) as client:
        assert client.complete("p", 1, **SAMPLING) == ["fine"]
    assert sleeps == [2.0]


def test_retry_after_parsing():
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("Wed, 01 Jan 2025 12:00:05 GMT", now=now) == 5.0
    assert retry_after_seconds("Wed, 01 Jan 2025 11:00:00 GMT", now=now) == 0.0  # in the past
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_persistent_5xx_ends_in_an_error_naming_url_and_status(server):
    server.script("/down", Reply(500, "internal"))
    sleeps = Sleeps()
    with client_for(server, "/down", sleeps, max_retries=2) as client:
        with pytest.raises(CompletionAPIUnavailable) as info:
            client.complete("p", 1, **SAMPLING)
    assert isinstance(info.value, RuntimeError)
    assert server.url("/down") in str(info.value) and "HTTP 500" in str(info.value)
    assert "3 attempt" in str(info.value) and info.value.status == 500
    assert len(server.requests) == 3 and len(sleeps) == 2


def test_402_is_insufficient_balance_and_not_retried(server):
    server.script("/pay", Reply(402, {"error": {"message": "Insufficient Balance"}}))
    with client_for(server, "/pay") as client:
        with pytest.raises(InsufficientBalanceError) as info:
            client.complete("p", 1, **SAMPLING)
    assert isinstance(info.value, RuntimeError)
    text = str(info.value)
    assert "402" in text and "insufficient balance" in text and server.url("/pay") in text
    assert len(server.requests) == 1


def test_400_is_a_value_error_with_status_and_body_excerpt(server):
    detail = "Unsupported parameter: 'temperature' is not supported with this model. " + "x" * 500
    server.script("/bad", Reply(400, {"error": {"message": detail}}))
    with client_for(server, "/bad", api_format="responses") as client:
        with pytest.raises(CompletionAPIRequestError) as info:
            client.complete("p", 1, **SAMPLING)
    assert isinstance(info.value, ValueError) and info.value.status == 400
    text = str(info.value)
    assert "HTTP 400" in text and "Unsupported parameter: 'temperature'" in text and server.url("/bad") in text
    assert "x" * 400 not in text and "..." in text  # excerpt, not the whole body
    assert "extra_body" in text  # how to leave a field out
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "api_format, reply, expected",
    [
        ("generic", Reply(body="<html>gateway</html>"), "not JSON"),
        ("generic", Reply(body={"result": "no list here"}), "expected a list of completions"),
        ("generic", Reply(body={"completions": []}), "no completions"),
        ("generic", Reply(body={"completions": [{"score": 1}]}), "string field"),
        ("openai", Reply(body={"id": "x"}), "'choices' list"),
        ("openai", Reply(body={"choices": []}), "no completions"),
        ("anthropic", Reply(body={"type": "error"}), "'content' list"),
        ("openai_responses", Reply(body={"status": "done"}), "'output' list"),
    ],
)
def test_malformed_bodies_are_value_errors_naming_url_and_expectation(server, api_format, reply, expected):
    server.script("/odd", reply)
    with client_for(server, "/odd", api_format=api_format) as client:
        with pytest.raises(CompletionAPIResponseError) as info:
            client.complete("p", 1, **SAMPLING)
    assert isinstance(info.value, ValueError)
    assert expected in str(info.value) and server.url("/odd") in str(info.value)


def test_timeout_is_retried_then_reported(server):
    server.script("/slow", Reply(body={"completions": ["late"]}, delay=0.6))
    sleeps = Sleeps()
    with client_for(server, "/slow", sleeps, timeout=0.15, max_retries=1) as client:
        with pytest.raises(CompletionAPIUnavailable) as info:
            client.complete("p", 1, **SAMPLING)
    assert "Timeout" in str(info.value) and server.url("/slow") in str(info.value)
    assert info.value.status is None and len(sleeps) == 1 and len(server.requests) == 2


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sleeps = Sleeps()
    client = CompletionClient(f"http://127.0.0.1:{port}/v1", max_retries=2, sleep=sleeps)
    with pytest.raises(CompletionAPIUnavailable) as info:
        client.complete("p", 1, **SAMPLING)
    assert "ConnectError" in str(info.value) and f"127.0.0.1:{port}/v1" in str(info.value)
    assert len(sleeps) == 2


# --------------------------------------------------------------------------- credentials


def test_key_is_sent_but_never_in_errors_reprs_dumps_logs_or_pickles(server, caplog):
    echo = lambda r: Reply(401, {"error": f"bad key {r.headers.get('authorization')}", "seen": r.headers})  # noqa: E731
    server.route("/auth", echo)
    server.script("/flaky", Reply(503, {"echo": KEY}), Reply(503, {"echo": KEY}))
    url = server.url("/auth") + f"?api_key={KEY}&v=1"
    client = CompletionClient(url, api_format="openai", api_key=KEY, headers={"X-Api-Key": "hdr-secret-42"},
                              extra_body={"api_token": "body-secret-77"}, sleep=Sleeps())
    flaky = CompletionClient(server.url("/flaky"), api_key=KEY, max_retries=1, sleep=Sleeps())
    with caplog.at_level(logging.DEBUG):  # httpx and httpcore log every request at INFO / DEBUG
        with pytest.raises(CompletionAPIRequestError) as info:
            client.complete("p", 1, **SAMPLING)
        with pytest.raises(CompletionAPIUnavailable) as flaky_info:
            flaky.complete("p", 1, **SAMPLING)
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"  # the key did reach the server
    assert "HTTP Request: POST" in caplog.text and "/auth?api_key=" in caplog.text
    exposed = [str(info.value), repr(info.value), str(flaky_info.value), repr(client), client.describe(),
               str(client.to_dict()), str(client.headers), str(client.extra_body), caplog.text]
    for text in exposed:
        for secret in (KEY, "hdr-secret-42", "body-secret-77"):
            assert secret not in text
    assert "401" in str(info.value) and "***" in str(info.value)  # the echoed key was masked
    assert "api_key=%2A%2A%2A" in str(info.value) or "api_key=***" in str(info.value)
    for blob in (pickle.dumps(client), pickle.dumps(info.value), pickle.dumps(flaky)):
        for secret in (KEY, "hdr-secret-42", "body-secret-77"):
            assert secret.encode() not in blob
    assert client.to_dict()["api_key"] == "***" and client.has_api_key


def test_key_resolution_from_argument_named_variable_and_format_default(monkeypatch, server):
    server.route("/k", lambda r: Reply(body={"completions": [r.headers.get("authorization", "-")],
                                              "choices": [{"text": r.headers.get("authorization", "-")}],
                                              "content": [{"type": "text", "text": r.headers.get("x-api-key", "-")}]}))
    monkeypatch.setenv("COMLRL_TEST_KEY", "env-key-1")
    monkeypatch.setenv("OPENAI_API_KEY", "openai-default")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "anthropic-default")

    def sent(**kwargs):
        with client_for(server, "/k", **kwargs) as client:
            return client.complete("p", 1, **SAMPLING)[0]

    assert sent(api_key_env="COMLRL_TEST_KEY") == "Bearer env-key-1"
    assert sent(api_key="direct", api_key_env="COMLRL_TEST_KEY") == "Bearer direct"
    assert sent(api_key_env="COMLRL_TEST_KEY", key_header="X-Token", key_prefix=None) == "-"  # another header
    assert sent(api_format="openai") == "Bearer openai-default"
    assert sent(api_format="anthropic") == "anthropic-default"
    assert sent() == "-"  # generic reads no vendor variable
    assert sent(api_key_env="COMLRL_TEST_KEY", key_prefix="Token") == "Token env-key-1"
    monkeypatch.delenv("COMLRL_TEST_KEY")
    with pytest.raises(ValueError, match="COMLRL_TEST_KEY.*not set"):
        CompletionClient(server.url("/k"), api_key_env="COMLRL_TEST_KEY")
    with pytest.raises(ValueError) as info:
        CompletionClient(server.url("/k"), api_key="sk-bad\nInjected: header")
    assert "sk-bad" not in str(info.value) and "not shown" in str(info.value)


def test_pickles_re_read_the_key_from_the_environment_and_copies_keep_it(monkeypatch, server):
    server.route("/p", lambda r: Reply(body={"completions": [r.headers.get("authorization", "-")]}))
    monkeypatch.setenv("COMLRL_TEST_KEY", "from-env")
    from_env = client_for(server, "/p", api_key_env="COMLRL_TEST_KEY")
    blob = pickle.dumps(from_env)
    assert b"from-env" not in blob
    restored = pickle.loads(blob)
    assert restored.complete("p", 1, **SAMPLING) == ["Bearer from-env"]
    direct = client_for(server, "/p", api_key="given-key")
    with pytest.warns(UserWarning, match="without the credentials"):
        restored_direct = pickle.loads(pickle.dumps(direct))
    assert not restored_direct.has_api_key and restored_direct.complete("p", 1, **SAMPLING) == ["-"]
    assert copy.deepcopy(direct).complete("p", 1, **SAMPLING) == ["Bearer given-key"]
    assert copy.copy(direct).complete("p", 1, **SAMPLING) == ["Bearer given-key"]
    for client in (from_env, restored, direct, restored_direct):
        client.close()


def test_redact_secrets_and_secret_names():
    secret = ["api_key", "comparator_api_key", "Authorization", "X-Api-Key", "apiKey", "hf_token", "password",
              "client_secret", "access-token", "Cookie"]
    plain = ["max_new_tokens", "max_tokens", "tokenizer", "api_key_env", "comparator_api_key_env",
             "comparator_api_key_header", "comparator_api_key_prefix", "pad_token", "eos_token", "pad_token_id",
             "monkey", "keyboard_layout", "num_tokens", 3]
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in plain if is_secret_name(n)] == []
    config = {"comparator_api_key": "k1", "comparator_api_key_env": "OPENAI_API_KEY", "max_new_tokens": 8,
              "comparator_api_headers": {"Authorization": "Bearer k2", "Accept": "x"}, "hf_token": None,
              "agents": [{"password": "k3", "name": "a"}]}
    assert redact_secrets(config) == {
        "comparator_api_key": "***", "comparator_api_key_env": "OPENAI_API_KEY", "max_new_tokens": 8,
        "comparator_api_headers": {"Authorization": "***", "Accept": "x"}, "hf_token": None,
        "agents": [{"password": "***", "name": "a"}],
    }
    assert redact_secrets(config, drop=True)["comparator_api_headers"] == {"Accept": "x"}
    assert "k1" in config["comparator_api_key"]  # the input is not modified
    assert redact_url("https://user:pw@h.example/v1?key=abc&model=m") == "https://user:***@h.example/v1?key=***&model=m"


# --------------------------------------------------------------------------- construction


@dataclasses.dataclass
class _IterLikeConfig:
    comparator_api_url: Optional[str] = None
    comparator_api_format: str = "generic"
    comparator_api_model: Optional[str] = None
    comparator_api_max_n_per_request: Optional[int] = None
    comparator_api_timeout: float = 120.0
    comparator_api_headers: Optional[dict] = None
    comparator_api_key: Optional[str] = None
    comparator_api_key_env: Optional[str] = None
    comparator_api_key_header: str = "Authorization"
    comparator_api_key_prefix: str = "Bearer"
    comparator_api_response_field: str = "completions"
    comparator_api_extra_body: Optional[dict] = None


def test_from_config_reads_the_comparator_api_fields(server):
    server.route("/cfg", lambda r: Reply(body={"choices": [{"text": r.headers["authorization"]}] * r.body["n"]}))
    config = _IterLikeConfig(comparator_api_url=server.url("/cfg"), comparator_api_format="openai_chat",
                             comparator_api_model="m", comparator_api_max_n_per_request=2, comparator_api_timeout=5.0,
                             comparator_api_key=KEY, comparator_api_key_prefix="Key")
    client = CompletionClient.from_config(config, sleep=Sleeps())
    assert (client.api_format, client.model, client.max_n_per_request, client.timeout) == ("openai", "m", 2, 5.0)
    assert client.complete("p", 3, **SAMPLING) == [f"Key {KEY}"] * 3
    assert sorted(r.body["n"] for r in server.requests) == [1, 2]
    mapping_client = CompletionClient.from_config({"comparator_api_url": server.url("/cfg"), "comparator_api_format": "chat"})
    assert mapping_client.api_format == "openai" and mapping_client.timeout == 120.0
    with pytest.raises(ValueError, match="comparator_api_url is required"):
        CompletionClient.from_config(_IterLikeConfig())
    with pytest.raises(ValueError, match="comparator_api_format"):
        CompletionClient.from_config(_IterLikeConfig(comparator_api_url="http://h/x", comparator_api_format="gpt"))
    client.close()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(url="ftp://host/x"), "url \\(comparator_api_url\\)"),
        (dict(url="not a url"), "http:// or https://"),
        (dict(max_n_per_request=0), "max_n_per_request \\(comparator_api_max_n_per_request\\)"),
        (dict(timeout=0), "timeout \\(comparator_api_timeout\\)"),
        (dict(timeout=math.inf), "timeout"),
        (dict(max_retries=-1), "max_retries"),
        (dict(headers={"X": 1}), "headers \\(comparator_api_headers\\)"),
        (dict(extra_body={"x": object()}), "extra_body \\(comparator_api_extra_body\\)"),
        (dict(key_header=""), "key_header"),
    ],
)
def test_constructor_validation_names_the_argument(kwargs, message):
    kwargs = {"url": "http://127.0.0.1:9/x", **kwargs}
    with pytest.raises(ValueError, match=message):
        CompletionClient(kwargs.pop("url"), **kwargs)


@pytest.mark.parametrize(
    "call, message",
    [
        (dict(n=0), "n must be"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-2), "top_k"),
    ],
)
def test_call_validation_happens_before_any_request(call, message):
    client = CompletionClient("http://127.0.0.1:9/never", max_retries=0)  # nothing listens: no request may start
    arguments = {"n": 1, **SAMPLING, **call}
    with pytest.raises(ValueError, match=message):
        client.complete("p", arguments.pop("n"), **arguments)
    with pytest.raises(TypeError, match="prompts\\[0\\]"):
        client.complete_many([None], 1, **SAMPLING)


def test_the_documented_client_example_runs(server, monkeypatch, capsys):
    """docs/api-comparator.md's client example, with the local server in place of the vendor URL."""
    import os
    import re

    doc = os.path.join(REPO_ROOT, "docs", "api-comparator.md")
    with open(doc, encoding="utf-8") as handle:
        blocks = re.findall(r"```python\n(.*?)```", handle.read(), flags=re.S)
    (example,) = [block for block in blocks if "CompletionClient(" in block]
    vendor = "https://api.openai.com/v1/chat/completions"
    assert vendor in example
    server.route("/v1/chat/completions", lambda r: Reply(body={"choices": [
        {"message": {"content": f"{r.body['messages'][0]['content']}#{i}"}} for i in range(r.body["n"])]}))
    monkeypatch.setenv("OPENAI_API_KEY", "doc-key")
    namespace: dict = {}
    exec(compile(example.replace(vendor, server.url("/v1/chat/completions")), "api-comparator.md", "exec"), namespace)
    assert namespace["candidates"] == [f"Write a haiku about rain.#{i}" for i in (0, 1, 2, 3, 0, 1, 2, 3)]
    assert namespace["per_prompt"] == [["Name a fruit.#0", "Name a fruit.#1"], ["Name a city.#0", "Name a city.#1"]]
    assert sorted(r.body["n"] for r in server.requests) == [2, 2, 4, 4]
    assert {r.headers["authorization"] for r in server.requests} == {"Bearer doc-key"}
    assert capsys.readouterr().out.startswith("8 CompletionClient(openai at ")
