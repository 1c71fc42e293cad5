"""Optimisation mechanisms checked by their effect, through the trainers: gradient clipping,
importance-ratio clipping, AdamW's hyper-parameters, weight decay, and non-finite gradients."""

import math

import pytest
import torch
from tests.helpers.common import PROMPTS, length_ratio, no_signal_expected, snapshot
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.direction import assert_unchanged, record_calls
from tests.helpers.tolerances import EPS32, ratio_bound, rounding_bound, scored_length

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

MAGRPO_BASE = dict(num_turns=1, num_generations=2, max_new_tokens=5, num_train_epochs=1, verbose=False, logging_steps=1,
                   weight_decay=0.0)
AC_BASE = dict(num_turns=1, num_generations=2, max_new_tokens=5, num_train_epochs=1, verbose=False, logging_steps=1,
               weight_decay=0.0, eval_interval=0, rollout_buffer_size=4)




def magrpo(paths, reward=length_ratio, data=None, **overrides):
    return MAGRPOTrainer(agents=[paths["llama"], paths["gpt2"]], reward_func=reward, train_dataset=data or dataset(),
                         args=MAGRPOConfig(**{**MAGRPO_BASE, **overrides}))


def iac(paths, reward=length_ratio, **overrides):
    return IACTrainer(agent_model=paths["llama"], critic_model=paths["llama"], reward_func=reward, train_dataset=dataset(),
                      args=IACConfig(**{**AC_BASE, **overrides}))


def maac(paths, reward=length_ratio, **overrides):
    return MAACTrainer(agent_model=paths["llama"], critic_model=paths["llama"], reward_func=reward, train_dataset=dataset(),
                       args=MAACConfig(**{**AC_BASE, **overrides}))


def all_optimizers(trainer):
    """Every torch optimizer of a trainer by name (the public attributes)."""
    if hasattr(trainer, "named_optimizers"):
        return trainer.named_optimizers()
    return {f"optimizers.{i}": opt for i, opt in enumerate(trainer.optimizers)}




def series(calls, key):
    return [c[key] for c in calls if key in c]


def policy_bounds(trainer, new_tokens):
    """Per agent, how far from 1 a fresh row's token ratio can be (``ratio_bound``) with the agent's
    weights as they are now, over the test prompts plus ``new_tokens`` sampled tokens."""
    return [ratio_bound(agent, scored_length(tok, PROMPTS[:4], new_tokens)) for agent, tok in zip(trainer.agents, trainer.tokenizers)]


def fresh_ratio_tolerances(trainer, before, new_tokens):
    """Per agent: the larger ``policy_bounds`` of its weights before training (``before``) and after
    (AdamW moves each weight by about lr per step, so the scale in between lies between them up to
    that), plus the float32 rounding of the mean over at most 4 prompts x 2 samples x ``new_tokens``
    tokens of ratios below 2."""
    mean_rounding = rounding_bound(4 * 2 * new_tokens, 2.0)
    return [max(a, b) + mean_rounding for a, b in zip(before, policy_bounds(trainer, new_tokens))]


# ----------------------------------------------------------------------------- gradient clipping


def applied_norms(optimizer):
    """The global norm of the gradients each ``step()`` of ``optimizer`` applies."""
    norms = []

    def before_step(opt, args, kwargs):
        grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    optimizer.register_step_pre_hook(before_step)
    return norms


@pytest.mark.parametrize("build", [magrpo, iac, maac], ids=["magrpo", "iac", "maac"])
def test_the_applied_gradient_norm_is_at_most_max_grad_norm(tiny_paths, build):
    limit = 1e-3
    trainer = build(tiny_paths, max_grad_norm=limit, agent_learning_rate=1e-3)
    norms = {name: applied_norms(opt) for name, opt in all_optimizers(trainer).items()}
    trainer.train()
    # torch scales the gradients by limit / (norm + 1e-6) < limit / norm; the norm recomputed here and
    # torch's own each round a sum of squares over every parameter (relative error <= n eps, halved by
    # the square root), and the scaling rounds once more
    params = max(sum(p.numel() for group in opt.param_groups for p in group["params"]) for opt in all_optimizers(trainer).values())
    slack = rounding_bound(params + 2, 1.0)
    for name, values in norms.items():
        assert values, f"{name} never stepped"
        assert all(0.0 < v <= limit * (1 + slack) for v in values), (name, values)
    logged = [v for row in trainer.log_history for k, v in row.items() if k.endswith("grad_norm")]
    assert logged and all(v > 10 * limit for v in logged)  # the norm before clipping is what is logged


