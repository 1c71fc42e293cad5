"""Credentials never reach disk: the masking rules of ``comlrl.telemetry.redaction``, and real runs
(an iterative trainer against a local HTTP comparator with W&B offline and checkpoints, and the
files ``comlrl train`` writes) whose every file is searched for each secret."""

import copy
import logging
import os
import shutil

import pytest
import yaml
from tests.helpers.common import length_ratio
from tests.helpers.local_http import LocalServer, Reply

from comlrl.telemetry.redaction import (
    MASK,
    is_secret_header,
    is_secret_name,
    redact_headers,
    redact_secrets,
    redact_text,
    redact_url,
)

# Each secret is distinct, so a hit names the route it leaked by.
URL_PASSWORD = "urlpw-Zq81xv"
QUERY_KEY = "querykey-Hh27Lm"
BEARER = "bearer-Kd93Tb"
CUSTOM_BEARER = "custom-Pw45Rc"
X_AUTH = "xauth-Vn62Js"
API_KEY = "sk-apikey-Ry39Qe"
SECRETS = (URL_PASSWORD, QUERY_KEY, BEARER, CUSTOM_BEARER, X_AUTH, API_KEY)


def files_holding(root, secrets):
    """``{path: [secret, ...]}`` of every file under ``root`` (binary ones too) holding a secret."""
    hits = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            found = [s for s in secrets if s.encode() in data]
            if found:
                hits[os.path.relpath(path, root)] = found
    return hits


# --------------------------------------------------------------------------- the rules


def test_secret_names_plurals_and_variants():
    secret = ["api_keys", "apiKeys", "secrets", "passwords", "auth", "x_auth", "X-Auth", "X-Auth-Token", "credentials",
              "creds", "private_key", "client_secret", "access_tokens", "Proxy-Authorization", "oauth_token", "cookies",
              "jwt", "session_token", "hf_token", "Authorization"]
    plain = ["max_new_tokens", "tokenizer", "pad_token", "eos_token", "comparator_api_key_env", "key_header",
             "comparator_api_key_prefix", "monkey", "author", "authors", "authority", "num_tokens", "sort_keys", "keys",
             "tokens", "special_tokens", "keyboard_layout", "token_file", "credential_path"]
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in plain if is_secret_name(n)] == []


def test_urls_keep_what_is_useful():
    url = "https://alice:pw0rd@api.example.com:8443/v1/chat?model=m&api_key=k1&apikey=k2&access_token=k3&sig=k4&n=2"
    assert redact_url(url) == (
        "https://alice:***@api.example.com:8443/v1/chat?model=m&api_key=***&apikey=***&access_token=***&sig=***&n=2"
    )
    assert redact_url("https://tok3n@h.example/x?key=a&token=b&Signature=c#access_token=d&state=s") == (
        "https://***@h.example/x?key=***&token=***&Signature=***#access_token=***&state=s"
    )
    # other parameters are kept byte for byte (no re-encoding), a URL without credentials is unchanged
    plain = "http://127.0.0.1:8000/v1?q=a%20b+c&token_type=bearer&max_tokens=5"
    assert redact_url(plain) == plain
    assert redact_text(f"failed: POST {url} (HTTP 500)") == f"failed: POST {redact_url(url)} (HTTP 500)"


def test_headers_by_name_or_by_value():
    headers = {"Authorization": "Bearer a1", "Proxy-Authorization": "Basic dXNlcjpwdw==", "X-Auth": "a2",
               "X-Auth-Token": "a3", "X-Session-Token": "a4", "X-Api-Key": "a5", "X-Custom": "Bearer a6",
               "X-Other": "token a7", "Accept": "application/json", "X-Request-Source": "comlrl"}
    assert [n for n, v in headers.items() if is_secret_header(n, v)] == list(headers)[:8]
    assert redact_headers(headers) == {**{n: MASK for n in list(headers)[:6]}, "X-Custom": "Bearer ***",
                                       "X-Other": "token ***", "Accept": "application/json", "X-Request-Source": "comlrl"}
    assert redact_headers(headers, drop=True) == {"Accept": "application/json", "X-Request-Source": "comlrl"}


def test_values_are_masked_whatever_their_field_and_the_input_is_kept():
    config = {
        "endpoint": "https://u:pass-4471@h.example/v1?key=qk-9921&model=m",  # not named *_url
        "notes": ["see https://tk-55123@h.example/docs", "Basic arithmetic"],
        "comparator_api_headers": {"Authorization": "Bearer ab-77123", "X-Custom": "Bearer cd-88123"},
        "comparator_api_key": "sk-1230984", "comparator_api_key_env": "OPENAI_API_KEY",
        "copied": "the key sk-1230984 again",  # a credential recurring under an innocent name
        "secrets": {"a": "s-1"}, "auth": False, "max_new_tokens": 8, "pad_token": "<pad>", "authors": ["Ann"],
    }
    original = copy.deepcopy(config)
    masked = redact_secrets(config)
    assert config == original  # never mutated: the trainer still needs the real values
    assert masked == {
        "endpoint": "https://u:***@h.example/v1?key=***&model=m",
        "notes": ["see https://***@h.example/docs", "Basic arithmetic"],
        "comparator_api_headers": {"Authorization": MASK, "X-Custom": "Bearer ***"},
        "comparator_api_key": MASK, "comparator_api_key_env": "OPENAI_API_KEY", "copied": "the key *** again",
        "secrets": MASK, "auth": False, "max_new_tokens": 8, "pad_token": "<pad>", "authors": ["Ann"],
    }
    dropped = redact_secrets(config, drop=True)
    assert "comparator_api_key" not in dropped and "secrets" not in dropped
    assert dropped["endpoint"] == masked["endpoint"] and dropped["comparator_api_headers"] == {"X-Custom": "Bearer ***"}


