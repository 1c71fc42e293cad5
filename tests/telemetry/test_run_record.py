"""A run's output_dir: never two runs in one metrics.jsonl, and run_config.json / run_summary.json beside it."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.telemetry.run_record import RunRecord
from tests.helpers.common import length_ratio


def make(tiny_paths, dataset, out, reward=length_ratio, **overrides):
    fields = dict(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=3, eval_interval=0, logging_steps=1,
                  verbose=False, output_dir=str(out), rollout_buffer_size=2)
    fields.update(overrides)
    return MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=reward, train_dataset=dataset,
                         eval_dataset=dataset, args=MAGRPOConfig(**fields))


def read_rows(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def test_a_second_run_into_the_same_output_dir_is_refused(tiny_paths, prompts_dataset, tmp_path):
    first = make(tiny_paths, prompts_dataset, tmp_path)
    first.train()
    first.close()
    log = tmp_path / "metrics.jsonl"
    before = log.read_bytes()
    second = make(tiny_paths, prompts_dataset, tmp_path)
    with pytest.raises(FileExistsError) as info:
        second.train()
    message = str(info.value)
    assert f"output_dir {tmp_path} already holds metrics.jsonl of another run (2 rows)" in message
    assert "Choose a new output_dir, set overwrite_output_dir=True" in message and "resume_from_checkpoint" in message
    with pytest.raises(FileExistsError):
        second.evaluate()  # any first row is refused, not only training rows
    assert log.read_bytes() == before and second.env_step == 0
    second.close()


def test_overwrite_output_dir_starts_the_log_afresh(tiny_paths, prompts_dataset, tmp_path):
    first = make(tiny_paths, prompts_dataset, tmp_path)
    first.train()
    first.close()
    again = make(tiny_paths, prompts_dataset, tmp_path, overwrite_output_dir=True)
    again.train()
    again.train()  # the same trainer training on appends to its own log
    again.close()
    steps = [row["env_step"] for row in read_rows(tmp_path / "metrics.jsonl")]
    assert steps == [4, 8]  # only this run's rows (4 items, K=2, 2 items per step), never a repeated env_step


def test_config_and_summary_are_written_beside_the_metrics(tiny_paths, prompts_dataset, tmp_path):
    trainer = make(tiny_paths, prompts_dataset, tmp_path, agent_learning_rate=3e-4)
    trainer.train()
    trainer.close()
    with open(tmp_path / "run_config.json", encoding="utf-8") as handle:
        config = json.load(handle)
    assert config["trainer"] == "MAGRPOTrainer" and config["config_class"] == "MAGRPOConfig"
    assert set(config["config"]) == set(MAGRPOConfig.field_names())
    assert config["config"]["agent_learning_rate"] == 3e-4 and config["config"]["train_batch_size"] == 2  # resolved
    assert config["config"]["adam_betas"] == [0.9, 0.999]
    with open(tmp_path / "run_summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["status"] == "completed" and summary["error"] is None
    assert summary["versions"]["torch"] == torch.__version__
    assert summary["versions"]["transformers"] == transformers.__version__
    assert [m["source"] for m in summary["models"]] == [tiny_paths["llama"], tiny_paths["gpt2"]]
    assert [m["class"] for m in summary["models"]] == ["LlamaForCausalLM", "GPT2LMHeadModel"]
    assert all(m["parameters"] > 0 and m["dtype"] == "float32" for m in summary["models"])
    assert summary["wall_time_s"] > 0 and summary["progress"]["env_step"] == 8
    last_training = [row for row in trainer.log_history if "turn_1/reward_mean" in row][-1]
    assert summary["final_metrics"]["turn_1/reward_mean"] == pytest.approx(last_training["turn_1/reward_mean"])


def test_a_failed_run_says_so_in_its_summary(tiny_paths, prompts_dataset, tmp_path):
    def broken(c1, c2):
        raise RuntimeError("reward server down")

    trainer = make(tiny_paths, prompts_dataset, tmp_path, reward=broken)
    with pytest.raises(ValueError, match="reward_func .*broken raised RuntimeError: reward server down"):
        trainer.train()
    with open(tmp_path / "run_summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["status"] == "failed" and summary["error"].startswith("RewardFunctionError: reward_func ")
    assert "raised RuntimeError: reward server down" in summary["error"]


def test_secrets_are_redacted_in_config_json(tmp_path):
    record = RunRecord(str(tmp_path))
    wandb = {"project": "p", "api_key": "sk-123", "config_sections": {"judge": {"openai_token": "t-456", "model": "m"}}}
    record.start(trainer="MAGRPOTrainer", config=MAGRPOConfig(num_turns=1), wandb_config=wandb)
    text = (tmp_path / "run_config.json").read_text()
    assert "sk-123" not in text and "t-456" not in text
    saved = json.loads(text)["wandb_config"]
    assert saved["api_key"] == "***" and saved["config_sections"]["judge"] == {"openai_token": "***", "model": "m"}
    assert [name for name in os.listdir(tmp_path)] == ["run_config.json"]  # no temporary file left