# ----------------------------------------------------------------------------- importance clipping


def test_magrpo_stale_buffer_is_clipped_and_the_fresh_one_is_not(tiny_paths):
    # Two buffers per generate call: the first update sees the sampling policy itself (ratio 1),
    # the second sees samples of the policy before that update; a large step pushes ratios out of
    # [0.8, 1.2], where the clip must act.
    trainer = magrpo(tiny_paths, buffers_per_generation=2, rollout_buffer_size=1, agent_learning_rate=0.05,
                     importance_clip_range=0.2, max_new_tokens=6)
    calls = record_calls(trainer)
    before = policy_bounds(trainer, 6)
    trainer.train()
    tolerances = fresh_ratio_tolerances(trainer, before, 6)  # sampling and scoring forwards differ by float32 rounding only
    for agent in range(2):
        ratios, clips = series(calls, f"agent_{agent}/ratio"), series(calls, f"agent_{agent}/clip_fraction")
        assert len(ratios) == len(clips) == 4  # 2 steps x 2 buffers
        fresh, stale = (ratios[0::2], clips[0::2]), (ratios[1::2], clips[1::2])
        assert all(abs(r - 1.0) <= tolerances[agent] for r in fresh[0]) and all(c == 0.0 for c in fresh[1]), fresh
        assert all(c > 0.0 for c in stale[1]), stale


def test_the_kl_loss_of_a_stale_buffer_is_importance_weighted_and_a_fresh_one_is_not(tiny_paths, monkeypatch):
    """reference_kl_mode="loss" over two buffers per generate call: the first (fresh) buffer's KL term
    takes no weights, the second's takes the stale rows' untruncated ratios pi / pi_old (not all 1)."""
    import comlrl.trainers.update as policy

    seen = []
    original = policy.stale_token_weights

    def spy(logprobs, old, stale):
        weights = original(logprobs, old, stale)
        seen.append((weights, torch.exp(logprobs.detach() - old), stale.clone()))
        return weights

    monkeypatch.setattr(policy, "stale_token_weights", spy)
    trainer = magrpo(tiny_paths, buffers_per_generation=2, rollout_buffer_size=1, agent_learning_rate=0.05, importance_clip_range=0.2,
                     max_new_tokens=6, reference_kl_enabled=True, reference_kl_coef=0.1, num_train_epochs=1)
    trainer.train()
    assert len(seen) == 4  # 2 steps x 2 agents, the stale buffer only (a fresh buffer takes no weights)
    noise = max(fresh_ratio_tolerances(trainer, policy_bounds(trainer, 6), 6))  # a fresh row's float32 ratio noise
    for weights, ratio, stale in seen:
        assert bool(stale.all())
        assert torch.equal(weights, ratio)  # the ratio itself, not truncated at 1 + importance_clip_range
        assert bool(((weights - 1.0).abs() > noise).any()), weights


@pytest.mark.parametrize("build", [iac, maac], ids=["iac", "maac"])
def test_actor_critic_second_pass_is_clipped_and_the_first_is_not(tiny_paths, build):
    trainer = build(tiny_paths, update_epochs=2, agent_learning_rate=0.05, importance_clip_range=0.2, max_new_tokens=6)
    calls = record_calls(trainer)
    before = policy_bounds(trainer, 6)
    trainer.train()
    tolerances = fresh_ratio_tolerances(trainer, before, 6)  # sampling and scoring forwards differ by float32 rounding only
    for agent in range(2):
        ratios, clips = series(calls, f"agent_{agent}/ratio"), series(calls, f"agent_{agent}/clip_fraction")
        assert len(ratios) == 4  # 2 drains x 2 passes, one minibatch each
        assert all(abs(r - 1.0) <= tolerances[agent] for r in ratios[0::2]) and all(c == 0.0 for c in clips[0::2])
        assert all(c > 0.0 for c in clips[1::2]), clips


