"""Actor-critic runs resume exactly from a training checkpoint: actors, critics (a shared critic
object once), value heads, both kinds of optimizers and the half-full rollout buffers."""

import pytest
import torch
from checkpoint_helpers import CrashingReward, assert_same_run, make_dataset, seed_everything
from conftest import length_ratio
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.checkpoint.layout import latest_checkpoint

# 3 samples per agent and step into buffers of 4: buffers hold samples between steps
ARGS = dict(num_turns=1, num_generations=3, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=4,
            agent_learning_rate=2e-3, critic_learning_rate=2e-3, eval_interval=0)


def make(kind, paths, reward=length_ratio):
    if kind == "maac":
        toks = [AutoTokenizer.from_pretrained(paths["llama"]), AutoTokenizer.from_pretrained(paths["gpt2"])]
        return MAACTrainer(agents=[paths["llama"], paths["gpt2"]], tokenizer=toks, critic_model=paths["llama"],
                           reward_func=reward, args=MAACConfig(**ARGS), train_dataset=make_dataset(4))
    if kind == "iac_shared_object":
        torch.manual_seed(5)
        critic = AutoModelForCausalLM.from_pretrained(paths["llama"])
        return IACTrainer(agent_model=paths["llama"], critic_model=critic, reward_func=reward,
                          args=IACConfig(**ARGS), train_dataset=make_dataset(4))
    return IACTrainer(agent_model=paths["llama"], reward_func=reward, args=IACConfig(**ARGS, use_separate_critic=False),
                      train_dataset=make_dataset(4))


def summary(trainer):
    return {
        "models": {name: [p.detach().clone() for p in m.parameters()] for name, m in trainer.named_models().items()},
        "optimizers": {name: opt.state_dict() for name, opt in trainer.named_optimizers().items()},
        "log": [dict(row) for row in trainer.log_history],
        "env_step": trainer.env_step,
    }


@pytest.mark.parametrize("kind", ["maac", "iac_shared_object", "iac_heads"])
def test_crash_then_resume_is_bit_identical(tiny_paths, tmp_path, kind):
    seed_everything(0)
    straight = make(kind, tiny_paths)
    straight.train()
    expected = summary(straight)

    seed_everything(0)
    crashing = make(kind, tiny_paths, reward=CrashingReward(2))  # the second step's reward raises
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashing.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    assert any(crashing.rollout_buffers)  # the checkpoint had to carry buffered samples
    assert latest_checkpoint(str(tmp_path)) is not None

    resumed = make(kind, tiny_paths)
    resumed.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1, resume_from_checkpoint=True)
    assert_same_run(expected, summary(resumed))
