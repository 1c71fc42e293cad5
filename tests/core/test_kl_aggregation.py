"""The reference-KL term is aggregated exactly like the policy term, for every registered loss
(``compute_policy_loss`` with ``kl_terms``): per token, inside the loss's own normaliser, so for one
coefficient the ratio of the KL gradient to the policy gradient does not depend on ``loss_type``.
Numbers worked by hand in float64 beside each expected value."""

import pytest
import torch
from torch.testing import assert_close

from comlrl.core import PolicyLossInputs, compute_policy_loss, get_policy_loss, k2_token_kl, register_policy_loss

D = torch.float64
# Two rows: row 0 has 3 real tokens, row 1 has 2 (its last position is padding).
LP = [[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]]
REF = [[-1.5, -2.0, -2.0], [-1.0, -1.5, 0.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
ADV = torch.tensor([2.0, -1.0], dtype=D)
W = torch.tensor([0.5, 0.5], dtype=D)
BETA = 0.1
# d = LP - REF = [[0.5, 0, -1], [0.5, 0, pad]]; k2 = d^2 / 2 = [[0.125, 0, 0.5], [0.125, 0, pad]]
# per-row sums: policy sum_t A lp = [2 * -6, -1 * -2] = [-12, 2]; KL sum_t k2 = [0.625, 0.125]
# inner sums of (u - beta k): row 0 -12 - 0.0625 = -12.0625, row 1 2 - 0.0125 = 1.9875
# L = -sum_r w_r (1 / n_r) inner_r;  kl_loss = beta sum_r w_r (1 / n_r) KL_r
EXPECTED = {
    # n = 1: L = -(0.5 * -12.0625 + 0.5 * 1.9875) = 5.0375; kl = 0.1 * (0.3125 + 0.0625) = 0.0375
    "sequence_sum": (dict(), 5.0375, 0.0375),
    # n = |y| = [3, 2]: L = -(0.5 * -12.0625 / 3 + 0.5 * 1.9875 / 2) = 2.0104167 - 0.496875 = 1.5135417
    # kl = 0.1 * (0.5 * 0.625 / 3 + 0.5 * 0.125 / 2) = 0.1 * (0.1041667 + 0.03125) = 0.0135417
    "grpo": (dict(), 12.0625 / 6 - 1.9875 / 4, 0.1 * (0.625 / 6 + 0.125 / 4)),
    # n = L = 4: both terms of sequence_sum divided by 4
    "dr_grpo": (dict(max_length=4), 5.0375 / 4, 0.0375 / 4),
    # n = T_B = 2.5 (5 tokens in 2 rows): both divided by 2.5
    "dapo": (dict(step_tokens=2.5), 5.0375 / 2.5, 0.0375 / 2.5),
    # the micro-batch's weighted mean length, (0.5 * 3 + 0.5 * 2) / 1 = 2.5: as dapo
    "bnpo": (dict(), 5.0375 / 2.5, 0.0375 / 2.5),
    # on-policy s = 1, the objective A_r on each token, n = |y|: policy -(0.5 * 6 / 3 + 0.5 * -2 / 2) = -0.5;
    # the KL term as grpo's: total -0.5 + 0.0135417
    "gspo": (dict(), -0.5 + 0.1 * (0.625 / 6 + 0.125 / 4), 0.1 * (0.625 / 6 + 0.125 / 4)),
}
# the per-row normaliser n_r of each loss above, for the gradients
NORMALISER = {"sequence_sum": [1.0, 1.0], "grpo": [3.0, 2.0], "dr_grpo": [4.0, 4.0], "dapo": [2.5, 2.5], "bnpo": [2.5, 2.5],
              "gspo": [3.0, 2.0]}


def _run(name, advantages=ADV, kl=True, lp=LP, ref=REF, mask=MASK, **extra):
    """The loss ``name`` (with the k2 term at BETA when ``kl``) and its gradient with respect to ``lp``."""
    lp = torch.tensor(lp, dtype=D, requires_grad=True)
    kl_terms = k2_token_kl(lp, torch.tensor(ref, dtype=D)) if kl else None
    out = compute_policy_loss(PolicyLossInputs(lp, mask, advantages, W, kl_terms=kl_terms, kl_coef=BETA, **extra), get_policy_loss(name))
    out.loss.backward()
    return out, lp.grad


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_kl_term_is_inside_the_loss_normaliser(name):
    extra, loss, kl_loss = EXPECTED[name]
    out, grad = _run(name, **extra)
    assert_close(out.loss, torch.tensor(loss, dtype=D))
    assert_close(out.kl_loss, torch.tensor(kl_loss, dtype=D))
    # every token of row r: d L / d lp_rt = (w_r / n_r) (-A_r + beta d_rt) m_rt (GSPO on-policy: its
    # sequence ratio's gradient is A_r / |y_r| per token, the same); d = [[0.5, 0, -1], [0.5, 0, 0]]
    d = torch.tensor(LP, dtype=D) - torch.tensor(REF, dtype=D)
    n = torch.tensor(NORMALISER[name], dtype=D).unsqueeze(1)
    assert_close(grad, (W.unsqueeze(1) / n) * (-ADV.unsqueeze(1) + BETA * d) * MASK)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_kl_to_policy_gradient_ratio_does_not_depend_on_the_loss(name):
    """Two rows of 3 real tokens with max_length 3: every normaliser but sequence_sum's is 3, so each loss's
    policy gradient and KL gradient are sequence_sum's divided by the same 3 (before the fix the KL
    part stayed sequence_sum's: dr_grpo with max_new_tokens=256 trained with 256 times the beta)."""
    rows = dict(lp=[LP[0], LP[0]], ref=[REF[0], [-0.5, -2.5, -3.5]], mask=torch.ones(2, 3, dtype=D), max_length=3, step_tokens=3.0)
    zero = torch.zeros(2, dtype=D)
    _, policy = _run(name, kl=False, **rows)
    _, kl = _run(name, advantages=zero, **rows)
    _, policy_sum = _run("sequence_sum", kl=False, **rows)
    _, kl_sum = _run("sequence_sum", advantages=zero, **rows)
    scale = 1.0 if name == "sequence_sum" else 3.0
    assert_close(policy, policy_sum / scale)
    assert_close(kl, kl_sum / scale)
    assert_close(kl.norm() / policy.norm(), kl_sum.norm() / policy_sum.norm())


def test_stale_rows_weight_the_kl_term_inside_the_normaliser():
    # row 1 stale with pi / pi_old = 2 on its first token (weights are detached): its k2 0.125 -> 0.25;
    # grpo: kl = 0.1 * (0.5 * 0.625 / 3 + 0.5 * 0.25 / 2) = 0.1 * (0.1041667 + 0.0625) = 0.01666667
    lp = torch.tensor(LP, dtype=D, requires_grad=True)
    weights = torch.tensor([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]], dtype=D)
    x = PolicyLossInputs(lp, MASK, ADV, W, kl_terms=k2_token_kl(lp, torch.tensor(REF, dtype=D), weights), kl_coef=BETA)
    out = compute_policy_loss(x, get_policy_loss("grpo"))
    assert_close(out.kl_loss, torch.tensor(0.1 * (0.625 / 6 + 0.25 / 4), dtype=D))


def test_without_a_regulariser_the_loss_is_the_policy_term_bit_for_bit():
    a, grad_a = _run("sequence_sum", kl=False)
    lp = torch.tensor(LP, dtype=D, requires_grad=True)
    b = compute_policy_loss(PolicyLossInputs(lp, MASK, ADV, W), get_policy_loss("sequence_sum"))
    b.loss.backward()
    assert torch.equal(a.loss, b.loss) and torch.equal(grad_a, lp.grad) and b.kl_loss is None


def test_gspo_carries_its_published_clip_range_on_its_record():
    assert get_policy_loss("gspo").clip_range == (3e-4, 4e-4)
    assert all(get_policy_loss(n).clip_range is None for n in ("sequence_sum", "grpo", "dr_grpo", "dapo", "bnpo"))
    with pytest.raises(ValueError, match="clip_range=.* must be two positive floats"):
        register_policy_loss("test_bad_clip", normaliser="none", clip_range=(0.2,))
