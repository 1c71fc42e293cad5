"""The reference-KL penalty and the critic settings, checked by their effect through the trainers.

The reference is made to differ from the policy in a known way (its LM-head bias for "b" is raised
by 1), so the KL terms of every one-token completion are known from two scoring forwards, with
``d = log pi_ref(y) - log pi(y)``: the logged ``k3 = exp(d) - d - 1`` and the penalty's
``k1 = log pi(y) - log pi_ref(y) = -d``.
"""

import copy

import pytest
import torch
from tests.helpers.common import PROMPTS, no_signal_expected, seed_all
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.direction import ONE_TOKEN, OTHER, PREFERRED, completion_logprobs, record_calls, two_token_policy
from tests.helpers.tolerances import EPS32, logprob_bound, rounding_bound

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

COEF = 0.5
# Samples per group wherever a test needs both completions in its first group: the two-token policy
# says "a" with probability ~0.64, so a group of K holds one completion only with probability
# 0.64^K + 0.36^K: 2.8 % for K = 8 (a seed that fails), 6e-7 for K = 32.
K_BOTH = 32




def shift_reference(trainer, token_ids):
    reference = trainer.reference_models[0]
    with torch.no_grad():
        reference.get_output_embeddings().bias[token_ids[PREFERRED]] += 1.0
    return reference


def expected_kl(policy, reference, tokenizer, prompt, completion, token_ids):
    """``(k3, k1)`` of a one-token completion, from float64 copies of the policy and the reference: free
    of float32 rounding, so only the trainer's float32 error (:func:`kl_bounds`) separates the two."""
    pol = completion_logprobs(copy.deepcopy(policy).double(), tokenizer, [prompt], token_ids)[completion][0]
    ref = completion_logprobs(copy.deepcopy(reference).double(), tokenizer, [prompt], token_ids)[completion][0]
    d = ref - pol
    return float(torch.expm1(d) - d), float(-d)


def kl_bounds(policy, reference, tokenizer, prompt, k1s):
    """``(dk1, dk3)``: how far the trainer's float32 k1 and k3 of a one-token completion of ``prompt``
    can be from the float64 values. k1 = log pi - log pi_ref carries both log-probs' rounding
    (``logprob_bound``, over the prompt and the completion token); k3 = expm1(d) - d with d = -k1
    moves by at most ``|expm1(d)| * dk1``, plus float32 rounding of its two operations at its scale."""
    length = len(tokenizer(prompt)["input_ids"]) + 1
    dk1 = logprob_bound(policy, length) + logprob_bound(reference, length)
    d = -torch.tensor(k1s, dtype=torch.float64)
    dk3 = float(torch.expm1(d).abs().max()) * dk1 + 2 * EPS32 * float((d.exp() + d.abs()).max())
    return dk1, dk3


def log_odds(policy, tokenizer, prompts, token_ids):
    """``log pi(b) - log pi(a)`` per prompt: how much more the model prefers "b" than "a"."""
    lp = completion_logprobs(policy, tokenizer, prompts, token_ids)
    return lp[PREFERRED] - lp[OTHER]


