"""Training runs that test_data_parallel.py runs both in one process and under torchrun with 2 ranks.

Each returns what two equivalent runs must agree on (parameters, env_step, the logged rows)."""

import os
import random

import numpy as np
import torch
from datasets import Dataset
from tests.helpers.direction import agent_steps

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

PROMPTS = ["Describe a city", "Tell a joke", "Invent a fruit", "Write a story"]
LR = 2e-5  # the learning rate of every data-parallel scenario (agents and critics)


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def reward(c1, c2):
    return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(c1, c2)]


def transition(prompt, agent_completions, **_):
    return [f"{prompt} again: {c[:8]}" for c in agent_completions]


def summary(trainer, extra=()):
    models = list(trainer.agents) + list(extra)
    return {
        "parameters": [p.detach().clone() for m in models for p in m.parameters()],
        "env_step": trainer.env_step,
        "rows": [dict(r) for r in trainer.log_history if not any(k.startswith("eval/") for k in r)],
        "steps": agent_steps(trainer, models),
    }


def magrpo(paths, out, **overrides):
    args = MAGRPOConfig(**{
        "num_turns": 2, "num_generations": 2, "max_new_tokens": 5, "num_train_epochs": 2, "verbose": False,
        "agent_learning_rate": LR, "rollout_buffer_size": 6, "logging_steps": 1, "early_termination_threshold": None,
        "eval_interval": 0, "weight_decay": 0.0, "output_dir": os.path.join(out, "magrpo-run"), **overrides,
    })
    trainer = MAGRPOTrainer(agents=[paths["llama"], paths["gpt2"]], reward_func=reward, external_transition=transition,
                            args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    return trainer


def run_magrpo(paths, out):
    trainer = magrpo(paths, out)
    trainer.train()
    return summary(trainer)


def run_iac(paths, out):
    args = IACConfig(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=2, verbose=False,
                     rollout_buffer_size=4, agent_learning_rate=LR, critic_learning_rate=LR, eval_interval=0,
                     weight_decay=0.0, logging_steps=1, max_grad_norm=1.0)  # the accumulate-clip-step schedule
    trainer = IACTrainer(agent_model=paths["llama"], critic_model=paths["llama"], reward_func=reward, args=args,
                         train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    trainer.train()
    return summary(trainer, trainer.critics)


def run_checkpointed(paths, out):
    """The MAGRPO run with a checkpoint after every step, then a fresh trainer resumed from the one after
    step 1 (buffers hold a multi-turn leftover there) trained to the end."""
    directory = os.path.join(out, "ckpts")
    first = magrpo(paths, out, output_dir=None)
    first.train(checkpoint_dir=directory, checkpoint_steps=1)
    seed_everything(123)  # anything: the checkpoint's RNG states replace it
    resumed = magrpo(paths, out, output_dir=None)
    resumed.train(resume_from_checkpoint=os.path.join(directory, "checkpoint-step-1"))
    return {"straight": summary(first), "resumed": summary(resumed), "names": sorted(os.listdir(directory))}


SCENARIOS = {"magrpo": run_magrpo, "iac": run_iac, "checkpointed": run_checkpointed}