# --------------------------------------------------------------------------- a real run


def secret_api_settings(server):
    """Comparator settings carrying every kind of credential, pointed at ``server``'s /v1/gen."""
    base = server.url("/v1/gen").replace("http://", f"http://alice:{URL_PASSWORD}@")
    return dict(
        comparator_policy="api", comparator_api_format="generic", comparator_num_candidates=2,
        comparator_api_url=f"{base}?api_key={QUERY_KEY}&model=local",
        comparator_api_headers={"X-Custom": f"Bearer {CUSTOM_BEARER}", "X-Auth": X_AUTH, "Accept-Language": "en"},
        comparator_api_key=API_KEY, comparator_api_key_header="X-Api-Key", comparator_api_key_prefix=None,
    )


def test_an_api_comparator_run_writes_no_secret(tiny_paths, prompts_dataset, tmp_path, monkeypatch, caplog):
    pytest.importorskip("wandb")
    from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    caplog.set_level(logging.DEBUG)
    with LocalServer() as server:
        replies = iter([Reply(503, "busy")])  # one retry: the client logs a warning naming the URL
        server.route("/v1/gen", lambda r: next(replies, None) or Reply(
            body={"completions": [f"reply {i} " * (i + 1) for i in range(r.body["num_return_sequences"])]}))
        args = MADPOIterConfig(num_iterations=1, preference_num_candidates=2, max_new_tokens=4, verbose=False,
                               agent_learning_rate=1e-3, eval_interval=0, weight_decay=0.0, logging_steps=1,
                               output_dir=str(tmp_path / "run"), preference_replay_dir=str(tmp_path / "replay"),
                               **secret_api_settings(server))
        wandb_config = {"project": "secrets-test", "mode": "offline", "dir": str(tmp_path / "wandb"),
                        "config_sections": {"comparator": {"url": args.comparator_api_url, "headers": args.comparator_api_headers}}}
        trainer = MADPOIterTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio,
                                   train_dataset=prompts_dataset, args=args, wandb_config=wandb_config)
        trainer.train(checkpoint_dir=str(tmp_path / "ckpts"))
        trainer.save_model(str(tmp_path / "final"))
    (tmp_path / "log.txt").write_text(caplog.text + "\n" + "\n".join(r.getMessage() for r in caplog.records))
    # the run really used every credential: the server saw each of them
    sent = [r for r in server.requests if r.path == "/v1/gen"]
    assert len(sent) > 1
    assert {r.headers.get("x-api-key") for r in sent} == {API_KEY}
    assert {r.headers.get("x-custom") for r in sent} == {f"Bearer {CUSTOM_BEARER}"}
    assert {r.headers.get("x-auth") for r in sent} == {X_AUTH}
    assert all(f"api_key={QUERY_KEY}" in r.query for r in sent)
    assert all(r.headers.get("authorization", "").startswith("Basic ") for r in sent)  # alice:<password> from the URL
    assert "retry 1 of" in caplog.text  # the warning was logged (and must not carry the URL's credentials)
    assert args.comparator_api_key == API_KEY and URL_PASSWORD in args.comparator_api_url  # the live config is intact
    written = [os.path.join(d, n) for d, _, names in os.walk(tmp_path) for n in names]
    assert any(p.endswith("run_config.json") for p in written) and any(p.endswith("manifest.json") for p in written)
    assert any(p.endswith(".wandb") for p in written)  # the offline W&B run file
    assert files_holding(tmp_path, SECRETS) == {}
    # masked, not dropped: the record still says where the comparator was and which parameters it had
    record = (tmp_path / "run" / "run_config.json").read_text()
    assert f"alice:***@127.0.0.1:{server.url('').rsplit(':', 1)[1]}/v1/gen?api_key=***&model=local" in record
    assert '"X-Custom": "Bearer ***"' in record and '"Accept-Language": "en"' in record


# --------------------------------------------------------------------------- comlrl train


def cli_overrides():
    return [
        "madpo_iter.comparator_policy=api",
        f"madpo_iter.comparator_api_url=https://alice:{URL_PASSWORD}@api.example.com/v1/gen?api_key={QUERY_KEY}&model=m",
        f"madpo_iter.comparator_api_headers={{'Authorization': 'Bearer {BEARER}', 'X-Custom': 'Bearer {CUSTOM_BEARER}', "
        f"'X-Auth': '{X_AUTH}'}}",
        f"madpo_iter.comparator_api_key={API_KEY}",
    ]


