"""Errors about a dataset row name the row, the agent and the function; a DataFrame is a dataset;
prompts longer than an agent's context are refused before any model loads."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from datasets import Dataset

from comlrl.models.preflight import WeightFileError, check_weight_files, context_length
from comlrl.rollout.formatters import FormatterError, build_formatters
from comlrl.rollout.prompt_check import PromptCheck, PromptTooLongError
from comlrl.rollout.rows import as_dataset, describe_row, labelled_rows
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.common import length_ratio


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if any model weights load (the checks must come first)."""
    from transformers import modeling_utils

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the check")

    monkeypatch.setattr(modeling_utils.PreTrainedModel, "from_pretrained", classmethod(refuse))


def config(**fields):
    return MAGRPOConfig(**{**dict(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False,
                                  eval_interval=0, rollout_buffer_size=1), **fields})


def trainer(paths, **kwargs):
    settings = dict(agents=[paths["llama"], paths["gpt2"]], reward_func=length_ratio, args=config(),
                    train_dataset=Dataset.from_dict({"prompt": ["Tell a joke", "Describe a city"]}))
    settings.update(kwargs)
    return MAGRPOTrainer(**settings)


def test_a_dataframe_is_a_dataset_and_trains(tiny_paths):
    import pandas  # a dependency of datasets
    frame = pandas.DataFrame({"prompt": ["Tell a joke", "Describe a city", "Invent a fruit"]}, index=[10, 20, 30])
    converted = as_dataset(frame, "train_dataset")
    assert isinstance(converted, Dataset) and converted.column_names == ["prompt"] and converted[1] == {"prompt": "Describe a city"}
    t = trainer(tiny_paths, train_dataset=frame, eval_dataset=frame)
    assert isinstance(t.train_dataset, Dataset) and isinstance(t.eval_dataset, Dataset)
    t.train()
    assert t.state.global_step == 3


def test_a_dataset_name_or_a_dict_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"train_dataset is the string 'trl-lib/tldr'.*datasets.load_dataset\('trl-lib/tldr'"):
        as_dataset("trl-lib/tldr", "train_dataset")
    with pytest.raises(ValueError, match=r"Dataset.from_dict"):
        as_dataset({"prompt": ["a", "b"]}, "eval_dataset")


def refusal(paths, error, *prompts):
    """The message of ``error`` raised by building a trainer on rows with these prompts."""
    with pytest.raises(error) as info:
        trainer(paths, train_dataset=Dataset.from_dict({"prompt": list(prompts)}))
    return str(info.value)


def test_a_none_prompt_names_the_row_before_any_model_loads(tiny_paths, no_model_loads):
    message = refusal(tiny_paths, FormatterError, "Tell a joke", "Describe a city", None)
    assert "train_dataset row 2" in message and "returned None" in message and "'prompt' field is None" in message
    assert "formatters[0]" in message and "agent 0" in message


def test_a_formatter_key_error_names_the_formatter_the_agent_and_the_row(tiny_paths, no_model_loads):
    def brief(row):
        return row["prompt"]

    def detailed(row):
        return row["question"] + "?"

    with pytest.raises(FormatterError) as info:
        trainer(tiny_paths, formatters=[brief, detailed])
    message = str(info.value)
    assert "formatters[1]" in message and "detailed" in message and "agent 1" in message
    assert "raised KeyError: 'question'" in message and "train_dataset row 0" in message and "['prompt']" in message
    assert "test_row_errors.py:" in message  # where in the formatter it failed


def test_during_training_a_reward_error_names_the_function_the_row_and_the_team(tiny_paths):
    def picky(c1, c2, batch_items=None):
        if "city" in batch_items[0]["prompt"]:
            raise ZeroDivisionError("division by zero")
        return length_ratio(c1, c2)

    t = trainer(tiny_paths, reward_func=picky)
    with pytest.raises(ValueError) as info:
        t.train()
    message = str(info.value)
    assert "picky raised ZeroDivisionError: division by zero" in message and "of 2 agent(s)" in message
    assert "train_dataset row 1 ({'prompt': 'Describe a city'})" in message and "2 joint responses" in message


