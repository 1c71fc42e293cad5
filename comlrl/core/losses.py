"""Policy-gradient and value losses (pure tensor maths).

Shapes: R rows (one sampled completion each), C completion positions. ``token_logprobs[r, t]`` is
``log pi(y_t | x, y_<t)`` of completion token t of row r, and ``mask[r, t]`` is 1 for real completion
tokens (the end-of-sequence token included) and 0 for padding after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


def sequence_logprobs(token_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log pi(y | x) = sum_t log pi(y_t | x, y_<t)`` over the real tokens of each row: ``[R, C] -> [R]``."""
    return (token_logprobs * mask.to(token_logprobs.dtype)).sum(dim=-1)


@dataclass
class PolicyLossOutput:
    """The loss and the diagnostics of one policy-gradient minibatch (all detached but ``loss``)."""

    loss: torch.Tensor
    ratio_mean: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor


def policy_gradient_loss(
    token_logprobs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    row_weights: torch.Tensor,
    old_token_logprobs: Optional[torch.Tensor] = None,
    clip_range: Optional[float] = None,
    importance_rows: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """REINFORCE with a baseline; rows drawn by an older policy are importance-weighted and clipped.

    On-policy rows use the score-function estimator

        L_r = - w_r * A_r * sum_t m_rt * log pi(y_rt)

    whose gradient is ``- w_r A_r grad log pi(y_r | x_r)``. Importance-weighted rows (drawn by a
    policy ``pi_old`` whose per-token log-probs are ``old_token_logprobs``) use the PPO surrogate

        L_r = - w_r * sum_t m_rt * min(rho_rt A_r, clip(rho_rt, 1 - eps, 1 + eps) A_r),
        rho_rt = exp(log pi(y_rt) - log pi_old(y_rt)),

    (plain importance weighting when ``clip_range`` is None). At rho = 1 both have the same gradient.

    Args:
        token_logprobs: ``[R, C]`` log-probs under the current policy (with grad).
        mask: ``[R, C]`` 1 for scored tokens.
        advantages: ``[R]`` one advantage per row (sequence-level credit).
        row_weights: ``[R]`` weight of each row in the minibatch objective.
        old_token_logprobs: ``[R, C]`` log-probs of the sampling policy, or None. Given without
            ``importance_rows``, every row is importance-weighted.
        clip_range: PPO epsilon, or None for no clipping.
        importance_rows: ``[R]`` bool, the rows that take the surrogate; the others stay on-policy
            (their ratio diagnostics are still reported: it measures how far sampling and scoring
            log-probs agree).

    Returns the loss and, over the rows with ``old_token_logprobs``, the mean ratio, the fraction of
    tokens outside the clip range, and the k3 estimate of KL(pi_old || pi).
    """
    maskf = mask.to(token_logprobs.dtype)
    scale = (advantages * row_weights).to(token_logprobs.dtype)
    zero = token_logprobs.new_zeros(())
    if old_token_logprobs is None:
        loss = -(sequence_logprobs(token_logprobs, maskf) * scale).sum()
        return PolicyLossOutput(loss, zero + 1.0, zero, zero)
    if importance_rows is None:
        importance_rows = torch.ones(token_logprobs.shape[0], dtype=torch.bool, device=token_logprobs.device)
    log_ratio = token_logprobs - old_token_logprobs
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - clip_range, 1.0 + clip_range) if clip_range is not None else ratio
    if bool(importance_rows.any()):
        adv = advantages.to(token_logprobs.dtype).unsqueeze(-1)
        surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
        weights = (row_weights.to(token_logprobs.dtype) * importance_rows).unsqueeze(-1)
        on_policy = ~importance_rows
        loss = -(surrogate * maskf * weights).sum() - (sequence_logprobs(token_logprobs, maskf) * scale * on_policy).sum()
    else:  # nothing stale: exactly the on-policy loss above
        loss = -(sequence_logprobs(token_logprobs, maskf) * scale).sum()
    return ratio_diagnostics(loss, ratio, clipped_ratio, log_ratio, maskf)


def ratio_diagnostics(loss: torch.Tensor, ratio: torch.Tensor, clipped: torch.Tensor, log_ratio: torch.Tensor,
                      maskf: torch.Tensor) -> PolicyLossOutput:
    """``loss`` with the per-token means over ``maskf`` (``[R, C]`` each) of the ratio, of the clipped
    fraction, and of the k3 estimate of KL(pi_old || pi): ``(rho - 1) - log rho``."""
    with torch.no_grad():
        count = maskf.sum().clamp_min(1.0)
        ratio_mean = (ratio * maskf).sum() / count
        clip_fraction = (((ratio - clipped).abs() > 0).to(maskf.dtype) * maskf).sum() / count
        approx_kl = (((ratio - 1.0) - log_ratio) * maskf).sum() / count
    return PolicyLossOutput(loss, ratio_mean, clip_fraction, approx_kl)


def value_loss(
    values: torch.Tensor,
    targets: torch.Tensor,
    old_values: Optional[torch.Tensor] = None,
    clip_range: Optional[float] = None,
) -> torch.Tensor:
    """Mean squared value error, optionally with PPO value clipping.

    Unclipped: ``mean((T - V)^2)``. Clipped (``old_values`` and ``clip_range`` given):
    ``mean(max((T - V)^2, (T - V_clip)^2))`` with ``V_clip = V_old + clip(V - V_old, -eps, eps)``.

    Args:
        values: ``[B]`` current value estimates (with grad).
        targets: ``[B]`` value targets.
        old_values: ``[B]`` estimates at rollout time.
        clip_range: epsilon, or None.
    """
    targets = targets.to(values.dtype)
    err = (targets - values) ** 2
    if old_values is not None and clip_range is not None:
        old_values = old_values.to(values.dtype)
        clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
        err = torch.maximum(err, (targets - clipped_values) ** 2)
    return err.mean()
