"""Reference KL as its own loss term (``reference_kl_mode="loss"``, the default) against the 1.4.3
penalty in the returns (``"reward"``).

The reference is the two-token policy with its LM-head bias for "b" raised by 1, so for the
one-token completions ``k1 = log pi(y) - log pi_ref(y)`` is known from two scoring forwards.
"""

import pytest
import torch
from tests.helpers.common import PROMPTS, seed_all
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.direction import ONE_TOKEN, PREFERRED, completion_logprobs, two_token_policy

from tests.trainers.test_kl_and_critic_settings import kl_iac

from comlrl.trainers.actor_critic import IACConfig
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


def _shifted_reference(trainer, ids):
    reference = trainer.reference_models[0]
    with torch.no_grad():
        reference.get_output_embeddings().bias[ids[PREFERRED]] += 1.0
    return reference


def _magrpo(paths, coef, **overrides):
    model, tokenizer, ids = two_token_policy(paths["llama"])
    args = dict(num_turns=1, num_train_epochs=1, verbose=False, logging_steps=1, num_agents=1, num_generations=8,
                rollout_buffer_size=1, agent_learning_rate=1e-3, reference_kl_enabled=True, reference_kl_coef=coef, **ONE_TOKEN)
    trainer = MAGRPOTrainer(agents=[model], tokenizer=tokenizer, num_agents=1, reward_func=lambda c: [0.0] * len(c),
                            train_dataset=dataset(1), args=MAGRPOConfig(**{**args, **overrides}))
    return trainer, model, tokenizer, ids, _shifted_reference(trainer, ids)


def test_the_default_mode_is_loss_and_an_unknown_mode_is_refused():
    assert MAGRPOConfig().reference_kl_mode == "loss" and IACConfig().reference_kl_mode == "loss"
    assert MAGRPOConfig(reference_kl_mode=" Reward ").reference_kl_mode == "reward"
    with pytest.raises(ValueError, match="reference_kl_mode must be one of loss, reward"):
        MAGRPOConfig(reference_kl_mode="penalty")


def test_a_tied_group_has_zero_advantages_and_a_kl_loss_of_coef_scale(tiny_paths):
    """Every reward is 0: the group's advantages are exactly 0 whatever the KL, and the update is the
    KL term's, ``coef * mean_r (k1_r^2 / 2)``, so its gradient norm is proportional to coef."""
    norms = {}
    for coef in (1e-3, 1e-1):
        seed_all(0)  # the same samples for both coefficients
        trainer, model, tokenizer, ids, reference = _magrpo(tiny_paths, coef)
        pol = completion_logprobs(model, tokenizer, PROMPTS[:1], ids)
        ref = completion_logprobs(reference, tokenizer, PROMPTS[:1], ids)
        seen = []
        original = trainer.step.policy_step
        trainer.step.policy_step = lambda agent, batch: seen.extend(batch) or original(agent, batch)
        trainer.train()
        row = trainer.log_history[-1]
        assert row["agent_0/advantage_std"] == 0.0
        ((group, _advantages),) = seen  # (sample, its [K] advantages) pairs
        k1 = {text: float(pol[text][0] - ref[text][0]) for text in ids}
        by_id = {i: text for text, i in ids.items()}
        expected = coef * sum(0.5 * k1[by_id[int(c[0])]] ** 2 for c in group.completion_ids) / len(group.completion_ids)
        assert row["agent_0/kl_loss"] == pytest.approx(expected, rel=1e-4)
        norms[coef] = row["agent_0/grad_norm"]
    assert norms[1e-3] > 0 and norms[1e-1] == pytest.approx(100 * norms[1e-3], rel=1e-3)


def test_reward_mode_keeps_the_kl_inside_the_group_normalisation(tiny_paths):
    """1.4.3: with tied rewards the standardised ``returns - coef * k1`` have unit scale even for a tiny coef."""
    trainer, *_ = _magrpo(tiny_paths, 1e-3, reference_kl_mode="reward")
    trainer.train()
    row = trainer.log_history[-1]
    assert row["agent_0/advantage_std"] == pytest.approx(1.0, rel=1e-2)
    assert "agent_0/kl_loss" not in row


def test_actor_critic_loss_mode_leaves_rewards_and_targets_unpenalised(tiny_paths):
    batches = []
    trainer, _, _, ids = kl_iac(tiny_paths, batches, "loss", items=1, k=4, logging_steps=1)
    _shifted_reference(trainer, ids)
    trainer.train()
    for sample in batches[0]:
        assert float(sample.returns) == float(sample.value_target) == 1.0
        assert "reference_kl_penalty" not in sample.metadata and sample.metadata["reference_kl"] > 0
    assert any(row.get("agent_0/kl_loss", 0.0) > 0 for row in trainer.log_history)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo", "gspo"])
def test_the_kl_pulls_toward_the_reference_with_the_same_strength_under_every_loss(tiny_paths, loss_type):
    """Tied rewards: only the KL term moves the policy, toward the reference (which favours "b"). With
    one-token completions every normaliser is 1, so each loss's KL step is sequence_sum's exactly as
    strong: the coefficient means the same whatever loss_type aggregates it (test_update_path.py
    checks longer completions, where the normalisers differ)."""
    runs = {}
    for name in ("sequence_sum", loss_type):
        seed_all(0)  # the same samples for both losses
        trainer, model, tokenizer, ids, _ = _magrpo(tiny_paths, 0.1, loss_type=name)
        before = completion_logprobs(model, tokenizer, PROMPTS[:1], ids)
        trainer.train()
        after = completion_logprobs(model, tokenizer, PROMPTS[:1], ids)
        assert float(after[PREFERRED][0] - before[PREFERRED][0]) > 1e-4, name  # toward the reference's "b"
        runs[name] = (trainer.log_history[-1]["agent_0/grad_norm"], trainer.log_history[-1]["agent_0/kl_loss"])
    assert runs[loss_type][0] == pytest.approx(runs["sequence_sum"][0], rel=1e-5)
    assert runs[loss_type][1] == pytest.approx(runs["sequence_sum"][1], rel=1e-5)
