"""KL estimators between a policy and a frozen reference, from sampled tokens."""

from __future__ import annotations

import torch


def k3_token_kl(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020).

    ``k3 = exp(d) - d - 1`` with ``d = log pi_ref(y) - log pi(y)``: unbiased, and never negative.

    Shapes: ``[R, C]`` in, ``[R, C]`` out.
    """
    delta = reference_logprobs - policy_logprobs
    return torch.expm1(delta) - delta


def sequence_kl(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 KL of each sampled completion, summed over its real tokens: ``[R, C] -> [R]``."""
    per_token = k3_token_kl(policy_logprobs, reference_logprobs)
    return (per_token * mask.to(per_token.dtype)).sum(dim=-1)
