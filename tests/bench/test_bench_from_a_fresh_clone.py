"""bench/ runs from a fresh clone: no machine path in a committed bench or tool file (recorded results
included), every default inside the repository, and the bench models built by bench/bench_models.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess

import pytest

from tests.helpers.common import REPO_ROOT

MACHINE_PATH = re.compile(r"(?<![\w.])/(work|root|home|tmp)/")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, *path.split("/")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed(folder):
    listed = subprocess.run(["git", "ls-files", folder], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    return listed.split()


@pytest.mark.parametrize("folder", ["bench", "tools"])
def test_no_committed_bench_or_tool_file_names_a_machine_path(folder):
    found = []
    for name in committed(folder):
        with open(os.path.join(REPO_ROOT, name), encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                if MACHINE_PATH.search(line):
                    found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_bench_results_record_paths_without_the_machine_s_folders(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(os.path.join(REPO_ROOT, "bench"))
    common = load("bench_common_emit", "bench/bench_common.py")
    result = {"implementation": {"module_file": "/opt/venvs/base/lib/python3.11/site-packages/comlrl/__init__.py"},
              "config": {"models": [os.path.join(REPO_ROOT, "bench", "models", "tiny-llama"), "/srv/models/tiny-hetero"],
                         "reward_model": "relative/models/rm", "seed": 3, "temperature": 0.6}}
    out = tmp_path / "results.jsonl"
    common.emit(result, str(out))
    written = json.loads(out.read_text())
    assert written == {"implementation": {"module_file": "site-packages/comlrl/__init__.py"},
                       "config": {"models": [os.path.join("bench", "models", "tiny-llama"), ".../models/tiny-hetero"],
                                  "reward_model": "relative/models/rm", "seed": 3, "temperature": 0.6}}
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == written


def test_the_learning_sweep_runs_the_repository_s_own_script(monkeypatch):
    learning = load("learning_bench_paths", "bench/learning.py")
    monkeypatch.delenv("BENCH_SCRIPT", raising=False)
    script = learning.default_bench_script()
    assert script == os.path.join(REPO_ROOT, "bench", "magrpo_bench.py") and os.path.isfile(script)
    monkeypatch.setenv("BENCH_SCRIPT", "elsewhere.py")
    assert learning.default_bench_script() == "elsewhere.py"


def test_bench_models_default_inside_the_repository_and_build(tmp_path, monkeypatch, embedded_model_dir):
    monkeypatch.syspath_prepend(os.path.join(REPO_ROOT, "bench"))
    models = load("bench_models_paths", "bench/bench_models.py")
    monkeypatch.delenv("BENCH_MODELS", raising=False)
    assert models.models_dir() == os.path.join(REPO_ROOT, "bench", "models")
    monkeypatch.setattr(models, "build_smollm2", lambda folder: os.symlink(embedded_model_dir, folder))
    root = models.ensure_models(str(tmp_path / "models"))
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(os.path.join(root, "tiny-llama")).model_type == "llama"
    assert AutoConfig.from_pretrained(os.path.join(root, "tiny-hetero")).model_type == "gpt2"
    llama_vocab = AutoTokenizer.from_pretrained(os.path.join(root, "tiny-llama")).get_vocab()
    assert llama_vocab == AutoTokenizer.from_pretrained(embedded_model_dir).get_vocab()  # SmolLM2's tokenizer
    assert llama_vocab != AutoTokenizer.from_pretrained(os.path.join(root, "tiny-hetero")).get_vocab()


def test_bench_common_names_the_builder_when_the_models_are_missing(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO_ROOT, "bench"))
    monkeypatch.setenv("BENCH_MODELS", str(tmp_path / "none"))
    common = load("bench_common_paths", "bench/bench_common.py")
    args = common.build_arg_parser("bench").parse_args([])
    with pytest.raises(SystemExit, match=r"python bench/bench_models.py"):
        common.resolve_models(args)
