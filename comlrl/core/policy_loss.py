"""Policy losses: one per-token surrogate, one aggregation, and the registered losses that pair them.

Shapes: R rows (one sampled completion each), C completion positions; ``mask[r, t]`` is 1 for real
completion tokens (EOS included). A policy loss is two choices, kept apart as in verl's
``compute_policy_loss`` / ``agg_loss``:

1. the **surrogate** ``u_rt``, the objective of token t of row r (to be maximised):

       on-policy rows:  u_rt = A_r * log pi(y_rt)                 (gradient A_r grad log pi)
       stale rows:      u_rt = min(rho_rt A_r, clip(rho_rt, 1 - eps_low, 1 + eps_high) A_r)

   with ``rho_rt = pi(y_rt) / pi_old(y_rt)`` (``token_surrogate``); at rho = 1 both have the same
   gradient, so a run with nothing stale is on-policy REINFORCE. GSPO replaces rho_rt by one
   length-normalised ratio per sequence (``sequence_surrogate``);

2. the **normaliser** ``n_r`` that turns a row's token sum into its share of the loss
   (``aggregate``)::

       L = - sum_r w_r (1 / n_r) sum_t m_rt (u_rt - beta k_rt)

   ``row_weights`` ``w_r`` carry the trainer's weighting of rows (MAGRPO: ``1 / (K G)``); ``k_rt`` is
   an optional per-token regulariser with coefficient ``beta`` (the reference-KL loss term,
   ``core.kl.k2_token_kl``), aggregated *inside* the same normaliser as in GRPO's objective and TRL,
   so that for one beta the ratio of the KL gradient to the policy gradient is the same for every loss.

| name           | surrogate | normaliser ``n_r``                                    | source |
|----------------|-----------|-------------------------------------------------------|--------|
| "sequence_sum" | token     | "none": 1 (CoMLRL 1.4.3, the default)                 | MAGRPO |
| "grpo"         | token     | "sequence_length": ``|y_r|``                          | GRPO, Shao et al. 2024 |
| "dr_grpo"      | token     | "max_length": L = ``max_length``                      | Dr. GRPO, Liu et al. 2025 |
| "dapo"         | token     | "step_tokens": T_B, the optimizer step's mean tokens per row | DAPO, Yu et al. 2025 |
| "bnpo"         | token     | "micro_batch_tokens": the micro-batch's mean tokens per row | TRL ``loss_type="bnpo"`` |
| "gspo"         | sequence  | "sequence_length"                                     | GSPO, Zheng et al. 2025 |

A new loss is one ``register_policy_loss(name, normaliser=...)`` call on a surrogate function
(``PolicyLossInputs -> Surrogate``); nothing else names it. Facts of one loss that a config needs
live on its record: GSPO's own clip range ``(3e-4, 4e-4)`` (``PolicyLoss.clip_range``, the GSPO
paper's section 5.1) is what ``importance_clip_range`` / ``epsilon_high`` default to under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import torch

from comlrl.core.registry import POLICY_LOSSES, get_policy_loss

NORMALISERS = ("none", "sequence_length", "max_length", "step_tokens", "micro_batch_tokens")
"""How a row's token sum is divided (see the module docstring)."""


@dataclass
class PolicyLossInputs:
    """Everything a surrogate and a normaliser may use (tensors and plain numbers only).

    ``token_logprobs`` ``[R, C]`` (with grad); ``mask`` ``[R, C]``; ``advantages`` ``[R]``;
    ``row_weights`` ``[R]``; ``old_token_logprobs`` ``[R, C]`` or None (sampling log-probs, the current
    ones where unknown); ``importance_rows`` ``[R]`` bool, the stale rows (None: all rows with
    ``old_token_logprobs``); ``clip_low`` / ``clip_high`` the ratio's clip range ``[1 - low, 1 + high]``
    (None: unclipped); ``max_length`` the longest completion allowed (Dr. GRPO's constant);
    ``step_tokens`` the mean count of real tokens per row over the whole optimizer step (all
    micro-batches and ranks): DAPO's normaliser; ``kl_terms`` ``[R, C]`` an optional per-token
    regulariser (the reference-KL loss, importance-weighted on stale rows) and ``kl_coef`` its weight.
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
    step_tokens: Optional[float] = None
    kl_terms: Optional[torch.Tensor] = None
    kl_coef: float = 0.0


@dataclass
class Surrogate:
    """The per-token objective ``u`` ``[R, C]`` (with grad) and the ratio diagnostics' inputs: the
    ratio, the clipped ratio and the log ratio (``[R, C]`` each, detached use only)."""

    objective: torch.Tensor
    ratio: torch.Tensor
    clipped_ratio: torch.Tensor
    log_ratio: torch.Tensor


@dataclass
class PolicyLossOutput:
    """The loss and the diagnostics of one policy-gradient minibatch (all detached but ``loss``);
    ``normaliser`` is the ``n_r`` it was aggregated with (``[R]`` or a scalar); ``kl_loss`` the
    regulariser's part of ``loss``, ``kl_coef * aggregate(kl_terms)`` (None without one)."""

    loss: torch.Tensor
    ratio_mean: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    normaliser: Union[torch.Tensor, float] = 1.0
    kl_loss: Optional[torch.Tensor] = None


