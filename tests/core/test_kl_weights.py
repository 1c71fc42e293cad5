"""Stale rows' reference-KL weights are unbiased: by exact enumeration of a categorical policy, the
expectation over tokens drawn from the old policy of ``w(y) grad k2(y)`` (``w = stale_token_weights``)
is the gradient of the current policy's ``KL(pi || pi_ref)``. Truncating the weights, as comlrl did
before, biases it; the size of that bias is what docs/differences.md quotes."""

import torch
from torch.testing import assert_close

from comlrl.core import k2_token_kl, stale_token_weights

D = torch.float64
# pi, pi_old and pi_ref over four tokens; pi / pi_old = [1.8, 1, 2/3, 1/2]
PI = torch.tensor([0.45, 0.25, 0.20, 0.10], dtype=D)
PI_OLD = torch.tensor([0.25, 0.25, 0.30, 0.20], dtype=D)
PI_REF = torch.tensor([0.10, 0.30, 0.30, 0.30], dtype=D)


def exact_kl_gradient() -> torch.Tensor:
    """``grad_theta KL(pi || pi_ref)`` at ``theta = log PI`` (pi = softmax(theta)), by autograd."""
    theta = PI.log().clone().requires_grad_(True)
    pi = torch.softmax(theta, dim=0)
    (pi * (pi.log() - PI_REF.log())).sum().backward()
    return theta.grad


def expected_weighted_gradient(cap=None) -> torch.Tensor:
    """``sum_y pi_old(y) w(y) grad_theta k2(y)``: the estimator's expectation over tokens drawn from
    pi_old, each token one row of one position; ``cap`` truncates the weights (the old behaviour)."""
    theta = PI.log().clone().requires_grad_(True)
    logprobs = torch.log_softmax(theta, dim=0).unsqueeze(1)  # [V, 1]: row y holds log pi(y)
    weights = stale_token_weights(logprobs, PI_OLD.log().unsqueeze(1), torch.ones(4, dtype=torch.bool))
    if cap is not None:
        weights = weights.clamp(max=cap)
    terms = k2_token_kl(logprobs, PI_REF.log().unsqueeze(1), weights)  # [V, 1]
    (PI_OLD.unsqueeze(1) * terms).sum().backward()
    return theta.grad


def test_the_ratios_span_the_example():
    ratios = stale_token_weights(PI.log().unsqueeze(1), PI_OLD.log().unsqueeze(1), torch.ones(4, dtype=torch.bool)).squeeze(1)
    assert_close(ratios, torch.tensor([1.8, 1.0, 2 / 3, 0.5], dtype=D))


def test_the_weighted_k2_gradient_is_the_current_policys_kl_gradient_in_expectation():
    # sum_y pi_old(y) (pi(y) / pi_old(y)) d(y) grad log pi(y) = sum_y d(y) grad pi(y) = grad KL(pi || pi_ref)
    assert_close(expected_weighted_gradient(), exact_kl_gradient(), rtol=0, atol=64 * torch.finfo(D).eps)


def test_truncated_weights_are_biased_by_the_clipped_mass():
    """Truncating token 0's weight 1.8 at 1.2 (1 + importance_clip_range, what comlrl did) removes
    ``pi_old(0) (1.8 - 1.2) d(0) grad log pi(0) = 0.25 * 0.6 * log(0.45 / 0.10) * (e_0 - pi)`` from the
    expectation: 0.15 * 1.504077 * [0.55, -0.25, -0.2, -0.1], norm 0.1453 against the exact gradient's
    0.5529, a bias of 26 % of its norm (about 31 % with no weights at all, as TRL and verl do)."""
    exact = exact_kl_gradient()
    truncated = expected_weighted_gradient(cap=1.2)
    removed = 0.25 * (1.8 - 1.2) * torch.log(PI[0] / PI_REF[0]) * (torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=D) - PI)
    assert_close(exact - truncated, removed, rtol=0, atol=64 * torch.finfo(D).eps)
    assert 0.26 < float(removed.norm() / exact.norm()) < 0.27
