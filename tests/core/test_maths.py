"""Hand-worked numbers for the pure maths in comlrl.core."""

import math

import pytest
import torch
from torch.testing import assert_close

from comlrl.core import (
    cross_marginal_returns,
    group_advantages,
    k3_token_kl,
    node_returns,
    normalize_groups,
    policy_gradient_loss,
    rewards_to_go,
    sequence_kl,
    td_targets,
    value_loss,
)
from comlrl.core.logprobs import selected_logprobs
from tests.helpers.tolerances import EPS32, log_softmax_bound

R = torch.tensor([1.0, 2.0, 3.0, 6.0])  # K = 4, sum 12, mean 3, max 6


def test_mean_baseline():
    # A_j = R_j - mean(R) = R_j - 3
    assert_close(group_advantages(R, "mean"), torch.tensor([-2.0, -1.0, 0.0, 3.0]))


def test_max_baseline():
    # A_j = R_j - max(R) = R_j - 6
    assert_close(group_advantages(R, "max"), torch.tensor([-5.0, -4.0, -3.0, 0.0]))


def test_rloo_baseline():
    # A_j = R_j - mean of the other three = (4 R_j - 12) / 3
    # j=0: (4-12)/3 = -8/3; j=1: (8-12)/3 = -4/3; j=2: 0; j=3: (24-12)/3 = 4
    assert_close(group_advantages(R, "rloo"), torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0]))


def test_rloo_with_one_sample_falls_back_to_mean():
    assert_close(group_advantages(torch.tensor([5.0]), "rloo"), torch.tensor([0.0]))


def test_raw_baseline_is_the_return():
    out = group_advantages(R, "raw")
    assert_close(out, R)
    assert out is not R


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="advantage mode"):
        group_advantages(R, "median")


def test_baselines_work_per_group_on_the_last_dimension():
    groups = torch.tensor([[1.0, 3.0], [10.0, 20.0]])
    assert_close(group_advantages(groups, "mean"), torch.tensor([[-1.0, 1.0], [-5.0, 5.0]]))


def test_group_normalisation_uses_population_std():
    # A = [-2, -1, 0, 3]: mean 0, population variance (4 + 1 + 0 + 9) / 4 = 3.5
    a = torch.tensor([-2.0, -1.0, 0.0, 3.0])
    std = math.sqrt(3.5)
    assert_close(normalize_groups(a), a / std)


def test_normalisation_makes_every_baseline_equal():
    expected = normalize_groups(group_advantages(R, "mean"))
    for mode in ("max", "rloo", "raw"):
        assert_close(normalize_groups(group_advantages(R, mode)), expected)


def test_normalisation_of_constant_group_is_zero_and_of_single_sample_unchanged():
    assert_close(normalize_groups(torch.tensor([2.0, 2.0, 2.0])), torch.zeros(3))
    assert_close(normalize_groups(torch.tensor([4.0])), torch.tensor([4.0]))


def test_node_returns_with_discount_and_missing_children():
    rewards = torch.tensor([1.0, 0.5, 0.0])
    # child of joint action 0 has mean return 2, of action 2 mean return 4; action 1 did not expand
    child = torch.tensor([2.0, float("nan"), 4.0])
    # G = r + 0.9 * child mean (0 where no child): [1 + 1.8, 0.5, 0 + 3.6]
    assert_close(node_returns(rewards, child, 0.9), torch.tensor([2.8, 0.5, 3.6]))
    assert_close(node_returns(rewards, None, 0.9), rewards)


def test_cross_marginal_returns_average_over_the_other_agents():
    # K=2, N=2: joint order (0,0) (0,1) (1,0) (1,1) -> returns 1 2 3 4
    g = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # agent 0, completion 0: mean(1, 2) = 1.5; completion 1: mean(3, 4) = 3.5
    # agent 1, completion 0: mean(1, 3) = 2;   completion 1: mean(2, 4) = 3
    assert_close(cross_marginal_returns(g, 2, 2), torch.tensor([[1.5, 3.5], [2.0, 3.0]]))
    with pytest.raises(ValueError, match="K\\^N"):
        cross_marginal_returns(torch.ones(3), 2, 2)


def test_cross_marginal_returns_three_agents():
    # K=2, N=3: G(a) = 4 a0 + 2 a1 + a2 (product order: last agent fastest) = 0..7
    g = torch.arange(8.0)
    # agent 0 c=0: mean(0..3) = 1.5, c=1: mean(4..7) = 5.5
    # agent 1 c=0: mean(0,1,4,5) = 2.5, c=1: mean(2,3,6,7) = 4.5
    # agent 2 c=0: mean(0,2,4,6) = 3,   c=1: mean(1,3,5,7) = 4
    assert_close(cross_marginal_returns(g, 3, 2), torch.tensor([[1.5, 5.5], [2.5, 4.5], [3.0, 4.0]]))