def kl_trainer(paths, reward_func, lr=1e-3, mode="reward"):
    """One agent on the two-token policy with a reference that prefers "b" more (by 1 nat of log-odds)."""
    model, tokenizer, ids = two_token_policy(paths["llama"])
    trainer = MAGRPOTrainer(
        agents=[model], tokenizer=tokenizer, num_agents=1, reward_func=reward_func, train_dataset=dataset(4),
        args=MAGRPOConfig(num_turns=1, num_train_epochs=1, verbose=False, logging_steps=1, num_agents=1, num_generations=K_BOTH,
                          rollout_buffer_size=1, advantage_normalization=False, agent_learning_rate=lr,
                          reference_kl_enabled=True, reference_kl_coef=COEF, reference_kl_mode=mode, **ONE_TOKEN),
    )
    return trainer, model, tokenizer, ids, shift_reference(trainer, ids)


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
def test_magrpo_advantages_are_the_group_baseline_of_returns_minus_coef_kl(tiny_paths):
    seen = []

    def constant(completions, batch_items):
        seen.append((batch_items[0]["prompt"], list(completions)))
        return [0.0] * len(completions)

    trainer, model, tokenizer, ids, reference = kl_trainer(tiny_paths, constant)
    first_kls = {c: expected_kl(model, reference, tokenizer, PROMPTS[0], c, ids) for c in ids}  # before any update
    dk1, dk3 = kl_bounds(model, reference, tokenizer, PROMPTS[0], [kls[1] for kls in first_kls.values()])
    trainer.train()
    prompt, completions = seen[0]
    assert prompt == PROMPTS[0] and set(completions) == set(ids), "the seeded first group holds both completions"
    k3 = torch.tensor([first_kls[c][0] for c in completions], dtype=torch.float64)
    k1 = torch.tensor([first_kls[c][1] for c in completions], dtype=torch.float64)
    row = trainer.log_history[0]
    # returns are 0, so the mean-baseline advantages are -COEF * (k1_j - mean k1) and their
    # (population) standard deviation is COEF * std(k1); the logged KL is the k3 estimate.
    # Tolerances: the trainer's float32 k1, k3 are off by at most dk1, dk3 each (kl_bounds), and a
    # float32 mean of the n values adds rounding_bound(n, mean |x|). A centred value moves by at
    # most twice its own error, and so does a population std (a norm of the centred values / sqrt n).
    n = len(completions)
    kl_tol = dk3 + rounding_bound(n, float(k3.abs().mean()))
    penalty_tol = COEF * (dk1 + rounding_bound(n, float(k1.abs().mean())))
    std_tol = 2 * COEF * dk1 + rounding_bound(2 * n, COEF * float(k1.abs().max()))
    assert row["turn_1/reference_kl_mean"] == pytest.approx(float(k3.mean()), rel=0, abs=kl_tol)
    assert row["turn_1/reference_kl_penalty_mean"] == pytest.approx(COEF * float(k1.mean()), rel=0, abs=penalty_tol)
    assert row["agent_0/advantage_std"] == pytest.approx(COEF * float(k1.std(unbiased=False)), rel=0, abs=std_tol)


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("mode", ["loss", "reward"])
def test_the_kl_penalty_pulls_the_policy_toward_the_reference(tiny_paths, mode):
    """CoMLRL 1.4.3 subtracted the k3 estimate from the return: as a REINFORCE reward its expected
    gradient is grad[KL(pi||ref) - KL(ref||pi)], which can push the policy away from the reference
    (this test failed with it). The k1 penalty gives exactly grad KL(pi||ref)."""
    trainer, model, tokenizer, ids, reference = kl_trainer(tiny_paths, lambda c: [0.0] * len(c), mode=mode)
    before = log_odds(model, tokenizer, PROMPTS[:4], ids)
    target = log_odds(reference, tokenizer, PROMPTS[:4], ids)
    assert torch.all(target > before + 0.9)  # the reference prefers "b" more
    trainer.train()
    # with a constant reward only the penalty acts: the preference for "b" must grow toward the
    # reference's (the full-vocabulary KL is no measure here: AdamW moves every backbone weight by
    # about lr whatever its gradient, which reshuffles the tokens nobody sampled)
    after = log_odds(model, tokenizer, PROMPTS[:4], ids)
    assert torch.all(after > before + 1e-3) and torch.all(after < target), (before.tolist(), after.tolist(), target.tolist())