SurrogateFn = Callable[["PolicyLossInputs"], "Surrogate"]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: its surrogate function, its normaliser (one of ``NORMALISERS``) and,
    when the method publishes one, its own clip range ``(low, high)``: the defaults of
    ``importance_clip_range`` and ``epsilon_high`` under this loss (None: the configs' own defaults)."""

    name: str
    surrogate: Callable[[PolicyLossInputs], Surrogate]
    normaliser: str
    clip_range: Optional[Tuple[float, float]] = None

    @property
    def needs_step_tokens(self) -> bool:
        """Whether the caller must supply ``PolicyLossInputs.step_tokens`` (a whole-step statistic)."""
        return self.normaliser == "step_tokens"


# ----------------------------------------------------------------------------- the surrogates


def stale_rows(x: PolicyLossInputs) -> torch.Tensor:
    """``[R]`` bool: the rows that take the importance-weighted surrogate."""
    rows = x.token_logprobs.shape[0]
    if x.old_token_logprobs is None:
        return torch.zeros(rows, dtype=torch.bool, device=x.token_logprobs.device)
    if x.importance_rows is None:
        return torch.ones(rows, dtype=torch.bool, device=x.token_logprobs.device)
    return x.importance_rows.to(torch.bool)


def upper_clip_bound(clip_low: Optional[float], clip_high: Optional[float]) -> Optional[float]:
    """``1 + (clip_high or clip_low)``: the upper bound of a stale ratio (None: unclipped)."""
    if clip_low is None and clip_high is None:
        return None
    return 1.0 + (clip_high if clip_high is not None else clip_low)


def clip_ratio(ratio: torch.Tensor, clip_low: Optional[float], clip_high: Optional[float]) -> torch.Tensor:
    """``clip(ratio, 1 - clip_low, 1 + (clip_high or clip_low))`` (unchanged when both are None)."""
    high = upper_clip_bound(clip_low, clip_high)
    if high is None:
        return ratio
    low = 1.0 - clip_low if clip_low is not None else 0.0
    return ratio.clamp(low, high)


def token_surrogate(x: PolicyLossInputs) -> Surrogate:
    """The token-level surrogate of the module docstring: ``A_r log pi(y_rt)`` on fresh rows, the
    clipped importance-weighted ``min(rho A, clip(rho) A)`` on stale ones."""
    lp = x.token_logprobs
    adv = x.advantages.to(lp.dtype).unsqueeze(-1)
    old = x.old_token_logprobs if x.old_token_logprobs is not None else lp.detach()
    log_ratio = lp - old
    ratio = torch.exp(log_ratio)
    clipped = clip_ratio(ratio, x.clip_low, x.clip_high)
    stale = stale_rows(x).unsqueeze(-1)
    objective = torch.where(stale, torch.minimum(ratio * adv, clipped * adv), lp * adv)
    return Surrogate(objective, ratio, clipped, log_ratio)


def sequence_surrogate(x: PolicyLossInputs) -> Surrogate:
    """GSPO's sequence-level surrogate: one ratio per row, ``s_r = exp((1/|y_r|) sum_t (log pi - log pi_old))``,
    and ``min(s_r A_r, clip(s_r) A_r)`` on every token of the row (so the per-sequence mean of
    ``aggregate`` gives it back once per row). Fresh rows take ``pi_old = stop_grad(pi)``: s = 1 with
    gradient ``A_r (1/|y_r|) sum_t grad log pi``."""
    lp = x.token_logprobs
    maskf = x.mask.to(lp.dtype)
    stale = stale_rows(x).unsqueeze(-1)
    old = torch.where(stale, x.old_token_logprobs, lp.detach()) if x.old_token_logprobs is not None else lp.detach()
    lengths = maskf.sum(dim=-1).clamp_min(1.0)
    log_ratio = ((lp - old) * maskf).sum(dim=-1) / lengths
    ratio = torch.exp(log_ratio)
    clipped = clip_ratio(ratio, x.clip_low, x.clip_high)
    adv = x.advantages.to(lp.dtype)
    row = torch.minimum(ratio * adv, clipped * adv)
    ones = maskf.new_ones(maskf.shape)  # each row's values on every one of its tokens
    return Surrogate(row.unsqueeze(-1) * ones, ratio.unsqueeze(-1) * ones, clipped.unsqueeze(-1) * ones, log_ratio.unsqueeze(-1) * ones)


# ----------------------------------------------------------------------------- normaliser and aggregation


def normaliser(kind: str, x: PolicyLossInputs) -> Union[torch.Tensor, float]:
    """``n_r`` of ``aggregate`` for the normaliser ``kind`` (``[R]`` or a scalar; see the module docstring)."""
    maskf = x.mask.to(x.token_logprobs.dtype)
    if kind == "none":
        return 1.0
    if kind == "sequence_length":
        return maskf.sum(dim=-1).clamp_min(1.0)
    if kind == "max_length":
        if x.max_length is None or x.max_length < 1:
            raise ValueError("the max_length normaliser needs max_length (the longest completion allowed) >= 1.")
        return float(x.max_length)
    if kind == "step_tokens":
        if x.step_tokens is None or x.step_tokens <= 0:
            raise ValueError("the step_tokens normaliser needs step_tokens, the step's mean real tokens per row (> 0).")
        return float(x.step_tokens)
    if kind == "micro_batch_tokens":
        weights = x.row_weights.to(maskf.dtype)
        tokens = (weights * maskf.sum(dim=-1)).sum() / weights.sum().clamp_min(1e-30)
        return tokens.clamp_min(1.0).detach()
    raise ValueError(f"unknown normaliser {kind!r}; use one of {', '.join(NORMALISERS)}.")


def aggregate(values: torch.Tensor, mask: torch.Tensor, row_weights: torch.Tensor, n: Union[torch.Tensor, float]) -> torch.Tensor:
    """``sum_r w_r (1 / n_r) sum_t m_rt values_rt``: the one aggregation of per-token terms (the
    policy surrogate, the reference-KL term) into a scalar."""
    per_row = (values * mask.to(values.dtype)).sum(dim=-1)
    if not (isinstance(n, float) and n == 1.0):
        per_row = per_row / n
    return (per_row * row_weights.to(per_row.dtype)).sum()


def ratio_diagnostics(loss: torch.Tensor, s: Surrogate, x: PolicyLossInputs, n: Union[torch.Tensor, float] = 1.0,
                      kl_loss: Optional[torch.Tensor] = None) -> PolicyLossOutput:
    """``loss`` with the per-token means over the mask of the ratio, of the clipped fraction, and of the
    k3 estimate of KL(pi_old || pi), ``(rho - 1) - log rho`` (1, 0, 0 without sampling log-probs)."""
    with torch.no_grad():
        if x.old_token_logprobs is None:
            zero = x.token_logprobs.new_zeros(())
            return PolicyLossOutput(loss, zero + 1.0, zero, zero, n, kl_loss)
        maskf = x.mask.to(x.token_logprobs.dtype)
        count = maskf.sum().clamp_min(1.0)
        ratio_mean = (s.ratio * maskf).sum() / count
        clip_fraction = (((s.ratio - s.clipped_ratio).abs() > 0).to(maskf.dtype) * maskf).sum() / count
        approx_kl = (((s.ratio - 1.0) - s.log_ratio) * maskf).sum() / count
    return PolicyLossOutput(loss, ratio_mean, clip_fraction, approx_kl, n, kl_loss)


def compute_policy_loss(x: PolicyLossInputs, loss: PolicyLoss) -> PolicyLossOutput:
    """``-aggregate(u - kl_coef * k)`` of ``loss`` over the rows of ``x`` (``k = x.kl_terms``, when
    given), with its diagnostics. The aggregation is linear, so it is computed as the policy part plus
    ``kl_coef * aggregate(k)`` with the same normaliser (without a regulariser the policy part alone,
    bit for bit)."""
    surrogate = loss.surrogate(x)
    n = normaliser(loss.normaliser, x)
    total = -aggregate(surrogate.objective, x.mask, x.row_weights, n)
    kl_loss = None
    if x.kl_terms is not None:
        kl_loss = x.kl_coef * aggregate(x.kl_terms, x.mask, x.row_weights, n)
        total = total + kl_loss
    return ratio_diagnostics(total, surrogate, x, n, kl_loss)


def policy_gradient_loss(
    token_logprobs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    row_weights: torch.Tensor,
    old_token_logprobs: Optional[torch.Tensor] = None,
    clip_range: Optional[float] = None,
    importance_rows: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """CoMLRL 1.4.3's loss ("sequence_sum"): REINFORCE with a baseline, importance-weighted and clipped
    on stale rows,

        L = - sum_r w_r sum_t m_rt u_rt    (u: ``token_surrogate`` with clip range ``clip_range``)

    Without ``old_token_logprobs`` every row is on-policy; with them and no ``importance_rows``, every
    row takes the surrogate. Returns the loss and, over the rows with ``old_token_logprobs``, the mean
    ratio, the fraction of tokens outside the clip range and the k3 estimate of KL(pi_old || pi).
    """
    inputs = PolicyLossInputs(token_logprobs, mask, advantages, row_weights, old_token_logprobs, importance_rows,
                              clip_low=clip_range)
    return compute_policy_loss(inputs, get_policy_loss("sequence_sum"))


def register_policy_loss(name: str, *, normaliser: str, clip_range: Optional[Tuple[float, float]] = None,
                         replace: bool = False) -> Callable[[SurrogateFn], SurrogateFn]:
    """Decorator: register the surrogate ``fn(inputs: PolicyLossInputs) -> Surrogate`` with ``normaliser``
    (one of ``NORMALISERS``) as the policy loss ``name``, selected by ``loss_type=name``. ``clip_range``
    ``(low, high)``: the loss's own stale-ratio clip, the default of ``importance_clip_range`` /
    ``epsilon_high`` when a config sets neither::

        @register_policy_loss("my_loss", normaliser="sequence_length")
        def my_surrogate(x):                  # PolicyLossInputs -> Surrogate
            s = token_surrogate(x)
            return Surrogate(s.objective.clamp(min=-5.0), s.ratio, s.clipped_ratio, s.log_ratio)
    """
    if normaliser not in NORMALISERS:
        raise ValueError(f"register_policy_loss({name!r}): normaliser={normaliser!r} must be one of {', '.join(NORMALISERS)}.")
    if clip_range is not None and (len(clip_range) != 2 or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 for c in clip_range)):
        raise ValueError(f"register_policy_loss({name!r}): clip_range={clip_range!r} must be two positive floats (low, high) or None.")

    def decorate(fn: SurrogateFn) -> SurrogateFn:
        if not callable(fn):
            raise TypeError(f"only a callable surrogate can be registered as policy loss {name!r}, got {type(fn).__name__}.")
        existing = POLICY_LOSSES.find(name)
        record = PolicyLoss(name, fn, normaliser, None if clip_range is None else (float(clip_range[0]), float(clip_range[1])))
        POLICY_LOSSES.register(name, replace=replace or existing == record)(record)
        return fn

    return decorate


for _name, _normaliser in (("sequence_sum", "none"), ("grpo", "sequence_length"), ("dr_grpo", "max_length"),
                           ("dapo", "step_tokens"), ("bnpo", "micro_batch_tokens")):
    register_policy_loss(_name, normaliser=_normaliser)(token_surrogate)
# GSPO clips its length-normalised sequence ratio at 1 - 3e-4 and 1 + 4e-4 (Zheng et al. 2025, section
# 5.1, the left and right ranges of its objective); a token-level 0.2 would almost never clip it.
register_policy_loss("gspo", normaliser="sequence_length", clip_range=(3e-4, 4e-4))(sequence_surrogate)
del _name, _normaliser
