"""tools/bad_input_trial.py classifies messages as documented (a few cases, end to end)."""

from __future__ import annotations

import importlib.util
import os
import sys
from tests.helpers.common import REPO_ROOT

ROOT = REPO_ROOT


def load_trial():
    spec = importlib.util.spec_from_file_location("bad_input_trial", os.path.join(ROOT, "tools", "bad_input_trial.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_classes(tmp_path, tiny_paths, monkeypatch):
    from transformers import modeling_utils

    # the trial counts model loads by wrapping from_pretrained: undone after this test
    monkeypatch.setattr(modeling_utils.PreTrainedModel, "from_pretrained", modeling_utils.PreTrainedModel.__dict__["from_pretrained"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    trial = load_trial()
    context = trial.Context(str(tmp_path), tiny_paths, {"llama": tiny_paths["llama"]})
    trial.count_model_loads(context)

    def raw(ctx):
        return {}["missing"]

    def late(ctx):
        from transformers import AutoModelForCausalLM

        from comlrl.trainers.reinforce import MAGRPOConfig

        AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
        MAGRPOConfig(num_turns=1, num_generations=1)  # comlrl's own clean error, but after a model loaded

    cases = [trial.Case("a", "python", "accepted", ["x"], lambda ctx: None),
             trial.Case("b", "python", "raw", ["x"], raw),
             trial.Case("c", "python", "late", ["num_generations"], late),
             trial.Case("d", "cli", "typo", ["num_generation"], trial.cli(overrides=["magrpo.num_generation=4"]))]
    verdicts = [trial.run_case(case, context).verdict for case in cases]
    assert verdicts == ["poor", "poor", "fair", "good"]
    assert len(trial.cli_cases()) + len(trial.python_cases()) >= 80


def test_accept_cases_must_run_through_and_say_what_they_did(tmp_path, tiny_paths, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    trial = load_trial()
    context = trial.Context(str(tmp_path), tiny_paths, {"llama": tiny_paths["llama"]})

    def says(ctx):
        print("converted the DataFrame")

    def refuses(ctx):
        raise ValueError("no DataFrames")

    cases = [trial.Case("a", "python", "handled", ["converted"], says, accept=True),
             trial.Case("b", "python", "handled", ["assumed"], says, accept=True),
             trial.Case("c", "python", "handled", ["converted"], refuses, accept=True)]
    assert [trial.run_case(case, context).verdict for case in cases] == ["good", "fair", "poor"]


def test_the_newcomer_cases_cover_issue_31_and_the_quick_ones_are_good(tmp_path, tiny_paths, chat_models, monkeypatch):
    from transformers import modeling_utils

    monkeypatch.setattr(modeling_utils.PreTrainedModel, "from_pretrained", modeling_utils.PreTrainedModel.__dict__["from_pretrained"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    trial = load_trial()
    from bad_input_cases import newcomer_cases

    cases = {case.id: case for case in newcomer_cases(trial)}
    assert len(cases) >= 28 and len(trial.cli_cases()) + len(trial.python_cases()) + len(cases) >= 118
    mistakes = " ".join(case.mistake for case in cases.values())
    for topic in ("verbose", "truncated model.safetensors", "DataFrame", "longer than", "read-only", "--num-agents 0",
                  "full disk at a checkpoint", "full disk during save_model", "learning rate as text", "None prompt",
                  "reward function raises", "KeyError", "save_model(None)", "override key twice", "dataset.offline=false",
                  "--out x.txt", "maac without a critic", "unknown model id", "another reward function", "without tokenizer"):
        assert topic in mistakes, topic
    context = trial.Context(str(tmp_path), tiny_paths, chat_models)
    trial.count_model_loads(context)
    quick = ["py-41", "py-42", "py-43", "py-44", "py-49", "py-51", "py-52", "py-55", "cli-52", "cli-55", "cli-56", "cli-57", "cli-59"]
    outcomes = {name: trial.run_case(cases[name], context) for name in quick}
    assert {name: (o.verdict, o.why) for name, o in outcomes.items()} == {name: ("good", "") for name in quick}
