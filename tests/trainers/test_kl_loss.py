"""Reference KL as its own loss term (``reference_kl_mode="loss"``, the default) against the 1.4.3
penalty in the returns (``"reward"``).

The reference is the two-token policy with its LM-head bias for "b" raised by 1, so for the
one-token completions ``k1 = log pi(y) - log pi_ref(y)`` is known from two scoring forwards.
"""

import copy

import pytest
import torch
from tests.helpers.common import PROMPTS, no_signal_expected, seed_all
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.direction import ONE_TOKEN, PREFERRED, completion_logprobs, two_token_policy
from tests.helpers.tolerances import logprob_bound, rounding_bound

from tests.trainers.test_kl_and_critic_settings import K_BOTH, kl_iac

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


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
def test_a_tied_group_has_zero_advantages_and_a_kl_loss_of_coef_scale(tiny_paths):
    """Every reward is 0: the group's advantages are exactly 0 whatever the KL, and the update is the
    KL term's, ``coef * mean_r (k1_r^2 / 2)``, so its gradient norm is proportional to coef."""
    norms = {}
    for coef in (2.0**-10, 2.0**-3):  # powers of two: scaling by their ratio is exact in binary floats
        seed_all(0)  # the same samples for both coefficients
        trainer, model, tokenizer, ids, reference = _magrpo(tiny_paths, coef)
        # float64 copies: the reference values carry no float32 rounding; the trainer's k1 is within dk1 of them
        pol = completion_logprobs(copy.deepcopy(model).double(), tokenizer, PROMPTS[:1], ids)
        ref = completion_logprobs(copy.deepcopy(reference).double(), tokenizer, PROMPTS[:1], ids)
        length = len(tokenizer(PROMPTS[0])["input_ids"]) + 1
        dk1 = logprob_bound(model, length) + logprob_bound(reference, length)
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
        # k1^2 / 2 moves by at most |k1| dk1 + dk1^2 / 2; the float32 mean over the K rows adds rounding_bound(K, .)
        worst = max(abs(v) for v in k1.values())
        tol = coef * (worst * dk1 + dk1**2 / 2 + rounding_bound(len(group.completion_ids) + 2, worst**2 / 2))
        assert row["agent_0/kl_loss"] == pytest.approx(expected, rel=0, abs=tol)
        norms[coef] = row["agent_0/grad_norm"]
    assert norms[2.0**-10] > 0 and norms[2.0**-3] == 2**7 * norms[2.0**-10]


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
def test_reward_mode_keeps_the_kl_inside_the_group_normalisation(tiny_paths):
    """1.4.3: with tied rewards the standardised ``returns - coef * k1`` have unit scale even for a tiny coef."""
    trainer, *_ = _magrpo(tiny_paths, 1e-3, reference_kl_mode="reward", num_generations=K_BOTH)  # both completions
    trainer.train()
    row = trainer.log_history[-1]
    # the group's std s = coef * std(k1) >= 1e-4 is far above the clamp (1e-6), so the standardised values
    # have std s / s = 1 up to float32 rounding: their centring, division and the std's sums over 2K terms
    assert row["agent_0/advantage_std"] == pytest.approx(1.0, rel=rounding_bound(2 * K_BOTH + 4, 1.0))
    assert "agent_0/kl_loss" not in row


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
def test_actor_critic_loss_mode_leaves_rewards_and_targets_unpenalised(tiny_paths):
    batches = []
    trainer, _, _, ids = kl_iac(tiny_paths, batches, "loss", items=1, k=4, logging_steps=1)
    _shifted_reference(trainer, ids)
    trainer.train()
    for sample in batches[0]:
        assert float(sample.returns) == float(sample.value_target) == 1.0
        assert "reference_kl_penalty" not in sample.metadata and sample.metadata["reference_kl"] > 0
    assert any(row.get("agent_0/kl_loss", 0.0) > 0 for row in trainer.log_history)


@no_signal_expected  # the rewards tie on purpose
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
