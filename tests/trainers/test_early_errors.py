"""Mistakes a newcomer makes are named before slow work: a dataset without prompts, a local path that
does not exist, a one-argument reward for two agents, `comlrl demo --model /nope`."""

from __future__ import annotations

import os

import pytest
from datasets import Dataset

from comlrl.cli.main import main
from comlrl.models.sources import SourceNotFoundError, check_source_exists, looks_like_path
from comlrl.rollout.rewards import RewardFunction
from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.common import length_ratio

MISSING = "/nonexistent/comlrl-model"


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if any model or tokenizer starts loading."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded before the error")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


def magrpo(**kwargs):
    return MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=4, eval_interval=0, **kwargs)


@pytest.mark.parametrize("trainer", ["magrpo", "iac"])
def test_dataset_without_prompt_column_is_refused_before_loading(no_loading, tiny_paths, trainer):
    data = Dataset.from_dict({"question": ["What is 2+2?"], "answer": ["4"]})
    with pytest.raises(ValueError) as info:
        if trainer == "magrpo":
            MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=data, args=magrpo())
        else:
            IACTrainer(agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
                       train_dataset=data, args=IACConfig(num_turns=1, num_agents=2))
    message = str(info.value)
    assert "train_dataset has no 'prompt' column (its rows have ['answer', 'question'])" in message
    assert "formatters=[...]" in message


def test_empty_prompt_in_eval_dataset_is_refused(no_loading, tiny_paths, prompts_dataset):
    with pytest.raises(ValueError, match=r"eval_dataset has an empty or non-text 'prompt' in its first row \(''\)"):
        MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                      eval_dataset=Dataset.from_dict({"prompt": [""]}), args=magrpo())


def test_formatters_lift_the_prompt_requirement(tiny_paths):
    data = Dataset.from_dict({"question": ["What is 2+2?", "Name a colour."]})
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=data,
                            formatters=lambda row: row["question"], args=magrpo(num_train_epochs=1, verbose=False))
    trainer.train()
    assert trainer.env_step == 4


@pytest.mark.parametrize(
    "name, is_path",
    [("/abs/model", True), ("./model", True), ("../model", True), ("~/model", True), ("a/b/c", True), ("model/", True),
     ("dir\\model", True), ("gpt2", False), ("HuggingFaceTB/SmolLM2-135M-Instruct", False)],
)
def test_what_counts_as_a_local_path(name, is_path):
    assert looks_like_path(name) is is_path


def test_a_hub_id_inside_an_existing_folder_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not looks_like_path("runs/agent_0")
    (tmp_path / "runs").mkdir()
    assert looks_like_path("runs/agent_0")  # its parent exists here: a path, partly typed right
    with pytest.raises(SourceNotFoundError, match="'runs/agent_0' does not exist"):
        check_source_exists("runs/agent_0", "agents[0]")


@pytest.mark.parametrize(
    "build",
    [
        lambda p: MAGRPOTrainer(agents=[p["llama"], MISSING], tokenizer=[p["llama"], p["llama"]], reward_func=length_ratio, args=magrpo()),
        lambda p: MAGRPOTrainer(agent_model=p["llama"], num_agents=2, tokenizer=MISSING, reward_func=length_ratio, args=magrpo()),
        lambda p: IACTrainer(agent_model=p["llama"], critic_model=MISSING, reward_func=length_ratio, args=IACConfig(num_turns=1)),
    ],
    ids=["agent", "tokenizer", "critic"],
)
def test_missing_local_path_says_does_not_exist_before_loading(no_loading, tiny_paths, build):
    with pytest.raises(FileNotFoundError) as info:
        build(tiny_paths)
    assert f"{MISSING!r} does not exist" in str(info.value)
    assert isinstance(info.value, ValueError)  # still a ValueError, like every other bad argument
    assert "Repo id" not in str(info.value)


def test_unreachable_hub_id_error_reads_cleanly():
    # conftest sets HF_HUB_OFFLINE: the loader fails at once; the text is one line without a doubled period.
    with pytest.raises(ValueError, match="Could not load a tokenizer from 'no-such-org/no-such-model'") as info:
        MAGRPOTrainer(agent_model="no-such-org/no-such-model", num_agents=2, reward_func=length_ratio, args=magrpo())
    assert "\n" not in str(info.value) and ". Give a local folder" in str(info.value) and ".. Give" not in str(info.value)


def test_demo_with_a_missing_model_prints_one_line(tmp_path, capsys):
    assert main(["demo", "--model", "/nope", "--output-dir", str(tmp_path / "run")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == ["comlrl demo: error: --model '/nope' does not exist: no such local folder. Give the folder of a "
                     "saved model (config.json and weights, e.g. one written by save_model) or a Hugging Face hub id "
                     "such as 'org/name'."]
    assert "Traceback" not in captured.err and not (tmp_path / "run").exists()
    assert main(["demo", "--agent-model", str(tmp_path / "a"), "--agent-model", "gpt2", "--output-dir", str(tmp_path / "r")]) == 2
    assert "--agent-model" in capsys.readouterr().err


def per_agent_lengths(completions):
    """Written for one agent: returns one value per entry of its argument."""
    return [float(len(c)) for c in completions]


def test_one_argument_reward_for_two_agents_gets_a_signature_message():
    with pytest.raises(ValueError) as info:
        RewardFunction(per_agent_lengths, num_agents=2)
    message = str(info.value)
    assert "signature (completions) cannot take the completions of 2 agent(s)" in message
    assert "f(completions_0, completions_1, batch_items=None)" in message


def test_two_argument_reward_count_error_has_no_signature_hint():
    reward = RewardFunction(lambda a, b: [0.0, 1.0], num_agents=2)
    with pytest.raises(ValueError) as info:
        reward.score([["a", "b", "c"], ["d", "e", "f"]], None, {})
    assert "returned 2 values for 3 joint responses" in str(info.value) and "signature" not in str(info.value)
