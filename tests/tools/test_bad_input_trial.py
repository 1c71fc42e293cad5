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
