"""Shared pieces of the checkpoint tests: a small MAGRPO run, crash injection, exact comparisons."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch
from tests.helpers.common import length_ratio
from tests.helpers.common import prompt_dataset as make_dataset  # noqa: F401  (the names the checkpoint tests use)
from tests.helpers.common import seed_all as seed_everything  # noqa: F401

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

# Heterogeneous agents, multi-turn trees (3 groups per agent and step into buffers of 2, so buffers
# are non-empty between steps), reference KL (frozen references are checkpointed too), evaluation
# rows in the log, and a metrics gate (10 env steps, 6 per step) that holds pending sums across steps.
MAGRPO_ARGS = dict(
    num_turns=2, num_generations=2, max_new_tokens=5, num_train_epochs=2, verbose=False, agent_learning_rate=2e-3,
    rollout_buffer_size=2, logging_steps=10, reference_kl_enabled=True, early_termination_threshold=None,
    eval_interval=3, eval_num_samples=1,
)


def transition(prompt, agent_completions, **_):
    return [f"{prompt} again: {c[:8]}" for c in agent_completions]


def make_magrpo(paths, dataset, reward=length_ratio, cls=MAGRPOTrainer, model_config=None, tokenizer=None, wandb_config=None, **overrides):
    args = MAGRPOConfig(**{**MAGRPO_ARGS, **overrides})
    return cls(
        agents=[paths["llama"], paths["gpt2"]], tokenizer=tokenizer, model_config=model_config, reward_func=reward,
        external_transition=transition, args=args, train_dataset=dataset, eval_dataset=dataset, wandb_config=wandb_config,
    )


class CrashingReward:
    """The length-ratio reward that raises on call number ``crash_at`` (a stand-in for a crash)."""

    def __init__(self, crash_at: int):
        self.calls = 0
        self.crash_at = crash_at
        self.__wrapped__ = length_ratio  # the reward it stands for (a resume checks the reward function)

    def __call__(self, c1, c2):
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError("simulated crash")
        return length_ratio(c1, c2)


def parameters(trainer):
    return [p.detach().clone() for agent in trainer.agents for p in agent.parameters()]


def run_summary(trainer) -> dict:
    """Everything two equivalent runs must agree on, bit for bit."""
    return {
        "parameters": parameters(trainer),
        "optimizers": [opt.state_dict() for opt in trainer.optimizers],
        "log": [dict(row) for row in trainer.log_history],
        "state": dataclasses.asdict(trainer.state),
        "rng": (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()),
    }


def assert_equal(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            assert_equal(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths {len(a)} vs {len(b)}"
        for index, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_run(expected: dict, actual: dict, *, rng: bool = True) -> None:
    for key in expected:
        if key != "rng" or rng:
            assert_equal(expected[key], actual[key], key)