def test_rewards_to_go():
    # gamma 0.5: G2 = 4, G1 = 2 + 0.5*4 = 4, G0 = 1 + 0.5*4 = 3
    assert rewards_to_go([1.0, 2.0, 4.0], 0.5) == pytest.approx([3.0, 4.0, 4.0])


def test_td_targets_do_not_bootstrap_terminal_turns():
    rewards = torch.tensor([1.0, 2.0, 3.0])
    next_values = torch.tensor([10.0, 20.0, 30.0])
    terminal = torch.tensor([False, True, True])
    # y0 = 1 + 0.9*10 = 10; y1 = 2 (terminal); y2 = 3 (terminal)
    assert_close(td_targets(rewards, next_values, terminal, 0.9), torch.tensor([10.0, 2.0, 3.0]))


def test_value_loss_plain_and_clipped():
    values = torch.tensor([1.0, 3.0])
    targets = torch.tensor([2.0, 0.0])
    # plain: ((2-1)^2 + (0-3)^2) / 2 = 5
    assert_close(value_loss(values, targets), torch.tensor(5.0))
    old = torch.tensor([0.0, 0.0])
    # clip 0.5: V_clip = [0.5, 0.5]; err_clip = [(2-0.5)^2, (0-0.5)^2] = [2.25, 0.25]
    # max elementwise with [1, 9] -> [2.25, 9]; mean 5.625
    assert_close(value_loss(values, targets, old, 0.5), torch.tensor(5.625))


def test_k3_kl_is_zero_for_equal_and_positive_otherwise():
    lp = torch.tensor([[-1.0, -2.0]])
    assert_close(k3_token_kl(lp, lp), torch.zeros(1, 2))
    ref = torch.tensor([[-1.5, -2.0]])
    # d = -0.5: exp(-0.5) - (-0.5) - 1 = 0.10653...
    assert_close(k3_token_kl(lp, ref), torch.tensor([[math.exp(-0.5) + 0.5 - 1.0, 0.0]]))
    mask = torch.tensor([[1.0, 0.0]])
    assert_close(sequence_kl(lp, ref, mask), torch.tensor([math.exp(-0.5) - 0.5]))


def test_k2_kl_loss_with_importance_weights_of_stale_rows():
    from comlrl.core.kl import k2_token_kl_loss, stale_token_weights

    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]], requires_grad=True)
    reference = torch.tensor([[-1.5, -2.0], [-1.0, -2.0]])
    old = torch.tensor([[-1.2, -2.5], [-0.5 - math.log(2.0), -1.0 + math.log(2.0)]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    stale = torch.tensor([False, True])
    weights = stale_token_weights(logprobs, old, stale)
    # fresh row: exactly 1; stale row: pi / pi_old = exp(lp - old) = [2, 1/2]
    assert torch.equal(weights[0], torch.ones(2))
    assert_close(weights[1], torch.tensor([2.0, 0.5]))
    assert not weights.requires_grad  # a weight, not a path for the gradient
    assert float(weights[1, 0]) > 1.9  # untruncated: a ratio of 2 stays 2 (tests/core/test_kl_weights.py: why)
    loss = k2_token_kl_loss(logprobs, reference, mask, weights)
    # row 0: (0.5^2 + 0) / 2 = 0.125; row 1: 2 * 0.5^2 / 2 = 0.25 (the second token is padding)
    assert_close(loss, torch.tensor([0.125, 0.25]))
    loss.sum().backward()
    # d/dlogp = m * w * (logp - ref): [[0.5, 0], [2 * 0.5, 0]]
    assert_close(logprobs.grad, torch.tensor([[0.5, 0.0], [1.0, 0.0]]))
    assert torch.equal(k2_token_kl_loss(logprobs, reference, mask, torch.ones(2, 2)), k2_token_kl_loss(logprobs, reference, mask))


def test_policy_gradient_loss_on_policy_value_and_gradient():
    # two rows: log-probs [[-1, -2, pad], [-0.5, pad, pad]]; advantages [2, -1]; weights [0.5, 0.5]
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = policy_gradient_loss(logprobs, mask, torch.tensor([2.0, -1.0]), torch.tensor([0.5, 0.5]))
    # L = -(0.5*2*(-3) + 0.5*(-1)*(-0.5)) = -(-3 + 0.25) = 2.75
    assert_close(out.loss, torch.tensor(2.75))
    out.loss.backward()
    # dL/dlogp = -w*A on real tokens, 0 on padding
    assert_close(logprobs.grad, torch.tensor([[-1.0, -1.0, 0.0], [0.5, 0.0, 0.0]]))


def test_policy_gradient_loss_importance_ratio_and_clipping():
    logprobs = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])  # ratios e and 1
    mask = torch.ones(1, 2)
    out = policy_gradient_loss(logprobs, mask, torch.tensor([1.0]), torch.tensor([1.0]), old, clip_range=0.2)
    # positive advantage: min(e * 1, 1.2 * 1) = 1.2 (clipped, no gradient), min(1, 1) = 1
    assert_close(out.loss, torch.tensor(-2.2))
    assert_close(out.clip_fraction, torch.tensor(0.5))
    out.loss.backward()
    assert_close(logprobs.grad, torch.tensor([[0.0, -1.0]]))
    # k3 of log ratio [1, 0]: (e - 1) - 1 = e - 2 and 0; mean (e - 2) / 2
    assert_close(out.approx_kl, torch.tensor((math.e - 2.0) / 2))


