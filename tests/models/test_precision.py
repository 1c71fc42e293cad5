"""No silent low-precision training: checkpoints saved in bfloat16 train in float32 unless a dtype is
asked for, and an explicit half-precision choice is warned about."""

import warnings

import pytest
import torch
import transformers
from tests.helpers.common import length_ratio
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


@pytest.fixture(scope="module")
def bf16_dir(tiny_paths, tmp_path_factory):
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"]).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("bf16") / "llama-bf16"
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_paths["llama"]).save_pretrained(path)
    if int(transformers.__version__.split(".")[0]) >= 5:  # transformers 5 keeps the checkpoint's dtype by default
        assert AutoModelForCausalLM.from_pretrained(path).dtype == torch.bfloat16
    return str(path)


def moved_fraction(before, model):
    """Fraction of the elements of every non-embedding weight that changed."""
    moved = total = 0
    for (name, p), old in zip(model.named_parameters(), before):
        if "embed" in name:
            continue  # rows of tokens that never appear get no gradient
        moved += int((p.detach().float() != old.float()).sum())
        total += p.numel()
    return moved / total


def train_once(bf16_dir, prompts_dataset, model_config=None):
    trainer = MAGRPOTrainer(
        agent_model=bf16_dir, num_agents=1, reward_func=lambda c: [float(len(x)) for x in c], model_config=model_config,
        train_dataset=prompts_dataset.select(range(1)),
        args=MAGRPOConfig(num_turns=1, num_generations=4, max_new_tokens=6, num_train_epochs=1, verbose=False,
                          rollout_buffer_size=1, agent_learning_rate=5e-6, top_k=None, top_p=1.0, temperature=1.0),
    )
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    trainer.train()
    return trainer, before


def test_a_bf16_checkpoint_trains_in_float32(bf16_dir, prompts_dataset):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no precision warning on the default path
        trainer, before = train_once(bf16_dir, prompts_dataset)
    assert {p.dtype for p in trainer.agents[0].parameters()} == {torch.float32}
    assert moved_fraction(before, trainer.agents[0]) > 0.95


def test_explicit_bf16_is_warned_about_and_loses_updates(bf16_dir, prompts_dataset):
    with pytest.warns(UserWarning, match="round away"):
        trainer, before = train_once(bf16_dir, prompts_dataset, model_config={"dtype": "bfloat16"})
    assert {p.dtype for p in trainer.agents[0].parameters()} == {torch.bfloat16}
    assert moved_fraction(before, trainer.agents[0]) < 0.5  # the effect the warning names


def test_value_heads_are_float32_on_a_bf16_backbone(bf16_dir):
    with pytest.warns(UserWarning, match="round away"):
        trainer = IACTrainer(
            agent_model=bf16_dir, reward_func=length_ratio, model_config={"dtype": "bf16"},
            args=IACConfig(num_turns=1, use_separate_critic=False, verbose=False),
        )
    head = trainer.agents[0].value_head
    assert {p.dtype for p in head.parameters()} == {torch.float32}
    ids = torch.tensor([[3, 4, 5]])
    values = trainer.agents[0].last_token_values(ids, torch.ones_like(ids))
    assert values.dtype == torch.float32
