"""Edges of the pure maths that the hand-worked examples of test_core_maths.py leave open: several
groups at once, K = 1 and K = 2, dtypes, padding in the diagnostics, the clip on both sides, chunk
sizes and temperatures. Written against the mutants mutmut found alive (docs/testing.md)."""

import math

import pytest
import torch
from torch.testing import assert_close

import comlrl.core.logprobs as logprobs_module
from comlrl.core import (
    cross_marginal_returns,
    group_advantages,
    normalize_flat,
    normalize_groups,
    policy_gradient_loss,
    sequence_kl,
    sequence_logprobs,
    value_loss,
)
from comlrl.core.logprobs import CHUNK_ELEMENTS, row_chunk, selected_logprobs
from tests.helpers.tolerances import EPS32, log_softmax_bound

GROUPS = torch.tensor([[1.0, 2.0, 6.0], [10.0, 40.0, 70.0]])  # two groups of K = 3, different scales


def test_every_baseline_is_computed_per_group():
    # max: [1,2,6] - 6 and [10,40,70] - 70; mean: - 3 and - 40; rloo (K R - sum) / (K - 1): (3R - 9) / 2, (3R - 120) / 2
    assert_close(group_advantages(GROUPS, "max"), torch.tensor([[-5.0, -4.0, 0.0], [-60.0, -30.0, 0.0]]))
    assert_close(group_advantages(GROUPS, "mean"), torch.tensor([[-2.0, -1.0, 3.0], [-30.0, 0.0, 30.0]]))
    assert_close(group_advantages(GROUPS, "rloo"), torch.tensor([[-3.0, -1.5, 4.5], [-45.0, 0.0, 45.0]]))


def test_rloo_with_two_samples_and_with_one():
    # K = 2: A_j = R_j - R_other (twice the mean-baseline advantage)
    assert_close(group_advantages(torch.tensor([1.0, 4.0]), "rloo"), torch.tensor([-3.0, 3.0]))
    # K = 1 in several groups: no other sample, zero advantage in each group, shape kept
    out = group_advantages(torch.tensor([[5.0], [-2.0], [7.0]]), "rloo")
    assert out.shape == (3, 1) and torch.equal(out, torch.zeros(3, 1))


def test_normalisation_is_per_group_and_eps_only_guards_zero_spread():
    # each row standardised by its own mean and std: both rows become [-1.2247, 0, 1.2247]
    rows = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    expected = torch.tensor([-1.0, 0.0, 1.0]) * math.sqrt(1.5)
    assert_close(normalize_groups(rows), expected.expand(2, 3))
    # a small spread (std 0.05 > eps) is standardised like any other
    assert_close(normalize_groups(torch.tensor([0.0, 0.1])), torch.tensor([-1.0, 1.0]))
    assert_close(normalize_flat(torch.tensor([0.0, 0.1])), torch.tensor([-1.0, 1.0]))
    # an explicit eps above the spread divides by eps instead: (+-0.05) / 0.5
    assert_close(normalize_flat(torch.tensor([0.0, 0.1]), eps=0.5), torch.tensor([-0.1, 0.1]))


def test_cross_credit_of_a_single_agent_and_the_shape_error():
    g = torch.tensor([1.0, 5.0, 3.0])
    assert_close(cross_marginal_returns(g, 1, 3), g.unsqueeze(0))  # nothing to average over
    with pytest.raises(ValueError, match=r"expects K\^N = 8 joint returns, got 6"):
        cross_marginal_returns(torch.ones(6), 3, 2)


def test_sums_over_tokens_keep_the_log_prob_dtype_and_work_on_leading_dims():
    lp = torch.tensor([[[-1.0, -2.0], [-0.5, -0.25]]])  # [1, 2, 2]
    mask = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]], dtype=torch.float64)
    out = sequence_logprobs(lp, mask)
    assert out.dtype == torch.float32 and out.shape == (1, 2)
    assert_close(out, torch.tensor([[-1.0, -0.75]]))
    ref = lp - 1.0  # d = -1 on every token: k3 = e^-1 + 1 - 1 = e^-1
    kl = sequence_kl(lp, ref, mask)
    assert kl.dtype == torch.float32
    assert_close(kl, torch.tensor([[math.exp(-1.0), 2 * math.exp(-1.0)]]))


def test_on_policy_diagnostics_are_neutral():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = policy_gradient_loss(lp, torch.ones(1, 2), torch.tensor([1.0]), torch.tensor([1.0]))
    assert (float(out.ratio_mean), float(out.clip_fraction), float(out.approx_kl)) == (1.0, 0.0, 0.0)