def test_policy_gradient_at_ratio_one_equals_on_policy_gradient():
    torch.manual_seed(0)
    base = torch.randn(3, 4)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    adv, w = torch.tensor([0.3, -1.2, 0.7]), torch.tensor([0.2, 0.3, 0.5])
    a = base.clone().requires_grad_(True)
    policy_gradient_loss(a, mask, adv, w).loss.backward()
    b = base.clone().requires_grad_(True)
    policy_gradient_loss(b, mask, adv, w, old_token_logprobs=base.clone(), clip_range=0.2).loss.backward()
    assert_close(a.grad, b.grad)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selected_logprobs_match_log_softmax_with_gradient(temperature):
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 7, dtype=torch.float64)
    targets = torch.randint(0, 7, (2, 3))
    weights = torch.randn(2, 3, dtype=torch.float64)
    ref_in = logits.clone().requires_grad_(True)
    ref = torch.log_softmax(ref_in / temperature, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (ref * weights).sum().backward()
    leaf = logits.clone().requires_grad_(True)
    out = selected_logprobs(leaf * 1.0, targets, temperature)  # non-leaf input, as from a model
    bound = log_softmax_bound(logits, temperature)  # float32 log-softmax against the float64 reference
    assert_close(out.double(), ref.detach(), atol=bound, rtol=0)
    (out.double() * weights).sum().backward()
    assert_close(leaf.grad, ref_in.grad, atol=float(weights.abs().max()) * (2 * bound + EPS32) / temperature, rtol=0)
    with torch.no_grad():
        assert_close(selected_logprobs(logits, targets, temperature).double(), ref.detach(), atol=bound, rtol=0)


@pytest.mark.parametrize("k", [2, 3, 5, 6, 7, 8, 12])
def test_a_constant_group_has_exactly_zero_advantage(k):
    """A group whose samples all got the same return carries no preference: its advantages must be
    exactly 0, not rounding noise. AdamW divides by the gradient's own scale, so an advantage of
    2e-7 (float32 ``R - mean(R)`` for R = 0.7 and K = 3) moves the weights as far as a real one.
    The same holds for the standardised group: noise / max(std, eps) reached 0.24 in float32."""
    for value in (0.7, -1.3, 2.9, 1e-3, 123.456):
        returns = torch.full((4, k), value)
        for mode in ("mean", "max", "rloo"):
            advantages = group_advantages(returns, mode)
            assert torch.equal(advantages, torch.zeros_like(returns)), (mode, k, value)
        assert torch.equal(normalize_groups(returns), torch.zeros_like(returns)), (k, value)
        assert torch.equal(normalize_groups(group_advantages(returns, "raw")), torch.zeros_like(returns))


def test_baselines_keep_the_dtype_and_float32_values():
    returns = torch.tensor([[0.1, 0.2, 0.7]], dtype=torch.float32)
    for mode in ("mean", "max", "rloo", "raw"):
        out = group_advantages(returns, mode)
        assert out.dtype == torch.float32
        # the float64 reference, rounded once
        reference = {"mean": returns.double() - returns.double().mean(-1, keepdim=True),
                     "max": returns.double() - returns.double().amax(-1, keepdim=True),
                     "rloo": (3 * returns.double() - returns.double().sum(-1, keepdim=True)) / 2,
                     "raw": returns.double()}[mode]
        assert torch.equal(out, reference.float()), mode
    assert normalize_groups(returns).dtype == torch.float32
    assert group_advantages(returns.double(), "mean").dtype == torch.float64
