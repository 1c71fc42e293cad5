"""The zero-signal metrics and the one-time warning when a step cannot learn anything."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.telemetry.signal import NoLearningSignalWarning, ZeroSignalMonitor, signal_metrics
from tests.helpers.common import length_ratio


def test_fractions_by_hand():
    # reward groups: [1, 1] flat, [0, 1] not, [2] has one value and is not measured -> 1 / 2
    # completion groups: ["", "  "] all empty, [" ", "a"] not -> 1 / 2
    metrics = signal_metrics([[1.0, 1.0], [0.0, 1.0], [2.0]], [["", "  "], [" ", "a"]])
    assert metrics == {"frac_reward_zero_std": 0.5, "frac_all_empty_groups": 0.5}
    assert signal_metrics([[3.0]], []) == {}  # nothing measurable


def test_monitor_warns_once_and_only_without_signal():
    monitor = ZeroSignalMonitor("MAGRPO")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monitor.check({"frac_reward_zero_std": 0.5, "frac_all_empty_groups": 0.0}, 8)  # some signal: silent
    with pytest.warns(NoLearningSignalWarning, match="every completion was empty"):
        monitor.check({"frac_reward_zero_std": 1.0, "frac_all_empty_groups": 1.0}, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monitor.check({"frac_reward_zero_std": 1.0}, 24)  # once only


def magrpo(tiny_paths, dataset, reward=length_ratio):
    config = MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=4, eval_interval=0,
                          logging_steps=1, verbose=False, rollout_buffer_size=2)
    return MAGRPOTrainer(agents=[tiny_paths["llama"]] * 2, reward_func=reward, train_dataset=dataset, args=config)


def _eos_only(path):
    """The tiny llama with an untied head that always says EOS first (an empty answer). Before issue 20
    this was ``train(sequence_bias=...)``, which is refused now: it reshapes the sampled distribution."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    embeddings = model.get_input_embeddings().weight
    head = torch.nn.Linear(embeddings.shape[1], embeddings.shape[0], bias=True)
    with torch.no_grad():
        head.weight.copy_(embeddings)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 1000.0
    model.set_output_embeddings(head)
    model.config.tie_word_embeddings = False
    return model, tokenizer


def test_all_empty_completions_warn_once_and_are_logged(tiny_paths, prompts_dataset):
    (a, tok), (b, _) = _eos_only(tiny_paths["llama"]), _eos_only(tiny_paths["llama"])
    config = MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=4, eval_interval=0,
                          logging_steps=1, verbose=False, rollout_buffer_size=2)
    trainer = MAGRPOTrainer(agents=[a, b], tokenizer=tok, reward_func=length_ratio, train_dataset=prompts_dataset, args=config)
    with pytest.warns(NoLearningSignalWarning, match=r"MAGRPO: no learning signal .* every completion was empty") as record:
        trainer.train()  # every sample is EOS at once: an empty answer
    assert len([w for w in record if issubclass(w.category, NoLearningSignalWarning)]) == 1  # two steps, one warning
    rows = [row for row in trainer.log_history if "frac_all_empty_groups" in row]
    assert len(rows) == 2 and all(row["frac_all_empty_groups"] == 1.0 and row["frac_reward_zero_std"] == 1.0 for row in rows)
    assert all(row["agent_0/grad_norm"] == 0.0 for row in trainer.log_history if "agent_0/grad_norm" in row)


def test_a_step_with_signal_does_not_warn(tiny_paths, prompts_dataset):
    trainer = magrpo(tiny_paths, prompts_dataset)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoLearningSignalWarning)
        trainer.train()
    fractions = [row["frac_all_empty_groups"] for row in trainer.log_history if "frac_all_empty_groups" in row]
    assert fractions and all(0.0 <= f < 1.0 for f in fractions)


def test_actor_critic_warns_on_identical_rewards(tiny_paths, prompts_dataset):
    config = IACConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=3, eval_interval=0,
                       rollout_buffer_size=4, verbose=False, use_separate_critic=False)
    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=lambda c1, c2: [0.5] * len(c1),
                         train_dataset=prompts_dataset, args=config)
    with pytest.warns(NoLearningSignalWarning, match="IAC: no learning signal .* all rewards were equal"):
        trainer.train()
    assert all(row["frac_reward_zero_std"] == 1.0 for row in trainer.log_history if "frac_reward_zero_std" in row)
