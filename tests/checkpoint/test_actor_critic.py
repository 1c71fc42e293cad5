"""Actor-critic checkpoints (IAC, MAAC): epoch resume with more epochs is exact with heterogeneous agents
(actors, value heads, critics, both optimizer kinds, RNG); a crash mid-epoch resumes bit-identically
(critics, a shared critic object once, value heads, half-full rollout buffers); a checkpoint of another
critic layout is refused before anything changes."""

import random

import numpy as np
import pytest
import torch
from comlrl.rollout.rewards import RewardFunctionError
from tests.helpers.checkpoint_runs import CrashingReward, assert_equal, assert_same_run, make_dataset, seed_everything
from tests.helpers.common import length_ratio
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.checkpoint.files import CheckpointError
from comlrl.checkpoint.layout import latest_checkpoint, read_checkpoint_metadata

ARGS = dict(num_turns=1, num_generations=2, max_new_tokens=4, verbose=False, rollout_buffer_size=6,
            agent_learning_rate=2e-3, critic_learning_rate=2e-3, eval_interval=0, logging_steps=3)


def make(paths, kind, epochs, critics=None, **overrides):
    toks = [AutoTokenizer.from_pretrained(paths["llama"]), AutoTokenizer.from_pretrained(paths["gpt2"])]
    common = dict(agents=[paths["llama"], paths["gpt2"]], tokenizer=toks, reward_func=length_ratio, train_dataset=make_dataset(3))
    if kind == "maac":
        return MAACTrainer(critic_model=paths["gpt2"], args=MAACConfig(**ARGS, num_train_epochs=epochs, **overrides), **common)
    return IACTrainer(args=IACConfig(**ARGS, num_train_epochs=epochs, **overrides), critics=critics, **common)


def summary(trainer):
    return {
        "models": {name: [t.clone() for t in m.state_dict().values()] for name, m in trainer.named_models().items()},
        "optimizers": {name: opt.state_dict() for name, opt in trainer.named_optimizers().items()},
        "log": [dict(row) for row in trainer.log_history],
        "buffers": [len(b) for b in trainer.rollout_buffers],
        "rng": (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()),
    }


@pytest.mark.parametrize("kind, overrides", [("iac", {"use_separate_critic": False}), ("maac", {})])
def test_epoch_checkpoint_then_more_epochs_is_bit_identical(tiny_paths, tmp_path, kind, overrides):
    seed_everything(0)
    straight = make(tiny_paths, kind, 2, **overrides)
    straight.train()
    seed_everything(0)
    first = make(tiny_paths, kind, 1, **overrides)
    first.train(checkpoint_dir=str(tmp_path))
    assert read_checkpoint_metadata(str(tmp_path))["progress"]["epoch"] == 1
    resumed = make(tiny_paths, kind, 2, **overrides)
    resumed.train(resume_from_checkpoint=str(tmp_path), checkpoint_dir=str(tmp_path))
    assert_equal(summary(straight), summary(resumed), kind)
    names = set(resumed.named_models())
    assert {"agents.0", "agents.1"} <= names and (kind == "iac" or "critics.0" in names)


def test_a_checkpoint_of_other_critics_is_refused(tiny_paths, tmp_path):
    from tests.helpers.tiny_models import make_llama, save

    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    wider = save(make_llama(tok, hidden=48), tok, str(tmp_path / "wider-critic"))
    saved = make(tiny_paths, "iac", 1, critics=[tiny_paths["llama"], tiny_paths["gpt2"]])
    path = saved.save_checkpoint(str(tmp_path / "ck"))
    other = make(tiny_paths, "iac", 1, critics=[wider, tiny_paths["gpt2"]])
    heads = make(tiny_paths, "iac", 1, use_separate_critic=False)
    before = summary(other)  # RNG included: a refused load draws nothing either
    with pytest.raises(CheckpointError, match=r"Model 'critics\.0' differs .*\[300, 32\] in the checkpoint, float32\[300, 48\] here"):
        other.load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"Checkpoint configuration does not match: use_separate_critic"):
        heads.load_checkpoint(path)
    assert_equal(before, summary(other), "unchanged")

# 3 samples per agent and step into buffers of 4: buffers hold samples between steps
CRASH_ARGS = dict(num_turns=1, num_generations=3, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=4,
            agent_learning_rate=2e-3, critic_learning_rate=2e-3, eval_interval=0)


def make_crash_run(kind, paths, reward=length_ratio):
    if kind == "maac":
        toks = [AutoTokenizer.from_pretrained(paths["llama"]), AutoTokenizer.from_pretrained(paths["gpt2"])]
        return MAACTrainer(agents=[paths["llama"], paths["gpt2"]], tokenizer=toks, critic_model=paths["llama"],
                           reward_func=reward, args=MAACConfig(**CRASH_ARGS), train_dataset=make_dataset(4))
    if kind == "iac_shared_object":
        torch.manual_seed(5)
        critic = AutoModelForCausalLM.from_pretrained(paths["llama"])
        return IACTrainer(agent_model=paths["llama"], critic_model=critic, reward_func=reward,
                          args=IACConfig(**CRASH_ARGS), train_dataset=make_dataset(4))
    return IACTrainer(agent_model=paths["llama"], reward_func=reward, args=IACConfig(**CRASH_ARGS, use_separate_critic=False),
                      train_dataset=make_dataset(4))


def crash_summary(trainer):
    return {
        "models": {name: [p.detach().clone() for p in m.parameters()] for name, m in trainer.named_models().items()},
        "optimizers": {name: opt.state_dict() for name, opt in trainer.named_optimizers().items()},
        "log": [dict(row) for row in trainer.log_history],
        "env_step": trainer.env_step,
    }


@pytest.mark.parametrize("kind", ["maac", "iac_shared_object", "iac_heads"])
def test_crash_then_resume_is_bit_identical(tiny_paths, tmp_path, kind):
    seed_everything(0)
    straight = make_crash_run(kind, tiny_paths)
    straight.train()
    expected = crash_summary(straight)

    seed_everything(0)
    crashing = make_crash_run(kind, tiny_paths, reward=CrashingReward(2))  # the second step's reward raises
    with pytest.raises(RewardFunctionError, match="simulated crash"):
        crashing.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    assert any(crashing.rollout_buffers)  # the checkpoint had to carry buffered samples
    assert latest_checkpoint(str(tmp_path)) is not None

    resumed = make_crash_run(kind, tiny_paths)
    resumed.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1, resume_from_checkpoint=True)
    assert_same_run(expected, crash_summary(resumed))
