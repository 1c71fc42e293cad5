"""The README's quick start runs as written, with the tiny models substituted for its two model ids;
the README's set-up commands are the ones .ci/run and the package actually provide."""

from __future__ import annotations

import os
import re

import pytest
from tests.helpers.common import REPO_ROOT

ROOT = REPO_ROOT
README = os.path.join(ROOT, "README.md")


def section(title: str) -> str:
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def code_blocks(text: str, language: str):
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def substitute_models(code: str, replacements: dict) -> str:
    for name, path in replacements.items():
        pattern = rf'^{name} = "[^"]+"'
        assert re.search(pattern, code, flags=re.M), f"the quick start no longer defines {name}"
        code = re.sub(pattern, f"{name} = {path!r}", code, count=1, flags=re.M)
    return code


def test_quick_start_runs_with_tiny_models(tiny_paths, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    blocks = code_blocks(section("Quick start"), "python")
    assert len(blocks) == 1
    code = substitute_models(blocks[0], {"BRIEF_MODEL": tiny_paths["llama"], "DETAILED_MODEL": tiny_paths["gpt2"]})
    code = shrink(code, {"USE_HUB = False": "USE_HUB = True"})  # the two given models (as pasted: the embedded one)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme_quick_start"}
    exec(compile(code, "README.md quick start", "exec"), namespace)

    assert os.path.getsize(tmp_path / "runs" / "quickstart" / "metrics.jsonl") > 0
    for index, source in enumerate([tiny_paths["llama"], tiny_paths["gpt2"]]):
        first = tmp_path / "runs" / "quickstart" / "agents" / f"agent_{index}"
        again = tmp_path / "runs" / "quickstart-more" / "agents" / f"agent_{index}"
        assert AutoTokenizer.from_pretrained(str(first)).get_vocab() == AutoTokenizer.from_pretrained(source).get_vocab()
        before = AutoModelForCausalLM.from_pretrained(str(first)).state_dict()
        after = AutoModelForCausalLM.from_pretrained(str(again)).state_dict()
        assert any(not before[key].equal(after[key]) for key in before), f"agent_{index} did not change when training continued"
    # the continued trainer loaded its own tokenizers from the saved folders
    assert len(namespace["more"].tokenizers[0]) != len(namespace["more"].tokenizers[1])


def shrink(code: str, replacements: dict) -> str:
    for old, new in replacements.items():
        assert old in code, f"the quick start no longer contains {old!r}"
        code = code.replace(old, new)
    return code


@pytest.mark.slow
def test_quick_start_learns_on_the_embedded_model(embedded_model_dir, tmp_path, monkeypatch):
    """The quick start as written, on the only model a user without a hub has (both agents), with
    fewer epochs and tokens. Its chat-template formatters must make the model answer, so rewards
    differ within groups, every update has a non-zero gradient, and the saved agents moved.
    weight_decay=0 so that moving parameters means the gradient moved them."""
    import warnings

    import torch
    from safetensors.torch import load_file

    from comlrl.telemetry.signal import NoLearningSignalWarning

    block = code_blocks(section("Quick start"), "python")[0]
    code = substitute_models(block, {"BRIEF_MODEL": embedded_model_dir, "DETAILED_MODEL": embedded_model_dir})
    code = shrink(code, {
        "USE_HUB = False": "USE_HUB = True",  # BRIEF_MODEL / DETAILED_MODEL are the session's embedded model
        "num_train_epochs=2": "num_train_epochs=1",
        "max_new_tokens=48": "max_new_tokens=12",
        "config = MAGRPOConfig(": "config = MAGRPOConfig(weight_decay=0.0, logging_steps=1,",
        # The quick start drops its first trainer (two 135M agents with their AdamW states: ~3.3 GB) once
        # its agents are saved, before the second one loads them; without the collector's help, since no
        # cycle passes through a trainer's parts (tests/trainers/test_lifetime.py). Holding both took the
        # suite's peak memory to 12 GB (docs/testing.md, "Time and memory"). Its log stays for the checks.
        "\ndel trainer": "\nfirst_log = trainer.log_history\ndel trainer",
    })
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict = {"__name__": "readme_quick_start"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoLearningSignalWarning)
        exec(compile(code, "README.md quick start", "exec"), namespace)

    rows = [row for row in namespace["first_log"] if "agent_0/grad_norm" in row]
    assert rows, "no update was logged"
    for row in rows:
        assert row["frac_all_empty_groups"] < 1.0 and row["frac_reward_zero_std"] < 1.0
        assert row["agent_0/grad_norm"] > 0.0 and row["agent_1/grad_norm"] > 0.0
    original = load_file(os.path.join(embedded_model_dir, "model.safetensors"))
    for index in range(2):
        trained = load_file(str(tmp_path / "runs" / "quickstart" / "agents" / f"agent_{index}" / "model.safetensors"))
        moved = [key for key in original if key in trained and not torch.equal(original[key], trained[key])]
        assert len(moved) > len(original) // 2, f"agent_{index}: only {len(moved)} of {len(original)} tensors moved"


def test_set_up_commands_match_the_project():
    blocks = code_blocks(section("Set up"), "bash")
    assert len(blocks) == 2, "the set-up section must hold exactly two commands: the demo and the tests"
    demo, tests = (block.strip() for block in blocks)
    assert "pip install torch==2.13.0 &&" in demo and demo.index("torch==2.13.0") < demo.index("-e '.[test]'")
    assert demo.endswith(".venv/bin/comlrl demo")
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        assert 'comlrl = "comlrl.cli.main:main"' in handle.read()
    ci = os.path.join(ROOT, ".ci", "run")
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    with open(ci, encoding="utf-8") as handle:
        ci_text = handle.read()
    assert tests in ci_text, f".ci/run must run the README's test command {tests!r}"
    assert "torch==2.13.0" in ci_text


@pytest.mark.parametrize(
    "module, name",
    [("comlrl.trainers.reinforce", n) for n in ("MAGRPO", "MAREINFORCE", "MARLOO", "MAReMax")]
    + [("comlrl.trainers.actor_critic", n) for n in ("IAC", "MAAC")],
)
def test_documented_imports_exist(module, name):
    import importlib

    from comlrl.utils.reward_processor import RewardProcessors

    package = importlib.import_module(module)
    assert callable(getattr(package, f"{name}Config")) and callable(getattr(package, f"{name}Trainer"))
    assert f"`from {module} import {name}Config, {name}Trainer`" in section("API")
    assert callable(RewardProcessors.scale)
