"""``external.mode=expert_edits`` against a scripted HTTP server on 127.0.0.1 (never the internet): the
request the expert gets per provider, the next prompts built from its reply, failures (the documented
fallback, ``raise``, refused requests), checks before any model loads, key hygiene, and two runs of
``comlrl train`` with an expert that fails mid-run."""

from __future__ import annotations

import json
import logging
import os

import pytest
from tests.helpers.common import bundled_bf16_expected, no_signal_expected

from comlrl.adapters import CompletionClient
from comlrl.cli.main import main
from comlrl.envs import get_environment
from comlrl.envs.coding.expert import PROVIDERS, ExpertEditsError, ExpertRequestRefused, last_json_object, resolve_settings
from tests.helpers.local_http import Reply
from tests.adapters.test_completion_api import Sleeps, server  # noqa: F401 (the scripted 127.0.0.1 server fixture)

from tests.helpers.cli_runs import tiny

KEY = "sk-expert-Secret-0123456789"
ROW = {
    "task_id": "t/0",
    "prompt": 'import math\n\n\ndef add(a, b):\n    """Return a + b."""\n',
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n",
    "entry_point": "add",
}
AUX = "def aux(a, b):\n    return a + b"
MINUS = "def add(a, b):\n    result = aux(a, b)\n    return result - 1"
EDITS = {"aux": "def aux(a, b):\n    return a + b  # already right", "main": "def add(a, b):\n    return aux(a, b)"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "OPENAI_API_KEY",
                 "ANTHROPIC_API_KEY", "DEEPSEEK_API_KEY", "DASHSCOPE_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def openai_reply(content):
    return Reply(body={"choices": [{"message": {"role": "assistant", "content": content}}]})


def expert_env(server, monkeypatch, path="/chat/completions", key_env="DEEPSEEK_API_KEY", **options):
    monkeypatch.setenv(key_env, KEY)
    env = get_environment("humaneval", external_mode="expert_edits", expert_api_url=server.url(path), expert_api_key_env=key_env,
                          test_timeout_s=1.0, **options)
    env.rows.add([ROW])
    return env


def step(env, completions=(AUX, MINUS)):
    prompts = [f(ROW) for f in env.formatters]
    history = [[p] for p in prompts]
    responses = [[c] for c in completions]
    out = env.external_transition(prompt=ROW["prompt"], agent_completions=list(completions), num_agents=len(completions),
                                  prompt_history_per_agent=history, response_history_per_agent=responses)
    return out, prompts


# ----------------------------------------------------------------------------- request and next prompts


def test_deepseek_request_and_the_next_prompts(server, monkeypatch):
    reply = "Here are my edits.\n```json\n" + json.dumps(EDITS) + "\n```\nGood luck {with} that."
    server.script("/chat/completions", openai_reply(reply))
    env = expert_env(server, monkeypatch)
    (aux, main), prompts = step(env)
    (request,) = server.requests_to("/chat/completions")
    assert request.headers["authorization"] == f"Bearer {KEY}"
    text = request.body["messages"][0]["content"]
    # what the original sends: model, one user message, max_tokens 2048, temperature 0.3 (no n, no top_p)
    assert request.body == {"model": "deepseek-coder", "messages": [{"role": "user", "content": text}], "max_tokens": 2048,
                            "temperature": 0.3}
    # the problem, and the code combined as the reward combines it: the prompt's imports, aux, main
    assert ROW["prompt"] in text and f"The current code:\nimport math\n\n{AUX}\n\n{MINUS}" in text
    assert '"aux" and "main"' in text and "Unit tests" not in text  # the original sends no tests
    # each agent: its own history, then its part of the last JSON object of the reply
    assert "- Turn 1 prompt:\n" + prompts[0] in aux and "- Turn 1 response:\n" + AUX in aux and prompts[1] not in aux
    assert "Edits suggested by an expert reviewer:\n" + EDITS["aux"] + "\n" in aux
    assert "Edits suggested by an expert reviewer:\n" + EDITS["main"] + "\n" in main and EDITS["aux"] not in main
    assert aux.endswith("Revise your aux(...) accordingly. Output only the function code, nothing else.")
    assert main.endswith("Revise your add(...) accordingly. Output only the function code, nothing else.")
    assert env.formatters[1](ROW, external_prompts=main) == main and env.expert.requests == 1


def test_claude_and_qwen3_coder_requests(server, monkeypatch):
    server.script("/v1/messages", Reply(body={"content": [{"type": "text", "text": json.dumps({"aux": "", "main": "return a + b"})}]}))
    env = expert_env(server, monkeypatch, path="/v1/messages", key_env="ANTHROPIC_API_KEY", expert_model="claude-3-5-sonnet-20241022")
    (aux, main), _ = step(env)
    (request,) = server.requests_to("/v1/messages")
    # Claude: the anthropic format, no temperature (the provider's default, as in the original), x-api-key
    assert set(request.body) == {"model", "max_tokens", "messages"} and request.body["model"] == "claude-3-5-sonnet-20241022"
    assert request.headers["x-api-key"] == KEY and "authorization" not in request.headers and "anthropic-version" in request.headers
    assert "Edits suggested by an expert reviewer:\n(none)" in aux and "return a + b" in main  # an empty field: no edits
    server.script("/compatible-mode/v1/chat/completions", openai_reply('{"main": null, "aux": "x = 1"}'))
    env = expert_env(server, monkeypatch, path="/compatible-mode/v1/chat/completions", key_env="DASHSCOPE_API_KEY",
                     expert_model="qwen3-coder-plus", expert_max_tokens=512, expert_temperature=0.0)
    (aux, main), _ = step(env)
    (request,) = server.requests_to("/compatible-mode/v1/chat/completions")
    assert (request.body["model"], request.body["max_tokens"], request.body["temperature"]) == ("qwen3-coder-plus", 512, 0.0)
    assert "x = 1" in aux and "reviewer:\n(none)" in main  # null: no edits


def test_built_in_endpoints(monkeypatch):
    """The original's three providers, picked by the model name; their keys go only to their own URLs."""
    expected = {"claude-3-5-sonnet-20241022": ("https://api.anthropic.com/v1/messages", "anthropic", "ANTHROPIC_API_KEY", None),
                "deepseek-coder": ("https://api.deepseek.com/chat/completions", "openai", "DEEPSEEK_API_KEY", 0.3),
                "qwen3-coder": ("https://dashscope-intl.aliyuncs.com/compatible-mode/v1/chat/completions", "openai", "DASHSCOPE_API_KEY", 0.3)}
    for provider in PROVIDERS:
        monkeypatch.setenv(provider.key_env, KEY)
    base = dict(url=None, api_format=None, key_env=None, temperature=None, max_tokens=2048, timeout=120.0, attempts=3,
                on_failure="fallback", include_tests=False)
    for model, (url, api_format, key_env, temperature) in expected.items():
        s = resolve_settings(model=model, **base)
        assert (s.url, s.api_format, s.key_env, s.temperature) == (url, api_format, key_env, temperature)
    # another URL for a known model: no key unless one is named (the DeepSeek key is not sent elsewhere)
    s = resolve_settings(model="deepseek-chat", **{**base, "url": "http://127.0.0.1:9/v1/chat/completions"})
    assert (s.key_env, s.api_format, s.temperature) == (None, "openai", 0.3)


def test_single_agent_and_tests_in_the_request(server, monkeypatch):
    server.script("/chat/completions", openai_reply('{"main": "def add(a, b):\\n    return a + b"}'))
    env = expert_env(server, monkeypatch, num_agents=1, expert_include_tests=True)
    (nxt,), _ = step(env, completions=("def add(a, b):\n    return a - b",))
    text = server.requests[0].body["messages"][0]["content"]
    assert "one agent" in text and '"main"' in text and '"aux"' not in text and "def aux" not in text
    # the feedback asserts (sandbox_slice 1: the first) and how the code fared: 1 - 2 != 3
    assert "Unit tests and how the current code fared:\n- assert add(1, 2) == 3 -> failed: AssertionError" in text
    assert "aux" not in nxt and nxt.endswith("Revise your add(...) accordingly. Output only the function code, nothing else.")


def test_last_json_object():
    assert last_json_object('first {"aux": "a"} then {"aux": "b", "main": "c"} end') == {"aux": "b", "main": "c"}
    # braces inside strings belong to the object; a broken object is skipped
    assert last_json_object('{"main": "d = {\\"k\\": {}}"} {"aux": oops}') == {"main": 'd = {"k": {}}'}
    assert last_json_object("no object [1, 2] here") is None and last_json_object("") is None


def test_a_hostile_reply_is_read_in_bounded_time_and_its_edits_cleaned(server, monkeypatch):
    """The expert echoes what it was sent, so its reply is untrusted text too: nesting too deep for
    the JSON decoder is no object, a flood of braces costs linear time, only the first 256 KiB are
    read, and the edits enter the prompt without control or format characters, capped."""
    deep = '{"aux": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert last_json_object(deep) is None
    assert last_json_object("{" * 300_000) is None and last_json_object('{"a":' * 60_000) is None
    assert last_json_object("x" * (1 << 20) + json.dumps(EDITS)) is None  # past the part that is read
    assert last_json_object(json.dumps(EDITS) + "{" * (1 << 20)) == EDITS
    hostile = {"aux": "use\u202e reversed\x1b[2J\U000e0041 text\r\nnext line\x85end", "main": "m" * (1 << 17)}
    server.script("/chat/completions", openai_reply(json.dumps(hostile)))
    (aux, main), _ = step(expert_env(server, monkeypatch))
    assert "Edits suggested by an expert reviewer:\nuse reversed[2J text\nnext line\nend\n" in aux
    assert "m" * (64 * 1024) + "\n" in main and "m" * (64 * 1024 + 1) not in main


# ----------------------------------------------------------------------------- failures


def unavailable_client(server, path, sleeps):
    return CompletionClient(server.url(path), api_format="openai", model="deepseek-coder", api_key_env="DEEPSEEK_API_KEY",
                            extra_body={"n": None, "top_p": None}, sleep=sleeps, max_concurrency=1)


def test_unavailable_expert_falls_back_to_no_edits(server, monkeypatch, caplog):
    server.script("/chat/completions", Reply(503, {"error": f"overloaded, key {KEY}"}))
    env = expert_env(server, monkeypatch)
    sleeps = Sleeps()
    env.expert.client = unavailable_client(server, "/chat/completions", sleeps)
    with caplog.at_level(logging.WARNING):
        (aux, main), _ = step(env)
    # 3 attempts, each a first request plus the client's 4 retries after backoff
    assert len(server.requests) == 3 * 5 and len(sleeps) == 3 * 4
    assert "reviewer:\n(none)" in aux and "reviewer:\n(none)" in main and env.expert.fallbacks == 1
    assert "no edits from the expert 'deepseek-coder'" in caplog.text and "503" in caplog.text and KEY not in caplog.text


def test_a_reply_without_json_is_asked_again_then_raise_stops(server, monkeypatch):
    server.script("/chat/completions", openai_reply("I would rather not answer in JSON."))
    env = expert_env(server, monkeypatch, expert_on_failure="raise", expert_attempts=2)
    with pytest.raises(ExpertEditsError, match=r"no edits from the expert .* after 2 request\(s\) \(the reply holds no JSON object\)"):
        step(env)
    assert len(server.requests) == 2


def test_a_refused_request_stops_at_once_without_the_key(server, monkeypatch):
    server.script("/chat/completions", Reply(401, {"error": {"message": f"Invalid key {KEY}"}}))
    env = expert_env(server, monkeypatch)
    with pytest.raises(ExpertRequestRefused) as info:
        step(env)
    assert len(server.requests) == 1 and isinstance(info.value, ValueError)
    text = str(info.value) + repr(info.value.__cause__)
    assert "expert_edits" in text and "401" in text and KEY not in text


# ----------------------------------------------------------------------------- checks before loading


@pytest.fixture
def no_model_loads(monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded during resolution")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


CHECKS = [
    ([], r"reads its API key from \$DEEPSEEK_API_KEY, which is not set.*external\.expert_api_key_env"),
    (["external.expert_model=gpt-4o"], r"external\.expert_model='gpt-4o' matches no built-in expert endpoint.*external\.expert_api_url"),
    (["external.expert_api_url=http://127.0.0.1:9/x", "external.expert_api_format=opnai"], r"external\.expert_api_format must be one of"),
    (["external.expert_api_url=ftp://host/x"], r"external\.expert_api_url must be an http"),
    (["external.expert_on_failure=ignore"], r"external\.expert_on_failure must be one of fallback, raise"),
    (["external.expert_attempts=0"], r"external\.expert_attempts must be a positive integer"),
    ([f"external.expert_api_key={KEY}"], r"Unknown config key\(s\): external\.expert_api_key "),
]


@pytest.mark.parametrize("overrides, message", CHECKS)
def test_settings_are_checked_before_any_model_loads(overrides, message, no_model_loads, capsys):
    import re

    args = ["train", "--config", "magrpo_he_config.yaml", "--dry-run", "--override", "external.mode=expert_edits", *overrides]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert KEY not in err


def test_dry_run_with_the_key_set(no_model_loads, monkeypatch, capsys):
    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    assert main(["train", "--config", "grpo_he_config.yaml", "--dry-run", "--json", "--override", "external.mode=expert_edits",
                 "external.expert_api_url=http://user:pw@127.0.0.1:9/v1?api_key=abc", "external.expert_api_key_env=DEEPSEEK_API_KEY"]) == 0
    out = capsys.readouterr().out
    options = json.loads(out)["environment_options"]
    assert options["external_mode"] == "expert_edits" and options["expert_api_key_env"] == "DEEPSEEK_API_KEY"
    assert options["expert_api_url"] == "http://user:***@127.0.0.1:9/v1?api_key=***" and KEY not in out and "abc" not in out


# ----------------------------------------------------------------------------- comlrl train


# a bundled config: its models load in bfloat16 (as CoMLRL's), and the loader says so
@bundled_bf16_expected
def test_an_expert_that_refuses_mid_run_stops_the_run_with_a_clear_error(chat_models, server, monkeypatch, tmp_path, capsys):
    calls = []

    def route(request):
        calls.append(request)
        if len(calls) == 1:
            return openai_reply(json.dumps(EDITS))
        return Reply(400, {"error": {"message": f"model not found (key {KEY})"}})

    server.route("/chat/completions", route)
    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    overrides = [f"agent_model.name={chat_models['qwen']}", "magrpo.num_generations=2", "external.mode=expert_edits",
                 f"external.expert_api_url={server.url('/chat/completions')}", "external.expert_api_key_env=DEEPSEEK_API_KEY",
                 *tiny("magrpo", turns=2)]
    run = tmp_path / "run"
    assert main(["train", "--config", "magrpo_he_config.yaml", "--output-dir", str(run), "--override", *overrides]) == 2
    out, err = capsys.readouterr()
    assert "comlrl train: error: external.mode=expert_edits: the expert 'deepseek-coder'" in err and "400" in err
    assert len(calls) == 2 and "The current code:" in calls[0].body["messages"][0]["content"]  # one turn with edits, then refused
    assert KEY not in out + err
    for name in os.listdir(run):
        path = run / name
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), name


# tiny random models: all answers of a step may score alike, and the trainer says so
# a bundled config: its models load in bfloat16 (as CoMLRL's), and the loader says so
@no_signal_expected
@bundled_bf16_expected
def test_grpo_with_an_expert_that_never_answers_in_json_finishes(chat_models, server, monkeypatch, tmp_path, caplog):
    server.script("/chat/completions", openai_reply("no json today"))
    monkeypatch.setenv("MY_EXPERT_KEY", KEY)
    overrides = [f"agent_model.name={chat_models['llama']}", "grpo.num_generations=2", "external.mode=expert_edits",
                 "external.expert_model=local-coder", f"external.expert_api_url={server.url('/chat/completions')}",
                 "external.expert_api_key_env=MY_EXPERT_KEY", "external.expert_attempts=1", *tiny("grpo", turns=2)]
    with caplog.at_level(logging.WARNING, logger="comlrl.envs.coding.expert"):
        assert main(["train", "--config", "grpo_mbpp_config.yaml", "--output-dir", str(tmp_path / "run"), "--override", *overrides]) == 0
    assert server.requests and all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert all("one agent" in r.body["messages"][0]["content"] for r in server.requests)
    assert "this turn's prompts carry none" in caplog.text and KEY not in caplog.text
    rows = [json.loads(line) for line in open(tmp_path / "run" / "eval_rows.jsonl")]
    assert {row["turn"] for row in rows} == {1, 2}
