"""No silent data substitution: the bundled sample replaces the real data only when asked for, splits
are honoured offline or refused, and an empty dataset is refused before any model loads."""

from __future__ import annotations

import json
import os

import pytest
from tests.helpers.common import no_signal_expected
import yaml

from comlrl.cli.main import main
from comlrl.envs import get_environment

import comlrl.envs.sources as sources


@pytest.fixture
def no_network(monkeypatch):
    def unreachable(name, split_expression):
        raise ConnectionError(f"cannot reach the hub for {name}")

    monkeypatch.setattr(sources, "load_real", unreachable)
    sources._NOTICES.clear()


@pytest.fixture
def no_models(monkeypatch):
    """Any model load fails the test (the checks must come first)."""
    import comlrl.cli.train as train_cli

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the check")

    monkeypatch.setattr(train_cli, "resolve_model_names", refuse)


def test_real_data_that_cannot_load_is_an_error_not_the_sample(no_network):
    env = get_environment("tldr")
    with pytest.raises(ValueError) as info:
        env.load_dataset("train")
    message = str(info.value)
    assert "trl-lib/tldr" in message and "train[:1100]" in message
    assert "offline=True" in message and "allow_sample_fallback=True" in message


def test_the_fallback_happens_when_allowed_prints_once_and_is_recorded(no_network, capsys):
    env = get_environment("tldr")
    train = env.load_dataset("train", allow_sample_fallback=True)
    evaluation = env.load_dataset("eval", allow_sample_fallback=True)
    notices = [line for line in capsys.readouterr().err.splitlines() if "bundled sample" in line]
    assert len(notices) == 1 and "allow_sample_fallback" in notices[0]
    assert env.data_sources["train"]["sample_fallback"] is True and env.data_sources["train"]["rows"] == len(train)
    assert env.data_sources["eval"]["rows"] == len(evaluation) > 0
    assert "ConnectionError" in env.data_sources["train"]["fallback_reason"]


def test_offline_splits_are_honoured_or_refused():
    env = get_environment("tldr")
    everything = len(env.load_dataset("train", True))
    assert everything > 2
    assert len(env.load_dataset("train", True, hf_split="train[:1100]")) == everything  # the original slice: the whole sample
    assert len(env.load_dataset("train", True, hf_split="[:1]")) == 1
    assert len(env.load_dataset("train", True, hf_split="train[:2]")) == 2
    assert env.data_sources["train"] == {"source": "bundled sample (tldr.json)", "split": "[:2]", "sample_fallback": False, "rows": 2}
    with pytest.raises(ValueError, match=r"training data is empty: split '\[:0\]'"):
        env.load_dataset("train", True, hf_split="[:0]")
    with pytest.raises(ValueError, match=r"dataset.train_split='train\[10%:\]' cannot be applied to the bundled tldr sample"):
        env.load_dataset("train", True, hf_split="train[10%:]")


def test_cli_without_network_refuses_before_loading_and_leaves_nothing(no_network, no_models, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(run), "--override", "agent_model.name=default"])
    err = capsys.readouterr().err
    assert code == 2 and "Could not load the tldr dataset" in err and "dataset.allow_sample_fallback=true" in err
    assert not run.exists() or os.listdir(run) == []


@pytest.mark.parametrize("split", ["'[:0]'", "[:0]"])
def test_cli_offline_empty_split_is_refused_before_loading(no_models, tmp_path, capsys, split):
    run = tmp_path / "run"
    code = main(["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--output-dir", str(run), "--override",
                 "agent_model.name=default", f"dataset.train_split={split}"])
    assert code == 2 and "training data is empty" in capsys.readouterr().err
    assert not run.exists() or os.listdir(run) == []


def test_python_api_refuses_an_empty_dataset_before_loading(monkeypatch):
    from datasets import Dataset

    import comlrl.trainers.reinforce.magrpo as magrpo
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    monkeypatch.setattr(magrpo, "load_agents", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    full = Dataset.from_dict({"prompt": ["a", "b"]})
    with pytest.raises(ValueError, match="train_dataset has no rows"):
        MAGRPOTrainer(agents=["/x/a", "/x/b"], reward_func=lambda a, b: [0.0] * len(a), args=MAGRPOConfig(num_turns=1),
                      train_dataset=full.filter(lambda row: False))


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_the_run_records_the_rows_it_used(chat_models, no_network, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(run), "--override",
                 f"agent_model.name={chat_models['llama']}", "dataset.allow_sample_fallback=true", "dataset.num_train_items=2",
                 "dataset.num_eval_items=1", "magrpo.num_train_epochs=1", "magrpo.max_new_tokens=4", "magrpo.num_generations=2",
                 "magrpo.eval_interval=0", "output.verbose=false", "output.save_final_model=false"]) == 0
    resolved = yaml.safe_load((run / "resolved_config.yaml").read_text())
    assert resolved["data"]["train"]["sample_fallback"] is True and resolved["data"]["train"]["rows"] == 2
    recorded = json.loads((run / "run_config.json").read_text())
    assert recorded["data"]["train"]["rows"] == 2 and recorded["data"]["train"]["source"].startswith("bundled sample")