def test_rows_are_named_by_index_inside_the_block_and_by_content_outside():
    items = [{"prompt": "a"}, {"prompt": "b" * 300}]
    with labelled_rows(items, 40, "eval_dataset"):
        assert describe_row(items[1]).startswith("eval_dataset row 41 ({'prompt': 'bbb") and describe_row(items[1]).endswith("...)")
    assert describe_row(items[0]) == "the row {'prompt': 'a'}"


def test_a_formatter_called_at_rollout_names_its_agent():
    formatters = build_formatters([lambda row: row["prompt"], lambda row: None], 2)
    with pytest.raises(FormatterError, match=r"formatters\[1\] \(.*<lambda>\) of agent 1 returned None for the row"):
        formatters[1]({"prompt": "x"})


def test_a_prompt_longer_than_the_context_is_refused_before_any_model_loads(tiny_paths, no_model_loads):
    message = refusal(tiny_paths, PromptTooLongError, "Tell a joke", "word " * 1100)  # over 1024 positions in either tokenizer
    assert "agents[0]" in message and "train_dataset row 1" in message and "1024" in message
    assert "max_new_tokens=4" in message and "Shorten the prompts" in message


def test_max_new_tokens_that_fill_the_context_are_refused(tiny_paths, no_model_loads):
    with pytest.raises(ValueError, match=r"max_new_tokens=1024 leaves no room for a prompt in agents\[0\]'s context of 1024"):
        trainer(tiny_paths, args=config(max_new_tokens=1024))


def test_the_check_counts_tokens_only_for_prompts_that_could_be_too_long():
    class CountingTokenizer:
        calls = []

        def __call__(self, texts):
            self.calls.append(list(texts))
            return {"input_ids": [[0] * len(text.split()) for text in texts]}

    tokenizer = CountingTokenizer()
    rows = [{"prompt": "short"}, {"prompt": "x " * 60}]
    check = PromptCheck({"train_dataset": rows}, build_formatters(None, 1), max_new_tokens=10)
    check([tokenizer], [100])  # 60 tokens + 10 fit 100
    assert tokenizer.calls == [["x " * 60]]  # "short" has fewer bytes than the budget: never tokenized
    with pytest.raises(PromptTooLongError, match=r"train_dataset row 1 .*60 tokens.*70 positions.*context of 64"):
        check([tokenizer], [64])


def test_a_prompt_too_long_in_a_later_turn_is_named_at_generation(tiny_paths):
    from comlrl.rollout.generation import HFGenerator, SamplingParams
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_paths["gpt2"])
    generator = HFGenerator(model, AutoTokenizer.from_pretrained(tiny_paths["gpt2"]), model.device)
    assert generator.context == 1024 == context_length(model.config)
    with pytest.raises(PromptTooLongError) as info:
        generator.generate(["short", "word " * 1030], 1, SamplingParams(8, 1.0, 1.0, None))
    assert info.value.index == 1 and "context of 1024" in str(info.value)


def test_a_truncated_weight_file_is_named_before_any_model_loads(tiny_paths, tmp_path, no_model_loads):
    broken = tmp_path / "agent"
    shutil.copytree(tiny_paths["gpt2"], broken)
    weights = broken / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(os.path.getsize(weights) // 2)
    with pytest.raises(WeightFileError) as info:
        trainer(tiny_paths, agents=[tiny_paths["llama"], str(broken)])
    message = str(info.value)
    assert "agents[1]" in message and str(weights) in message and "truncated or corrupted" in message
    assert "Copy or download the model again" in message


def test_a_sharded_model_with_a_missing_shard_is_named(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(WeightFileError, match=r"critics\[0\].*model-00001-of-00002.safetensors is missing"):
        check_weight_files([str(tmp_path)], "critics")


def test_an_unknown_hub_id_suggests_the_embedded_model(monkeypatch):
    from comlrl.models.tokenizers import load_tokenizers

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as info:
        load_tokenizers(["no-such-org/no-such-model"])
    message = str(info.value)
    assert "no-such-org/no-such-model" in message and "'default' in comlrl train" in message and "default_model_dir()" in message
