"""The learning variants' pure maths (comlrl.core.policy_loss, comlrl.core.credit, the registries),
each checked against numbers worked by hand in the comment beside them."""

import math

import pytest
import torch
from torch.testing import assert_close

from comlrl.core import (
    PolicyLossInputs,
    advantage_names,
    compute_policy_loss,
    counterfactual_advantages,
    get_advantage,
    get_policy_loss,
    joint_returns_of_agent,
    mean_pairwise_correlation,
    policy_gradient_loss,
    policy_loss_names,
    pooled_advantages,
    register_advantage,
    scale_advantages,
    sequential_ratio,
    soft_overlong_penalty,
    zero_signal_fraction,
)
from comlrl.core.registry import Registry

# Two rows: row 0 has 3 real tokens, row 1 has 2 (its last position is padding).
LP = [[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([2.0, -1.0])
W = torch.tensor([0.5, 0.5])


def _loss(name, inputs):
    return compute_policy_loss(inputs, get_policy_loss(name))


def _run(name, **extra):
    lp = torch.tensor(LP, requires_grad=True)
    out = _loss(name, PolicyLossInputs(lp, MASK, ADV, W, **extra))
    out.loss.backward()
    return out, lp.grad


def test_registries_list_and_refuse():
    assert advantage_names()[:4] == ("mean", "max", "rloo", "raw")
    assert set(policy_loss_names()) >= {"sequence_sum", "grpo", "dr_grpo", "dapo", "bnpo", "gspo"}
    with pytest.raises(ValueError, match="registered: sequence_sum, grpo"):
        get_policy_loss("nope")
    table = Registry("thing")
    table.register("a")(len)
    with pytest.raises(ValueError, match="already registered"):
        table.register("a")(abs)
    table.register("a", replace=True)(abs)
    assert table.get("a") is abs
    with pytest.raises(ValueError, match="lower-case"):
        table.register("Upper")


def test_a_registered_estimator_is_found_by_name():
    @register_advantage("test_half_mean", replace=True)
    def half(returns):
        return 0.5 * get_advantage("mean")(returns)

    assert "test_half_mean" in advantage_names()
    # [1, 3]: mean 2, mean baseline [-1, 1], halved [-0.5, 0.5]
    assert_close(get_advantage("test_half_mean")(torch.tensor([1.0, 3.0])), torch.tensor([-0.5, 0.5]))


def _loss_of_1_4_3(lp, old, stale, eps):
    """CoMLRL 1.4.3's MAGRPO loss as it wrote it: ``-(A * w) * sum_t log pi`` on fresh rows, the summed
    clipped surrogate on stale ones."""
    adv = ADV.unsqueeze(-1)
    ratio = torch.exp(lp - old)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    fresh = -((lp * MASK).sum(-1) * ADV * W * ~stale).sum()
    return fresh - (surrogate * MASK * (W * stale).unsqueeze(-1)).sum()


def test_sequence_sum_takes_the_1_4_3_gradient_bit_for_bit():
    """The one surrogate with the "none" normaliser gives 1.4.3's gradient exactly (the loss value
    may round differently: it sums the same products in another order)."""
    a = torch.tensor(LP, requires_grad=True)
    b = torch.tensor(LP, requires_grad=True)
    old = torch.tensor(LP) - 0.1
    stale = torch.tensor([True, False])
    ref = _loss_of_1_4_3(a, old, stale, 0.2)
    out = policy_gradient_loss(b, MASK, ADV, W, old_token_logprobs=old, clip_range=0.2, importance_rows=stale)
    ref.backward()
    out.loss.backward()
    assert torch.equal(a.grad, b.grad)
    assert_close(out.loss, ref.detach(), rtol=0, atol=4 * torch.finfo(torch.float32).eps * float(ref.detach().abs()))


def test_grpo_per_sequence_mean():
    # row 0: 2 * (-6) / 3 = -4; row 1: -1 * (-2) / 2 = 1; loss = -(0.5 * -4 + 0.5 * 1) = 1.5
    out, grad = _run("grpo")
    assert_close(out.loss, torch.tensor(1.5))
    # d loss / d lp: row 0: -0.5 * 2 / 3 = -1/3 per token; row 1: -0.5 * (-1) / 2 = 0.25, pad 0
    assert_close(grad, torch.tensor([[-1 / 3, -1 / 3, -1 / 3], [0.25, 0.25, 0.0]]))


def test_dr_grpo_constant_normaliser():
    # L = 4: row 0: 2 * (-6) / 4 = -3; row 1: -1 * (-2) / 4 = 0.5; loss = -(0.5 * -3 + 0.5 * 0.5) = 1.25
    out, grad = _run("dr_grpo", max_length=4)
    assert_close(out.loss, torch.tensor(1.25))
    # every real token: -w A / L: row 0 -0.5 * 2 / 4 = -0.25, row 1 -0.5 * (-1) / 4 = 0.125
    assert_close(grad, torch.tensor([[-0.25, -0.25, -0.25], [0.125, 0.125, 0.0]]))


def test_dapo_token_mean_over_the_step():
    # 5 tokens in 2 rows: T_B = 2.5; loss = -(0.5 * (2 * -6) + 0.5 * (-1 * -2)) / 2.5 = 2.0
    # = -(sum over all tokens of A * lp) / 5 = -(-12 + 2) / 5: every token weighs 1/5
    out, grad = _run("dapo", step_tokens=2.5)
    assert_close(out.loss, torch.tensor(2.0))
    assert_close(grad, torch.tensor([[-0.4, -0.4, -0.4], [0.2, 0.2, 0.0]]))


def test_bnpo_normalises_by_its_own_micro_batch():
    # whole batch: weighted mean length (0.5 * 3 + 0.5 * 2) / 1 = 2.5, the same 2.0 as dapo
    out, _ = _run("bnpo")
    assert_close(out.loss, torch.tensor(2.0))
    # row 0 alone (weight 0.5): T = 3, loss = -(0.5 * 2 * -6) / 3 = 2.0; row 1 alone: -(0.5 * 2) / 2 = -0.5
    lp = torch.tensor(LP)
    one = _loss("bnpo", PolicyLossInputs(lp[:1], MASK[:1], ADV[:1], W[:1]))
    two = _loss("bnpo", PolicyLossInputs(lp[1:], MASK[1:], ADV[1:], W[1:]))
    assert_close(one.loss, torch.tensor(2.0))
    assert_close(two.loss, torch.tensor(-0.5))


@pytest.mark.parametrize("name", ["dapo", "sequence_sum"])
def test_clip_higher(name):
    """One surrogate for every loss: the upper clip is the same in DAPO and in 1.4.3's sequence_sum."""
    # one stale token, ratio exp(0 - log(1/1.5)) = 1.5, A = +1
    def loss(clip_high):
        lp = torch.zeros(1, 1, requires_grad=True)
        old = torch.full((1, 1), math.log(1 / 1.5))
        x = PolicyLossInputs(lp, torch.ones(1, 1), torch.tensor([1.0]), torch.tensor([1.0]), old, torch.tensor([True]),
                             clip_low=0.2, clip_high=clip_high, step_tokens=1.0)
        out = _loss(name, x)
        out.loss.backward()
        return out, lp.grad

    sym, sym_grad = loss(None)  # min(1.5, clip(1.5, 0.8, 1.2)) = 1.2: clipped, no gradient
    assert_close(sym.loss, torch.tensor(-1.2))
    assert_close(sym_grad, torch.zeros(1, 1))
    assert_close(sym.clip_fraction, torch.tensor(1.0))
    high, _ = loss(0.28)  # upper bound 1.28: min(1.5, 1.28) = 1.28
    assert_close(high.loss, torch.tensor(-1.28))
    wide, wide_grad = loss(0.6)  # upper bound 1.6: not clipped, d(-rho)/d lp = -rho = -1.5
    assert_close(wide.loss, torch.tensor(-1.5))
    assert_close(wide_grad, torch.tensor([[-1.5]]))


def test_gspo_sequence_ratio():
    # on-policy: s = 1, loss -(0.5 * 2 + 0.5 * -1) = -0.5, and the GRPO gradient (A / |y| per token)
    out, grad = _run("gspo")
    assert_close(out.loss, torch.tensor(-0.5))
    assert_close(grad, torch.tensor([[-1 / 3, -1 / 3, -1 / 3], [0.25, 0.25, 0.0]]))
    # stale, 2 tokens with log rho 0.1 and 0.3: s = exp(0.2) = 1.2214
    lp = torch.zeros(1, 2, requires_grad=True)
    old = torch.tensor([[-0.1, -0.3]])
    x = PolicyLossInputs(lp, torch.ones(1, 2), torch.tensor([-1.0]), torch.tensor([1.0]), old, torch.tensor([True]), clip_low=0.2)
    out = _loss("gspo", x)
    out.loss.backward()
    # A = -1: min(-1.2214, -1.2) = -1.2214 (unclipped side), loss = s; d s / d lp_t = s / 2 = 0.61070
    assert_close(out.loss, torch.tensor(math.exp(0.2)))
    assert_close(lp.grad, torch.full((1, 2), math.exp(0.2) / 2))


def test_scale_rewards_group_batch_agent_none():
    # group [1, 2, 3]: mean 2, population std sqrt(2/3) = 0.81650 -> [-1.22474, 0, 1.22474] (1.4.3)
    assert_close(scale_advantages([torch.tensor([1.0, 2.0, 3.0])], "group")[0], torch.tensor([-1.224745, 0.0, 1.224745]))
    # batch (TRL): two prompts whose rewards lie 10 apart, R = [0, 1] and [10, 11]; mean-baseline
    # advantages [-0.5, 0.5] twice; std of the raw rewards over the batch: mean 5.5, squared deviations
    # 30.25, 20.25, 20.25, 30.25 -> population variance 25.25, std 5.02494
    rewards = [torch.tensor([0.0, 1.0]), torch.tensor([10.0, 11.0])]
    advantages = [r - r.mean() for r in rewards]
    a, b = scale_advantages(advantages, "batch", rewards=rewards)
    assert_close(a, torch.tensor([-0.5, 0.5]) / 25.25**0.5)
    assert_close(b, torch.tensor([-0.5, 0.5]) / 25.25**0.5)
    # ... so the scaled advantages have std 0.5 / 5.02494 = 0.0995, where "agent" (the std of the centred
    # values, 0.5) ends every batch at std exactly 1: [-1, 1] twice
    assert_close(torch.cat([a, b]).std(unbiased=False), torch.tensor(0.5 / 25.25**0.5))
    for scaled in scale_advantages(advantages, "agent"):
        assert_close(scaled, torch.tensor([-1.0, 1.0]))
    # the population std, not Bessel's (TRL's torch.std): sqrt(101 / 3) = 5.80230 would give 0.08617
    assert not torch.allclose(a, torch.tensor([-0.5, 0.5]) / (101 / 3) ** 0.5)
    # batch divides the baseline's advantages without re-centring them: ReMax's R - max R = [-1, 0], [-1, 0]
    maxed = scale_advantages([torch.tensor([-1.0, 0.0]), torch.tensor([-1.0, 0.0])], "batch", rewards=rewards)
    assert_close(maxed[0], torch.tensor([-1.0, 0.0]) / 25.25**0.5)
    # agent of [1, 3] and [0, 6]: centred [-1, 1] and [-3, 3]; one std sqrt((1 + 1 + 9 + 9) / 4) = sqrt(5)
    a, b = scale_advantages([torch.tensor([1.0, 3.0]), torch.tensor([0.0, 6.0])], "agent")
    assert_close(a, torch.tensor([-1.0, 1.0]) / 5**0.5)
    assert_close(b, torch.tensor([-3.0, 3.0]) / 5**0.5)
    assert_close(scale_advantages([torch.tensor([1.0, 3.0])], "none")[0], torch.tensor([1.0, 3.0]))
    with pytest.raises(ValueError, match="needs the raw rewards"):
        scale_advantages(advantages, "batch")


def test_soft_overlong_penalty():
    # L_max = 10, L_cache = 4: 0 up to 6 tokens, then (6 - |y|) / 4: 7 -> -0.25, 8 -> -0.5, 10 -> -1; 11 -> -1
    lengths = torch.tensor([1, 6, 7, 8, 10, 11])
    assert_close(soft_overlong_penalty(lengths, 10, 4), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="1 <= cache < max_length"):
        soft_overlong_penalty(lengths, 10, 10)


def test_agent_turn_pooling():
    # [1, 3] and [0, 6] pooled: mean 2.5 -> [-1.5, 0.5] and [-2.5, 3.5]
    a, b = pooled_advantages([torch.tensor([1.0, 3.0]), torch.tensor([0.0, 6.0])], "mean")
    assert_close(a, torch.tensor([-1.5, 0.5]))
    assert_close(b, torch.tensor([-2.5, 3.5]))


def test_counterfactual_credit_per_context():
    # rows: agent i's completions j; columns: the others' contexts m
    joint = torch.tensor([[1.0, 0.0], [3.0, 10.0]])
    # mean baseline per context: column 0 -> [-1, 1], column 1 -> [-5, 5]; average [-3, 3]
    # (= the mean baseline of the marginals [0.5, 6.5]: linear)
    assert_close(counterfactual_advantages(joint, "mean", standardise=False), torch.tensor([-3.0, 3.0]))
    # standardised per context first: [-1, 1] and [-1, 1] -> [-1, 1] (each context counts the same)
    assert_close(counterfactual_advantages(joint, "mean", standardise=True), torch.tensor([-1.0, 1.0]))
    # leave-one-out per context with K = 2: R_j - R_other: [-2, 2] and [-10, 10] -> [-6, 6]
    assert_close(counterfactual_advantages(joint, "rloo", standardise=False), torch.tensor([-6.0, 6.0]))


def test_joint_returns_of_each_agent():
    # product order (a0, a1): (0,0)=1, (0,1)=2, (1,0)=3, (1,1)=4
    joint = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert_close(joint_returns_of_agent(joint, 0, 2, 2), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert_close(joint_returns_of_agent(joint, 1, 2, 2), torch.tensor([[1.0, 3.0], [2.0, 4.0]]))


def test_sequential_ratio_clipped():
    # exp(-1 + 1.5) = 1.64872 -> 1.2; exp(-2 + 1) = 0.36788 -> 0.8
    new, old = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert_close(sequential_ratio(new, old, 0.2), torch.tensor([1.2, 0.8]))
    assert_close(sequential_ratio(new, old, None), torch.tensor([math.exp(0.5), math.exp(-1.0)]))


def test_correlation_and_zero_signal():
    assert_close(mean_pairwise_correlation(torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]])), 1.0)
    # pairs (0,1) = 1, (0,2) = -1, (1,2) = -1: mean -1/3
    rows = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    assert_close(mean_pairwise_correlation(rows), -1 / 3)
    assert mean_pairwise_correlation(torch.tensor([[1.0, 1.0], [1.0, 2.0]])) is None  # a constant row
    # groups [0, 0], [1, -1], [0, 0]: two of three carry no signal
    assert_close(zero_signal_fraction([torch.zeros(2), torch.tensor([1.0, -1.0]), torch.zeros(2)]), 2 / 3)
