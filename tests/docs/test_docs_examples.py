"""The documented ``comlrl train`` commands and environment examples run as written (models substituted).

README: the pasted commands resolve (``--dry-run``, their hub models are not loaded); the offline demos
(README's and docs/environments.md's) run end to end with the embedded model ("default") replaced by a
tiny local chat model.
docs/environments.md: every Python block runs; docs/preference.md: its example runs.
"""

from __future__ import annotations

import os
import re
import shlex

import pytest
from tests.helpers.common import REPO_ROOT, bundled_bf16_expected, no_signal_expected

from comlrl.cli.main import main

ROOT = REPO_ROOT


def read(relative):
    with open(os.path.join(ROOT, relative), encoding="utf-8") as handle:
        return handle.read()


def readme_section():
    text = read("README.md")
    match = re.search(r"^## Train from a config.*?$(.*?)(?=^## )", text, flags=re.M | re.S)
    assert match, "README.md lost its '## Train from a config' section"
    return match.group(1)


def commands(block_language, text=None):
    blocks = re.findall(rf"```{block_language}\n(.*?)```", readme_section() if text is None else text, flags=re.S)
    lines = [line for block in blocks for line in block.splitlines() if line.startswith("comlrl train ")]
    assert lines
    return [shlex.split(line)[1:] for line in lines]


def demo_commands():
    """The offline demos: README's, and those of docs/environments.md (ClassEval's)."""
    return commands("bash") + commands("bash", read("docs/environments.md"))


@pytest.mark.parametrize("argv", commands("text"), ids=lambda a: a[2])
def test_pasted_commands_resolve(argv, capsys):
    assert main([*argv, "--dry-run", "--json"]) == 0
    assert '"trainer"' in capsys.readouterr().out


@pytest.mark.parametrize("argv", commands("bash", read("docs/environments.md")), ids=lambda a: a[2])
def test_environment_demo_commands_resolve(argv, capsys):
    assert main([*argv, "--dry-run", "--json"]) == 0
    assert '"trainer"' in capsys.readouterr().out


# tiny random models: all answers of a step may score alike, and the trainer says so
# a bundled config: its models load in bfloat16 (as CoMLRL's), and the loader says so
@no_signal_expected
@bundled_bf16_expected
@pytest.mark.slow
@pytest.mark.parametrize("argv", demo_commands(), ids=lambda a: a[2])
def test_offline_demos_run(argv, chat_models, tmp_path, monkeypatch):
    import comlrl.models.default_model

    monkeypatch.setattr(comlrl.models.default_model, "default_model_dir", lambda **_: chat_models["qwen"])
    argv = list(argv)
    argv[argv.index("--output-dir") + 1] = str(tmp_path / "run")
    assert "agent_model.name=default" in argv
    argv += ["output.verbose=false"]
    assert main(argv) == 0
    for name in ("resolved_config.yaml", "metrics.jsonl", "eval_rows.jsonl", "reward_curve.png"):
        assert os.path.exists(tmp_path / "run" / name)
    assert os.path.exists(tmp_path / "run" / "agent_1" / "config.json")


def python_blocks():
    blocks = re.findall(r"```python\n(.*?)```", read("docs/environments.md"), flags=re.S)
    assert blocks
    return blocks


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_environment_doc_examples_run(index, chat_models, tmp_path, monkeypatch):
    """Every example as written, except that one training on the embedded SmolLM2-135M trains the tiny
    chat llama instead (same chat template path): two 135M agents took 3.3 GB and minutes of CPU, up to
    the 600 s limit on shared cores. The embedded model trains in test_readme's quick start (slow)."""
    import comlrl.envs.base

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(comlrl.envs.base, "_REGISTRY", dict(comlrl.envs.base._REGISTRY))  # an example may register a task
    block = python_blocks()[index].replace("default_model_dir()", repr(chat_models["llama"]))
    exec(compile(block, f"docs/environments.md block {index}", "exec"), {"__name__": "docs_example"})


def test_preference_guide_example_runs(chat_models, tmp_path, monkeypatch):
    """docs/preference.md's first run, with its hub model replaced by a tiny local chat model."""
    (block,) = re.findall(r"```python\n(.*?)```", read("docs/preference.md"), flags=re.S)
    line = 'MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"'
    assert line in block
    monkeypatch.chdir(tmp_path)
    scope = {"__name__": "docs_example"}
    exec(compile(block.replace(line, f"MODEL = {chat_models['llama']!r}"), "docs/preference.md", "exec"), scope)
    trainer = scope["trainer"]
    assert trainer.preference_pairs  # the example's reward separates the tiny model's answers
    assert any("madpo/loss" in row for row in trainer.log_history)
    assert (tmp_path / "runs/madpo-first/final/agent_1/config.json").is_file()
    assert (tmp_path / "runs/madpo-first/metrics.jsonl").is_file()
