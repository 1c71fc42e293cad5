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


def k2_token_kl_loss(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor,
                     token_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The reference-KL loss term of each row: ``sum_t m_t * w_t * (log pi(y_t) - log pi_ref(y_t))^2 / 2``,
    ``[R, C] -> [R]`` (gradient through ``policy_logprobs``; ``w_t = 1`` without ``token_weights``).

    Its gradient is ``sum_t w_t d_t grad log pi(y_t)`` with ``d_t = log pi(y_t) - log pi_ref(y_t)``, whose
    expectation over tokens sampled from pi (``w = 1``), or from an older policy with ``w`` its
    importance weights (``stale_token_weights``), is the gradient of ``sum_t KL(pi(.|y_<t) || pi_ref(.|y_<t))``
    with the prefixes held fixed. (As a loss, k1 has gradient ``grad log pi``, zero in expectation, and
    k3 has the gradient of KL(pi_ref || pi), the other direction.)
    """
    delta = policy_logprobs - reference_logprobs.to(policy_logprobs.dtype)
    weight = mask.to(policy_logprobs.dtype)
    if token_weights is not None:
        weight = weight * token_weights.to(policy_logprobs.dtype)
    return (0.5 * delta.square() * weight).sum(dim=-1)


def stale_token_weights(policy_logprobs: torch.Tensor, old_logprobs: torch.Tensor, stale_rows: torch.Tensor,
                        cap: Optional[float] = None) -> torch.Tensor:
    """Per-token importance weights of a sampled-token loss: ``[R, C]``, exactly 1 on fresh rows and,
    on the rows of ``stale_rows`` (``[R]`` bool: drawn before the policy last stepped), the detached ratio
    ``pi(y_t) / pi_old(y_t)``, truncated at ``cap`` when given (truncated importance sampling: bounded
    variance for a small bias where the policy moved far)."""
    ratio = torch.exp(policy_logprobs.detach() - old_logprobs.to(policy_logprobs.dtype))
    if cap is not None:
        ratio = ratio.clamp(max=cap)
    return torch.where(stale_rows.to(ratio.device).unsqueeze(1), ratio, torch.ones_like(ratio))