# ----------------------------------------------------------------------------- AdamW settings


@pytest.mark.parametrize("build", [magrpo, iac, maac], ids=["magrpo", "iac", "maac"])
def test_adamw_hyper_parameters_reach_every_optimizer(tiny_paths, build):
    trainer = build(tiny_paths, weight_decay=0.03, adam_betas=(0.8, 0.95), adam_epsilon=1e-6, agent_learning_rate=2e-3,
                    **({} if build is magrpo else {"critic_learning_rate": 4e-3}))
    optimizers = all_optimizers(trainer)
    assert len(optimizers) >= (2 if build is magrpo else 3)
    for name, optimizer in optimizers.items():
        assert isinstance(optimizer, torch.optim.AdamW), name
        lr = 4e-3 if "critic" in name else 2e-3
        for group in optimizer.param_groups:
            assert (group["weight_decay"], group["betas"], group["eps"], group["lr"]) == (0.03, (0.8, 0.95), 1e-6, lr), name


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("schedule", [dict(), dict(optimizer_in_backward=False)])
def test_weight_decay_alone_shrinks_weights_by_one_minus_lr_times_decay(tiny_paths, schedule):
    # A constant reward gives zero advantages, so AdamW's step is its decoupled decay alone:
    # p <- p * (1 - lr * wd) = p * (1 - 0.01 * 0.5) = 0.995 p, per step.
    trainer = MAGRPOTrainer(
        agents=[tiny_paths["gpt2"]], num_agents=1, reward_func=lambda c: [1.0] * len(c), train_dataset=dataset(1),
        args=MAGRPOConfig(**{**MAGRPO_BASE, "weight_decay": 0.5}, num_agents=1, agent_learning_rate=0.01, rollout_buffer_size=1, **schedule),
    )
    before = snapshot(trainer.agents[0])
    trainer.train()
    # AdamW multiplies by 1 - lr * wd (a double, or its float32 rounding) and rounds; so does old * 0.995
    # here: at most eps / 2 from the factor and eps / 2 from each product's rounding apart
    for old, new in zip(before, trainer.agents[0].parameters()):
        torch.testing.assert_close(new.detach(), old * 0.995, rtol=2 * EPS32, atol=0.0)


# ----------------------------------------------------------------------------- non-finite gradients


def poison_gradient(model):
    """Make one parameter's gradient infinite while the loss stays finite."""
    parameter = next(p for p in model.parameters() if p.requires_grad)
    parameter.register_hook(lambda grad: torch.full_like(grad, math.inf))


@pytest.mark.parametrize("schedule", [dict(), dict(max_grad_norm=1.0)], ids=["in_backward", "after_backward"])
def test_a_non_finite_gradient_norm_raises(tiny_paths, schedule):
    trainer = magrpo(tiny_paths, **schedule)
    poison_gradient(trainer.agents[0])
    before = snapshot(trainer.agents[0])
    with pytest.raises(FloatingPointError, match=r"MAGRPO agent 0 .*(non-finite gradients|gradient norm is inf)"):
        trainer.train()
    if schedule:  # clip-then-step: nothing was applied
        assert_unchanged(trainer.agents[0], before, "agent 0 after the refused step")


def test_a_non_finite_critic_gradient_raises(tiny_paths):
    trainer = iac(tiny_paths)
    poison_gradient(trainer.critics[1])
    with pytest.raises(FloatingPointError, match=r"IAC critic 1 .*non-finite gradients"):
        trainer.train()


# ----------------------------------------------------------------------------- release


def test_a_trainer_is_freed_with_its_optimizers_and_weights(tiny_paths):
    """With the in-backward schedule (the default) every parameter carries a hook that steps its
    optimizer; a hook holding the optimizer kept it, its AdamW state and every weight alive after the
    trainer was dropped (a cycle through autograd's hook storage, which Python's gc cannot see)."""
    import gc
    import weakref

    trainer = magrpo(tiny_paths)
    trainer.train()
    assert trainer.policies[0].optimizer.in_backward
    refs = [weakref.ref(trainer), weakref.ref(trainer.policies[0].optimizer), weakref.ref(next(trainer.agents[0].parameters()))]
    del trainer
    gc.collect()
    assert [ref() is None for ref in refs] == [True, True, True]
