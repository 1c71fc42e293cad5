"""The reference-KL penalty and the critic settings, checked by their effect through the trainers.

The reference is made to differ from the policy in a known way (its LM-head bias for "b" is raised
by 1), so the KL terms of every one-token completion are known from two scoring forwards, with
``d = log pi_ref(y) - log pi(y)``: the logged ``k3 = exp(d) - d - 1`` and the penalty's
``k1 = log pi(y) - log pi_ref(y) = -d``.
"""

import pytest
import torch
from tests.helpers.common import PROMPTS, seed_all
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.direction import ONE_TOKEN, OTHER, PREFERRED, completion_logprobs, record_calls, two_token_policy

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

COEF = 0.5




def shift_reference(trainer, token_ids):
    reference = trainer.reference_models[0]
    with torch.no_grad():
        reference.get_output_embeddings().bias[token_ids[PREFERRED]] += 1.0
    return reference


def expected_kl(policy, reference, tokenizer, prompt, completion, token_ids):
    """``(k3, k1)`` of a one-token completion, from the policy's and the reference's scoring forwards."""
    pol = completion_logprobs(policy, tokenizer, [prompt], token_ids)[completion][0]
    ref = completion_logprobs(reference, tokenizer, [prompt], token_ids)[completion][0]
    d = ref - pol
    return float(torch.expm1(d) - d), float(-d)


def log_odds(policy, tokenizer, prompts, token_ids):
    """``log pi(b) - log pi(a)`` per prompt: how much more the model prefers "b" than "a"."""
    lp = completion_logprobs(policy, tokenizer, prompts, token_ids)
    return lp[PREFERRED] - lp[OTHER]


def kl_trainer(paths, reward_func, lr=1e-3, mode="reward"):
    """One agent on the two-token policy with a reference that prefers "b" more (by 1 nat of log-odds)."""
    model, tokenizer, ids = two_token_policy(paths["llama"])
    trainer = MAGRPOTrainer(
        agents=[model], tokenizer=tokenizer, num_agents=1, reward_func=reward_func, train_dataset=dataset(4),
        args=MAGRPOConfig(num_turns=1, num_train_epochs=1, verbose=False, logging_steps=1, num_agents=1, num_generations=8,
                          rollout_buffer_size=1, advantage_normalization=False, agent_learning_rate=lr,
                          reference_kl_enabled=True, reference_kl_coef=COEF, reference_kl_mode=mode, **ONE_TOKEN),
    )
    return trainer, model, tokenizer, ids, shift_reference(trainer, ids)


def test_magrpo_advantages_are_the_group_baseline_of_returns_minus_coef_kl(tiny_paths):
    seen = []

    def constant(completions, batch_items):
        seen.append((batch_items[0]["prompt"], list(completions)))
        return [0.0] * len(completions)

    trainer, model, tokenizer, ids, reference = kl_trainer(tiny_paths, constant)
    first_kls = {c: expected_kl(model, reference, tokenizer, PROMPTS[0], c, ids) for c in ids}  # before any update
    trainer.train()
    prompt, completions = seen[0]
    assert prompt == PROMPTS[0] and set(completions) == set(ids), "the seeded first group holds both completions"
    k3 = torch.tensor([first_kls[c][0] for c in completions], dtype=torch.float64)
    k1 = torch.tensor([first_kls[c][1] for c in completions], dtype=torch.float64)
    row = trainer.log_history[0]
    # returns are 0, so the mean-baseline advantages are -COEF * (k1_j - mean k1) and their
    # (population) standard deviation is COEF * std(k1); the logged KL is the k3 estimate
    assert row["turn_1/reference_kl_mean"] == pytest.approx(float(k3.mean()), rel=1e-5, abs=1e-7)
    assert row["turn_1/reference_kl_penalty_mean"] == pytest.approx(COEF * float(k1.mean()), rel=1e-5, abs=1e-7)
    assert row["agent_0/advantage_std"] == pytest.approx(COEF * float(k1.std(unbiased=False)), rel=1e-4, abs=1e-7)


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


def kl_iac(paths, batches, mode, items=2, k=8, **overrides):
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


def test_actor_critic_rewards_are_penalised_by_coef_times_kl(tiny_paths):
    batches = []
    trainer, model, tokenizer, ids = kl_iac(tiny_paths, batches, "reward")
    reference = shift_reference(trainer, ids)
    expected = {c: expected_kl(model, reference, tokenizer, PROMPTS[0], c, ids) for c in ids}
    trainer.train()
    first = batches[0]  # sampled and scored before any update
    assert len(first) == 8 and {s.completion for s in first} == set(ids)
    for sample in first:
        k3, k1 = expected[sample.completion]
        assert sample.metadata["reference_kl"] == pytest.approx(k3, rel=1e-5, abs=1e-7)
        assert sample.metadata["reference_kl_penalty"] == pytest.approx(COEF * k1, rel=1e-5, abs=1e-7)
        assert float(sample.reward) == sample.metadata["environment_reward"] == 1.0
        assert float(sample.returns) == pytest.approx(1.0 - COEF * k1, rel=1e-6)
        assert float(sample.value_target) == pytest.approx(1.0 - COEF * k1, rel=1e-6)  # one turn: y = shaped reward


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




@pytest.mark.parametrize("separate", [True, False], ids=["separate_critics", "value_heads"])
def test_value_loss_coef_scales_every_critics_gradient(tiny_paths, separate):
    norms = {}
    for coef in (0.5, 1.0):
        seed_all(0)  # the same samples for both coefficients
        trainer = iac(tiny_paths, separate, value_loss_coef=coef)
        trainer.train()
        norms[coef] = [trainer.log_history[0][key] for key in grad_norm_keys(separate)]
    for half, full in zip(norms[0.5], norms[1.0]):
        assert half > 0 and full == pytest.approx(2.0 * half, rel=1e-4)


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