def test_comlrl_train_config_files_and_dry_run_hold_no_secret(tmp_path, monkeypatch, capsys):
    from comlrl.cli import train as train_cli
    from comlrl.cli.main import main
    from comlrl.runplan.plan import plan_from_args

    overrides, run_dir = [*cli_overrides(), "dataset.offline=true"], str(tmp_path / "run")
    assert main(["train", "--config", "madpo_iter_che_config.yaml", "--dry-run", "--output-dir", run_dir,
                 *[a for o in overrides for a in ("--override", o)]]) == 0
    printed = capsys.readouterr().out
    plan = plan_from_args("madpo_iter_che_config.yaml", overrides, output_dir=run_dir)
    assert plan.config.comparator_api_key == API_KEY and plan.config.comparator_api_headers["X-Auth"] == X_AUTH

    def stop(*_args, **_kwargs):  # keep what the run wrote before its models would load (a run failing there removes it)
        shutil.copytree(tmp_path / "run", tmp_path / "written")
        raise RuntimeError("stop before loading models")

    monkeypatch.setattr(train_cli, "build", stop)
    with pytest.raises(RuntimeError, match="stop before"):
        train_cli.run(plan, log=lambda _line: None)
    (tmp_path / "dry_run.yaml").write_text(printed)
    assert sorted(os.listdir(tmp_path / "written")) == ["config.yaml", "resolved_config.yaml"]
    assert files_holding(tmp_path, SECRETS) == {}
    for name in ("config.yaml", "resolved_config.yaml"):
        text = (tmp_path / "written" / name).read_text()
        assert "https://alice:***@api.example.com/v1/gen?api_key=***&model=m" in text, name
    resolved = yaml.safe_load((tmp_path / "written" / "resolved_config.yaml").read_text())
    fields = resolved["config"]["MADPOIterConfig"]
    assert fields["comparator_api_headers"] == {"Authorization": MASK, "X-Custom": "Bearer ***", "X-Auth": MASK}
    assert plan.config.comparator_api_key == API_KEY  # writing the files changed nothing in the plan


def test_a_failed_runs_error_text_is_masked_in_run_summary(tmp_path):
    from comlrl.telemetry.run_record import RunRecord

    record = RunRecord(str(tmp_path))
    record._started = None
    error = RuntimeError(f"POST https://alice:{URL_PASSWORD}@h.example/v1?api_key={QUERY_KEY} failed")
    record.finish(error=error, models=[], progress={}, history=[])
    assert files_holding(tmp_path, SECRETS) == {}
    assert "https://alice:***@h.example/v1?api_key=*** failed" in (tmp_path / "run_summary.json").read_text()


def test_the_wandb_run_config_is_scrubbed_as_a_whole():
    from comlrl.telemetry.wandb_sink import wandb_init_kwargs

    run_config = {"comparator_url": f"https://alice:{URL_PASSWORD}@h.example/v1?model=m", "api_keys": [API_KEY]}
    sections = {"judge": {"headers": {"X-Custom": f"Bearer {CUSTOM_BEARER}", "X-Auth": X_AUTH}}}
    kwargs = wandb_init_kwargs({"project": "p", "config_sections": sections}, run_config)
    assert kwargs["config"] is run_config  # the caller's dict, as in 1.4.x
    assert run_config == {"comparator_url": "https://alice:***@h.example/v1?model=m",
                          "judge": {"headers": {"X-Custom": "Bearer ***"}}}
    assert sections["judge"]["headers"]["X-Auth"] == X_AUTH  # the sections themselves are not modified


def test_the_http_clients_texts_hold_no_credential(caplog):
    import pickle

    from comlrl.adapters.completion_api import CompletionAPIRequestError, CompletionClient

    caplog.set_level(logging.DEBUG)
    with LocalServer() as server:
        echo = lambda r: Reply(400, {"error": f"bad request {r.headers} {r.query}"})  # noqa: E731 (a server that echoes)
        server.route("/v1/gen", echo)
        settings = secret_api_settings(server)
        client = CompletionClient(settings["comparator_api_url"], headers=settings["comparator_api_headers"],
                                  api_key=API_KEY, key_header="X-Api-Key", key_prefix=None, sleep=lambda _s: None)
        with pytest.raises(CompletionAPIRequestError) as raised:
            client.complete("p", 2, max_new_tokens=4, temperature=0.7, top_p=0.9)
        texts = [str(raised.value), raised.value.url, repr(client), str(client.to_dict()), caplog.text]
        with pytest.warns(UserWarning, match="without the credentials"):
            restored = pickle.loads(pickle.dumps(client))
        client.close()
    assert X_AUTH in str(server.requests[0].headers) and CUSTOM_BEARER in str(server.requests[0].headers)  # echoed
    assert "bad request" in texts[0] and [s for s in SECRETS if any(s in text for text in texts)] == []
    assert "X-Custom" not in restored._headers and "X-Auth" not in restored._headers and URL_PASSWORD not in restored.url
    assert client.headers == {"X-Custom": "Bearer ***", "X-Auth": MASK, "Accept-Language": "en"}
