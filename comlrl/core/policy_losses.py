"""Registered policy losses: how token terms are aggregated and how importance ratios are formed.

Shapes: R rows (one sampled completion each), C completion positions; ``mask[r, t]`` is 1 for real
completion tokens (EOS included). Every loss takes one ``PolicyLossInputs`` and returns a
``PolicyLossOutput``; ``row_weights`` carry the trainer's weighting of rows (MAGRPO: ``1 / (K G)``, the
mean over the completions and groups of a minibatch). Token term of row r at token t:

    on-policy rows:  u_rt = A_r * log pi(y_rt)                 (gradient A_r grad log pi)
    stale rows:      u_rt = min(rho_rt A_r, clip(rho_rt, 1 - eps_low, 1 + eps_high) A_r)

At rho = 1 both have the same gradient, so a run with nothing stale is on-policy REINFORCE.

| name           | loss                                                        | source |
|----------------|-------------------------------------------------------------|--------|
| "sequence_sum" | ``-sum_r w_r sum_t u_rt`` (CoMLRL 1.4.3, the default)       | MAGRPO |
| "grpo"         | ``-sum_r w_r (1/|y_r|) sum_t u_rt``                          | GRPO, Shao et al. 2024 |
| "dr_grpo"      | ``-sum_r w_r (1/L) sum_t u_rt``, L = ``max_length``           | Dr. GRPO, Liu et al. 2025 |
| "dapo"         | ``-sum_r w_r sum_t u_rt / T_B``, T_B the step's mean tokens per row | DAPO, Yu et al. 2025 |
| "bnpo"         | same, T the micro-batch's mean tokens per row                | TRL ``loss_type="bnpo"`` |
| "gspo"         | ``-sum_r w_r min(s_r A_r, clip(s_r) A_r)``, ``s_r = exp(mean_t log rho_rt)`` | GSPO, Zheng et al. 2025 |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from comlrl.core.losses import PolicyLossOutput, policy_gradient_loss, ratio_diagnostics
from comlrl.core.registry import register_policy_loss


@dataclass
class PolicyLossInputs:
    """Everything a registered policy loss may use (tensors and plain numbers only).

    ``token_logprobs`` ``[R, C]`` (with grad); ``mask`` ``[R, C]``; ``advantages`` ``[R]``;
    ``row_weights`` ``[R]``; ``old_token_logprobs`` ``[R, C]`` or None (sampling log-probs, the current
    ones where unknown); ``importance_rows`` ``[R]`` bool, the stale rows (None: all rows with
    ``old_token_logprobs``); ``clip_low`` / ``clip_high`` the ratio's clip range ``[1 - low, 1 + high]``
    (None: unclipped); ``max_length`` the longest completion allowed (Dr. GRPO's constant);
    ``batch_tokens`` the ``row_weights``-weighted mean count of real tokens per row over the whole
    optimizer step (all micro-batches): DAPO's normaliser.
    """

    token_logprobs: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    row_weights: torch.Tensor
    old_token_logprobs: Optional[torch.Tensor] = None
    importance_rows: Optional[torch.Tensor] = None
    clip_low: Optional[float] = None
    clip_high: Optional[float] = None
    max_length: Optional[int] = None
    batch_tokens: Optional[float] = None


@register_policy_loss("sequence_sum")
def sequence_sum_loss(x: PolicyLossInputs) -> PolicyLossOutput:
    """CoMLRL 1.4.3's loss (``policy_gradient_loss``): summed token terms per completion, weighted by rows."""
    if x.clip_high is not None and x.clip_high != x.clip_low:
        raise ValueError("the sequence_sum loss clips symmetrically; epsilon_high needs another loss_type.")
    return policy_gradient_loss(x.token_logprobs, x.mask, x.advantages, x.row_weights, old_token_logprobs=x.old_token_logprobs,
                                clip_range=x.clip_low, importance_rows=x.importance_rows)


def _stale_rows(x: PolicyLossInputs) -> torch.Tensor:
    if x.old_token_logprobs is None:
        return torch.zeros(x.token_logprobs.shape[0], dtype=torch.bool, device=x.token_logprobs.device)
    if x.importance_rows is None:
        return torch.ones(x.token_logprobs.shape[0], dtype=torch.bool, device=x.token_logprobs.device)
    return x.importance_rows.to(torch.bool)


def upper_clip_bound(clip_low: Optional[float], clip_high: Optional[float]) -> Optional[float]:
    """``1 + (clip_high or clip_low)``: the upper bound of a stale ratio (None: unclipped)."""
    if clip_low is None and clip_high is None:
        return None
    return 1.0 + (clip_high if clip_high is not None else clip_low)


def _clip(ratio: torch.Tensor, x: PolicyLossInputs) -> torch.Tensor:
    high = upper_clip_bound(x.clip_low, x.clip_high)
    if high is None:
        return ratio
    low = 1.0 - x.clip_low if x.clip_low is not None else 0.0
    return ratio.clamp(low, high)


def _diagnostics(x: PolicyLossInputs, ratio: torch.Tensor, clipped: torch.Tensor, log_ratio: torch.Tensor, loss: torch.Tensor) -> PolicyLossOutput:
    """Mean ratio, fraction of clipped tokens, and the k3 KL(pi_old || pi), over rows with sampling log-probs."""
    if x.old_token_logprobs is None:
        zero = x.token_logprobs.new_zeros(())
        return PolicyLossOutput(loss, zero + 1.0, zero, zero)
    return ratio_diagnostics(loss, ratio, clipped, log_ratio, x.mask.to(x.token_logprobs.dtype))


def token_terms(x: PolicyLossInputs):
    """``(u [R, C], ratio, clipped ratio, log ratio)``: the per-token terms of the module docstring."""
    lp = x.token_logprobs
    adv = x.advantages.to(lp.dtype).unsqueeze(-1)
    old = x.old_token_logprobs if x.old_token_logprobs is not None else lp.detach()
    log_ratio = lp - old
    ratio = torch.exp(log_ratio)
    clipped = _clip(ratio, x)
    stale = _stale_rows(x).unsqueeze(-1)
    terms = torch.where(stale, torch.minimum(ratio * adv, clipped * adv), lp * adv)
    return terms, ratio, clipped, log_ratio


def _token_mean_loss(x: PolicyLossInputs, normaliser: torch.Tensor) -> PolicyLossOutput:
    """``-sum_r w_r sum_t m_rt u_rt / normaliser_r`` (``normaliser`` ``[R]`` or a scalar)."""
    maskf = x.mask.to(x.token_logprobs.dtype)
    terms, ratio, clipped, log_ratio = token_terms(x)
    per_row = (terms * maskf).sum(dim=-1) / normaliser
    loss = -(per_row * x.row_weights.to(per_row.dtype)).sum()
    return _diagnostics(x, ratio, clipped, log_ratio, loss)


@register_policy_loss("grpo")
def grpo_loss(x: PolicyLossInputs) -> PolicyLossOutput:
    """GRPO's per-sequence token mean: ``-sum_r w_r (1/|y_r|) sum_t u_rt`` (favours long wrong answers)."""
    lengths = x.mask.to(x.token_logprobs.dtype).sum(dim=-1).clamp_min(1.0)
    return _token_mean_loss(x, lengths)


@register_policy_loss("dr_grpo")
def dr_grpo_loss(x: PolicyLossInputs) -> PolicyLossOutput:
    """Dr. GRPO's constant normaliser: ``-sum_r w_r (1/L) sum_t u_rt`` with ``L = max_length``."""
    if x.max_length is None or x.max_length < 1:
        raise ValueError("the dr_grpo loss needs max_length (the longest completion allowed) >= 1.")
    return _token_mean_loss(x, x.token_logprobs.new_tensor(float(x.max_length)))


@register_policy_loss("dapo")
def dapo_loss(x: PolicyLossInputs) -> PolicyLossOutput:
    """DAPO's token mean over the whole step: ``-sum_r w_r sum_t u_rt / T_B``; with uniform weights
    ``-sum_{r,t} u_rt / (total tokens)``: every token of the step weighs the same."""
    if x.batch_tokens is None or x.batch_tokens <= 0:
        raise ValueError("the dapo loss needs batch_tokens, the step's mean real tokens per row (> 0).")
    return _token_mean_loss(x, x.token_logprobs.new_tensor(float(x.batch_tokens)))


@register_policy_loss("bnpo")
def bnpo_loss(x: PolicyLossInputs) -> PolicyLossOutput:
    """Token mean over this micro-batch: ``-sum_r w_r sum_t u_rt / T_mb``, ``T_mb = sum_r w_r |y_r| / sum_r w_r``."""
    maskf = x.mask.to(x.token_logprobs.dtype)
    weights = x.row_weights.to(maskf.dtype)
    tokens = (weights * maskf.sum(dim=-1)).sum() / weights.sum().clamp_min(1e-30)
    return _token_mean_loss(x, tokens.clamp_min(1.0).detach())


@register_policy_loss("gspo")
def gspo_loss(x: PolicyLossInputs) -> PolicyLossOutput:
    """GSPO: one length-normalised ratio per sequence, ``s_r = exp((1/|y_r|) sum_t (log pi - log pi_old))``,
    clipped at sequence level: ``-sum_r w_r min(s_r A_r, clip(s_r) A_r)``. On-policy rows take
    ``pi_old = stop_grad(pi)`` (s = 1, gradient ``A_r (1/|y_r|) sum_t grad log pi``)."""
    lp = x.token_logprobs
    maskf = x.mask.to(lp.dtype)
    stale = _stale_rows(x).unsqueeze(-1)
    old = torch.where(stale, x.old_token_logprobs, lp.detach()) if x.old_token_logprobs is not None else lp.detach()
    lengths = maskf.sum(dim=-1).clamp_min(1.0)
    log_ratio = ((lp - old) * maskf).sum(dim=-1) / lengths
    ratio = torch.exp(log_ratio)
    clipped = _clip(ratio, x)
    adv = x.advantages.to(lp.dtype)
    loss = -(torch.minimum(ratio * adv, clipped * adv) * x.row_weights.to(lp.dtype)).sum()
    rows = maskf.new_ones(maskf.shape)  # report the sequence ratio on every token of its row
    token_ratio, token_clipped, token_log = ratio.unsqueeze(-1) * rows, clipped.unsqueeze(-1) * rows, log_ratio.unsqueeze(-1) * rows
    return _diagnostics(x, token_ratio, token_clipped, token_log, loss)