def kl_iac(paths, batches, mode, items=2, k=K_BOTH, **overrides):
    """One IAC actor on the two-token policy, reward 1, reference KL in ``mode``; its rollouts go to ``batches``."""
    model, tokenizer, ids = two_token_policy(paths["llama"])
    trainer = IACTrainer(
        agents=[model], tokenizer=tokenizer, critics=[paths["llama"]], reward_func=lambda c: [1.0] * len(c),
        train_dataset=dataset(items), metrics_callback=lambda rollouts: batches.append(list(rollouts)) or {},
        args=IACConfig(num_turns=1, num_train_epochs=1, verbose=False, eval_interval=0, num_agents=1, num_generations=k,
                       rollout_buffer_size=k, reference_kl_enabled=True, reference_kl_coef=COEF, reference_kl_mode=mode,
                       **ONE_TOKEN, **overrides),
    )
    return trainer, model, tokenizer, ids


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
def test_actor_critic_rewards_are_penalised_by_coef_times_kl(tiny_paths):
    batches = []
    trainer, model, tokenizer, ids = kl_iac(tiny_paths, batches, "reward")
    reference = shift_reference(trainer, ids)
    expected = {c: expected_kl(model, reference, tokenizer, PROMPTS[0], c, ids) for c in ids}
    dk1, dk3 = kl_bounds(model, reference, tokenizer, PROMPTS[0], [k1 for _, k1 in expected.values()])
    trainer.train()
    first = batches[0]  # sampled and scored before any update
    assert len(first) == K_BOTH and {s.completion for s in first} == set(ids)
    # the trainer's float32 k1, k3 are within dk1, dk3 of the float64 values (kl_bounds); the shaped
    # return 1 - COEF * k1 adds the rounding of one product and one difference at magnitude <= 1 + COEF |k1|
    for sample in first:
        k3, k1 = expected[sample.completion]
        return_tol = COEF * dk1 + rounding_bound(2, 1.0 + COEF * abs(k1))
        assert sample.metadata["reference_kl"] == pytest.approx(k3, rel=0, abs=dk3)
        assert sample.metadata["reference_kl_penalty"] == pytest.approx(COEF * k1, rel=0, abs=COEF * dk1 + rounding_bound(1, COEF * abs(k1)))
        assert float(sample.reward) == sample.metadata["environment_reward"] == 1.0
        assert float(sample.returns) == pytest.approx(1.0 - COEF * k1, rel=0, abs=return_tol)
        assert float(sample.value_target) == pytest.approx(1.0 - COEF * k1, rel=0, abs=return_tol)  # one turn: y = shaped reward


# ----------------------------------------------------------------------------- critic settings

AC = dict(num_turns=1, num_train_epochs=1, verbose=False, eval_interval=0, logging_steps=1, weight_decay=0.0,
          num_generations=2, rollout_buffer_size=2, max_new_tokens=3, agent_learning_rate=1e-2, critic_learning_rate=1e-2)


def iac(paths, separate, reward=5.0, **overrides):
    critics = dict(critic_model=paths["llama"]) if separate else {}
    return IACTrainer(agent_model=paths["llama"], reward_func=lambda c1, c2: [reward] * len(c1), train_dataset=dataset(2),
                      args=IACConfig(**{**AC, **overrides}, use_separate_critic=separate), **critics)


def grad_norm_keys(separate):
    # separate critics log their own norm; a value head's loss is in its actor's step (the
    # constant reward over one prompt gives that step no policy gradient)
    return ["critic_0/grad_norm", "critic_1/grad_norm"] if separate else ["agent_0/grad_norm", "agent_1/grad_norm"]




# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("separate", [True, False], ids=["separate_critics", "value_heads"])
def test_value_loss_coef_scales_every_critics_gradient(tiny_paths, separate):
    norms = {}
    for coef in (0.5, 1.0):
        seed_all(0)  # the same samples for both coefficients
        trainer = iac(tiny_paths, separate, value_loss_coef=coef)
        trainer.train()
        norms[coef] = [trainer.log_history[0][key] for key in grad_norm_keys(separate)]
    for half, full in zip(norms[0.5], norms[1.0]):
        assert half > 0 and full == 2.0 * half


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("separate", [True, False], ids=["separate_critics", "value_heads"])
def test_value_clip_range_reaches_every_critic(tiny_paths, separate):
    # Targets are 5 and values start near 0. After the first pass V has moved toward 5 by more than
    # eps = 1e-4, so in the second pass (T - V_clip)^2 > (T - V)^2 with V_clip frozen at V_old + eps:
    # the clipped loss is the max and has no gradient. Without clipping the second pass still learns.
    second_pass = {}
    for clip in (1e-4, None):
        seed_all(0)
        trainer = iac(tiny_paths, separate, value_clip_range=clip, update_epochs=2)
        calls = record_calls(trainer)
        trainer.train()
        second_pass[clip] = [series[1::2] for series in ([c[k] for c in calls if k in c] for k in grad_norm_keys(separate))]
    for clipped, free in zip(second_pass[1e-4], second_pass[None]):
        assert clipped == [0.0] * len(clipped) and all(v > 0 for v in free), (clipped, free)