def test_importance_weighting_without_clip_and_diagnostics_over_real_tokens():
    # row 0: log-ratios [ln 2, 0, pad]; row 1: [ln 0.5, pad, pad]; advantages [2, -0.5]; weights [1, 1]
    old = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    new = old + torch.tensor([[math.log(2.0), 0.0, 5.0], [math.log(0.5), 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    lp = new.clone().requires_grad_(True)
    out = policy_gradient_loss(lp, mask, torch.tensor([2.0, -0.5]), torch.tensor([1.0, 1.0]), old, clip_range=None)
    # L = -(2*2 + 1*2 + 0.5*(-0.5)) = -(4 + 2 - 0.25) = -5.75 (padding ratios e^5 never count)
    assert_close(out.loss, torch.tensor(-5.75))
    assert_close(out.ratio_mean, torch.tensor((2.0 + 1.0 + 0.5) / 3))
    assert float(out.clip_fraction) == 0.0
    # k3 per token: (2 - 1 - ln 2), 0, (0.5 - 1 + ln 2); mean over the 3 real tokens
    assert_close(out.approx_kl, torch.tensor(((1 - math.log(2)) + (math.log(2) - 0.5)) / 3))
    out.loss.backward()
    # d/dlogp of -(rho A): -rho A on real tokens
    assert_close(lp.grad, torch.tensor([[-4.0, -2.0, 0.0], [0.25, 0.0, 0.0]]))


def test_the_clip_acts_on_both_sides_and_counts_any_clipped_token():
    # one real token per row: ratios 1.3 (A = 2) and 0.5 (A = -1), eps 0.2
    old = torch.tensor([[0.0], [0.0]])
    lp = torch.tensor([[math.log(1.3)], [math.log(0.5)]], requires_grad=True)
    mask = torch.ones(2, 1)
    out = policy_gradient_loss(lp, mask, torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0]), old, clip_range=0.2)
    # row 0: min(1.3*2, 1.2*2) = 2.4 ; row 1: min(0.5*-1, 0.8*-1) = -0.8 ; L = -(2.4 - 0.8) = -1.6
    assert_close(out.loss, torch.tensor(-1.6))
    assert float(out.clip_fraction) == 1.0  # 1.3 is 0.1 past the range: still clipped
    out.loss.backward()
    assert torch.equal(lp.grad, torch.zeros(2, 1))  # clipped terms carry no gradient
    single = policy_gradient_loss(lp.detach()[:1], mask[:1], torch.tensor([2.0]), torch.tensor([1.0]), old[:1], clip_range=0.5)
    assert_close(single.ratio_mean, torch.tensor(1.3))  # one token: mean over a count of 1


def test_losses_keep_the_log_prob_dtype_with_float64_side_inputs():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask, wide = torch.ones(1, 2, dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
    assert policy_gradient_loss(lp, mask, wide, wide).loss.dtype == torch.float32
    off = policy_gradient_loss(lp, mask, wide, wide, old_token_logprobs=lp.detach() - 0.1, clip_range=0.2)
    assert off.loss.dtype == torch.float32
    values = torch.tensor([1.0, 2.0])
    assert value_loss(values, torch.tensor([0.0, 0.0], dtype=torch.float64), torch.zeros(2, dtype=torch.float64), 0.5).dtype == torch.float32


def test_value_clip_both_directions_and_inside_the_range():
    old = torch.tensor([1.0, 1.0, 1.0])
    values = torch.tensor([0.5, 1.1, 1.6])  # moved -0.5, +0.1 (inside eps), +0.6
    targets = torch.tensor([0.0, 3.0, 3.0])
    # V_clip = 1 + clip([-0.5, 0.1, 0.6], +-0.2) = [0.8, 1.1, 1.2]
    # plain errors [0.25, 3.61, 1.96]; clipped errors [0.64, 3.61, 3.24]
    # max: [0.64, 3.61, 3.24] -> mean 7.49 / 3
    assert_close(value_loss(values, targets, old, 0.2), torch.tensor(7.49 / 3))


def test_row_chunks_bound_the_temporaries():
    assert row_chunk(1) == CHUNK_ELEMENTS and row_chunk(0) == CHUNK_ELEMENTS
    assert row_chunk(1000) == CHUNK_ELEMENTS // 1000
    assert row_chunk(4 * CHUNK_ELEMENTS) == 1  # a vocabulary wider than a chunk: one row at a time


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_selected_logprobs_over_many_small_chunks(monkeypatch, temperature):
    # 12 rows of a 5-token vocabulary in chunks of 2 rows (more rows than vocabulary entries)
    monkeypatch.setattr(logprobs_module, "row_chunk", lambda width: 2)
    torch.manual_seed(3)
    logits = torch.randn(3, 4, 5, dtype=torch.float64)
    targets = torch.randint(0, 5, (3, 4))
    reference_in = logits.clone().requires_grad_(True)
    reference = torch.log_softmax(reference_in / temperature, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    reference.sum().backward()
    leaf = logits.clone().requires_grad_(True)
    out = selected_logprobs(leaf * 1.0, targets, temperature)
    bound = log_softmax_bound(logits, temperature)  # float32 log-softmax against the float64 reference
    assert_close(out.double(), reference.detach(), atol=bound, rtol=0)
    out.sum().backward()
    assert_close(leaf.grad, reference_in.grad, atol=(2 * bound + EPS32) / temperature, rtol=0)
    with torch.no_grad():
        assert_close(selected_logprobs(logits, targets, temperature).double(), reference.detach(), atol=bound, rtol=0)


def test_selected_logprobs_default_temperature_and_float32_output():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    targets = torch.tensor([0])
    assert_close(selected_logprobs(logits, targets), torch.log_softmax(logits, -1)[:, 0])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:  # float32 whatever the default dtype
        assert selected_logprobs(logits.double(), targets).dtype == torch.float32
        assert selected_logprobs(logits.double().requires_grad_(True), targets).dtype == torch.float32
    finally:
        torch.set_default_dtype(previous)
