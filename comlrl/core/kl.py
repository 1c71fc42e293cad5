"""KL estimators between a policy and a frozen reference, from sampled tokens."""

from __future__ import annotations

from typing import Optional

import torch


def k3_token_kl(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020).

    ``k3 = exp(d) - d - 1`` with ``d = log pi_ref(y) - log pi(y)``: unbiased, and never negative.

    Shapes: ``[R, C]`` in, ``[R, C]`` out.
    """
    delta = reference_logprobs - policy_logprobs
    return torch.expm1(delta) - delta


def sequence_kl(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 KL of each sampled completion, summed over its real tokens: ``[R, C] -> [R]`` (for logging:
    never negative, low variance)."""
    per_token = k3_token_kl(policy_logprobs, reference_logprobs)
    return (per_token * mask.to(per_token.dtype)).sum(dim=-1)


def sequence_log_ratio(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k1 = ``log pi(y) - log pi_ref(y)`` of each sampled completion (summed over its real tokens):
    ``[R, C] -> [R]``. The KL penalty of a reward.

    Subtracted from a reward that REINFORCE treats as a constant, ``beta * k1`` gives exactly
    ``beta * grad KL(pi || pi_ref)``: ``E_pi[k1 grad log pi] = grad E_pi[k1] - E_pi[grad log pi]`` and the
    last term is 0. With k3 in its place the expected gradient would be
    ``grad KL(pi || pi_ref) - grad KL(pi_ref || pi)``, which can push the policy away from the reference.
    A single sample's k1 can be negative; its mean is the KL.
    """
    return ((policy_logprobs - reference_logprobs) * mask.to(policy_logprobs.dtype)).sum(dim=-1)


def k2_token_kl(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor,
                token_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The reference-KL loss term of every token: ``w_t * (log pi(y_t) - log pi_ref(y_t))^2 / 2``,
    ``[R, C] -> [R, C]`` (gradient through ``policy_logprobs``; ``w_t = 1`` without ``token_weights``).
    Padding is not masked here: the caller aggregates it with the policy terms over the mask
    (``core.policy_loss.aggregate``).

    Its gradient is ``w_t d_t grad log pi(y_t)`` with ``d_t = log pi(y_t) - log pi_ref(y_t)``, whose
    expectation over a token sampled from pi (``w = 1``), or from an older policy with ``w`` its
    importance weight (``stale_token_weights``), is the gradient of ``KL(pi(.|y_<t) || pi_ref(.|y_<t))``
    with the prefix held fixed: ``sum_y pi(y) d(y) grad log pi(y) = sum_y d(y) grad pi(y) = grad KL``
    (because ``sum_y pi(y) grad log pi(y) = 0``). (As a loss, k1 has gradient ``grad log pi``, zero in
    expectation, and k3 has the gradient of KL(pi_ref || pi), the other direction.)
    """
    delta = policy_logprobs - reference_logprobs.to(policy_logprobs.dtype)
    values = 0.5 * delta.square()
    if token_weights is not None:
        values = values * token_weights.to(policy_logprobs.dtype)
    return values


def k2_token_kl_loss(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor,
                     token_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``k2_token_kl`` summed over each row's real tokens: ``[R, C] -> [R]``."""
    return (k2_token_kl(policy_logprobs, reference_logprobs, token_weights) * mask.to(policy_logprobs.dtype)).sum(dim=-1)


def stale_token_weights(policy_logprobs: torch.Tensor, old_logprobs: torch.Tensor, stale_rows: torch.Tensor) -> torch.Tensor:
    """Per-token importance weights of a sampled-token loss: ``[R, C]``, exactly 1 on fresh rows and,
    on the rows of ``stale_rows`` (``[R]`` bool: drawn before the policy last stepped), the detached ratio
    ``pi(y_t) / pi_old(y_t)``, untruncated: ``E_{y ~ pi_old}[pi(y) / pi_old(y) f(y)] = E_{y ~ pi}[f(y)]``
    exactly, so a weighted k2 term estimates the current policy's KL gradient without bias
    (tests/core/test_kl_weights.py enumerates a categorical policy with ratios up to 1.8: truncating
    the weights at 1.2 biased the expected gradient by 26 % of its norm there)."""
    ratio = torch.exp(policy_logprobs.detach() - old_logprobs.to(policy_logprobs.dtype))
    return torch.where(stale_rows.to(ratio.device).unsqueeze(1), ratio, torch.ones_like(ratio))
