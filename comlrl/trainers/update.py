"""The one policy update every trainer family takes.

``PolicyRows`` are sampled completions with their credit; ``backward_policy_rows`` runs the
micro-batched forward/backward of one optimizer step over them through the agent's optimizer:

    loss = policy loss + reference-KL term   (``loss_type``: one surrogate, and both terms per token
                                             inside the loss's one normaliser, ``comlrl.core.policy_loss``)
         + an auxiliary term from the same forward (a value head on the actor's backbone)

Rows can be masked out of the loss (DAPO's overlong filtering): their tokens count in no term and no
normaliser, the other rows keep their weights.

Settings travel as one frozen ``UpdateSettings`` built once from the config; what the step measured
comes back as a ``PolicyUpdate``. The caller finishes with ``agent.optimizer.step``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

import torch

from comlrl.core.kl import k2_token_kl, stale_token_weights
from comlrl.core.policy_loss import PolicyLoss, PolicyLossInputs, PolicyLossOutput, compute_policy_loss
from comlrl.core.registry import get_policy_loss
from comlrl.models.gradient_checkpointing import scoring_mode
from comlrl.rollout.batch import SequenceBatch, build_sequence_batch
from comlrl.rollout.scoring import CompletionScores, score_completions
from comlrl.trainers import reference_kl
from comlrl.trainers.agent import PolicyAgent


@dataclass(frozen=True)
class UpdateSettings:
    """How a policy update is computed, fixed for a run.

    ``loss``: the registered policy loss; ``clip_low`` / ``clip_high``: the stale rows' ratio clip
    ``[1 - low, 1 + (high or low)]`` (None: unclipped); ``max_length``: Dr. GRPO's constant and the
    length of a truncated completion; ``kl_coef``: the coefficient of the reference-KL loss term (None:
    no term); ``overlong_filtering``: mask completions that reached ``max_length`` without an EOS out
    of the loss (DAPO).
    """

    temperature: float
    loss: PolicyLoss
    clip_low: Optional[float]
    clip_high: Optional[float]
    micro_batch_size: Optional[int]
    max_length: int
    kl_coef: Optional[float]
    overlong_filtering: bool = False

    @classmethod
    def from_config(cls, args: Any, *, has_references: bool, overlong_filtering: bool = False) -> "UpdateSettings":
        """The settings of ``args`` (any RL config: ``loss_type``, ``epsilon_high`` and the clip are every
        family's fields)."""
        return cls(
            temperature=args.temperature, loss=get_policy_loss(args.loss_type), clip_low=args.importance_clip_range,
            clip_high=args.epsilon_high, micro_batch_size=args.update_micro_batch_size, max_length=args.max_new_tokens,
            kl_coef=reference_kl.loss_coef(args, has_references), overlong_filtering=overlong_filtering,
        )


@dataclass
class PolicyRows:
    """Sampled completions with their credit, ready for one optimizer step.

    ``old_logprobs[r]`` are the log-probs recorded when row r was sampled (None if unknown);
    ``stale[r]`` says the agent has stepped since then, so the row is importance-weighted;
    ``reference_logprobs[r]`` are its per-token log-probs under the frozen reference (for the KL loss);
    ``masked[r]`` takes row r out of the loss (``mask_truncated``).
    """

    prompts: List[torch.Tensor] = field(default_factory=list)
    completions: List[torch.Tensor] = field(default_factory=list)
    advantages: List[float] = field(default_factory=list)
    weights: List[float] = field(default_factory=list)
    old_logprobs: List[Optional[torch.Tensor]] = field(default_factory=list)
    stale: List[bool] = field(default_factory=list)
    reference_logprobs: List[Optional[torch.Tensor]] = field(default_factory=list)
    masked: List[bool] = field(default_factory=list)

    def add(self, prompt: torch.Tensor, completion: torch.Tensor, advantage: float, weight: float,
            old: Optional[torch.Tensor] = None, stale: bool = False, reference: Optional[torch.Tensor] = None) -> None:
        if stale and old is None:
            raise ValueError(
                "a stale sample (drawn before its agent's last optimizer step) needs its sampling log-probs for the "
                "importance ratio; the generation backend returned none."
            )
        self.prompts.append(prompt)
        self.completions.append(completion)
        self.advantages.append(float(advantage))
        self.weights.append(float(weight))
        self.old_logprobs.append(old)
        self.stale.append(bool(stale))
        self.reference_logprobs.append(reference)
        self.masked.append(False)

    def __len__(self) -> int:
        return len(self.completions)

    def tokens(self) -> int:
        """Real completion tokens of the rows the loss counts."""
        return sum(len(c) for c, masked in zip(self.completions, self.masked) if not masked)

    def mask_truncated(self, max_length: int, eos_ids: Any) -> None:
        """Take out of the loss every completion that reached ``max_length`` tokens without ending in one
        of ``eos_ids`` (truncated by the length limit, not finished: DAPO's overlong filtering)."""
        eos = {int(i) for i in eos_ids}
        self.masked = [m or (len(c) >= max(max_length, 1) and int(c[-1]) not in eos) for c, m in zip(self.completions, self.masked)]


class AuxiliaryLoss(Protocol):
    """A second objective computed from the same forward as the policy loss (e.g. a value head on
    the policy's backbone). Called per micro-batch with the scores (hidden states included), the
    batch, and the slice of ``rows`` it holds; returns the loss term and metrics to sum."""

    final_state: bool  # the batch must include each row's state after its whole completion

    def __call__(self, scores: CompletionScores, batch: SequenceBatch, rows: slice) -> Tuple[torch.Tensor, Dict[str, float]]: ...


@dataclass(frozen=True)
class PolicyUpdate:
    """What one optimizer step's backward measured: the loss (summed over micro-batches), the per-token
    entropy, the mean completion length; over rows with sampling log-probs the importance ratio, its
    clipped fraction, the k3 KL(pi_old || pi), the stale fraction and the sampler mismatch; the KL
    term's value; the auxiliary term's metrics."""

    loss: float
    entropy: float
    completion_length: float
    ratio: Optional[float] = None
    clip_fraction: Optional[float] = None
    approx_kl: Optional[float] = None
    stale_fraction: Optional[float] = None
    logprob_mismatch: Optional[float] = None
    kl_loss: Optional[float] = None
    overlong_filtered_fraction: Optional[float] = None
    auxiliary: Mapping[str, float] = field(default_factory=dict)

    def metrics(self) -> Dict[str, float]:
        """The logged values by name (absent ones left out)."""
        out = {"loss": self.loss, "entropy": self.entropy, "completion_length": self.completion_length}
        for name in ("ratio", "clip_fraction", "approx_kl", "stale_fraction", "logprob_mismatch", "kl_loss",
                     "overlong_filtered_fraction"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out.update(self.auxiliary)
        return out


@dataclass
class _Totals:
    """Sums over the micro-batches of one optimizer step (token-weighted where they are means)."""

    loss: float = 0.0
    entropy: float = 0.0
    tokens: float = 0.0
    counted_tokens: float = 0.0
    ratio: float = 0.0
    clip_fraction: float = 0.0
    approx_kl: float = 0.0
    mismatch: float = 0.0
    fresh_tokens: float = 0.0
    kl_loss: Optional[float] = None
    auxiliary: Dict[str, float] = field(default_factory=dict)

    def add(self, micro: "MicroBatch", stale: Sequence[bool]) -> None:
        output, scores, batch, old = micro.output, micro.scores, micro.batch, micro.old
        if old is not None:
            gap, count = sampler_mismatch(scores.logprobs, old, batch.mask, stale)
            self.mismatch += gap
            self.fresh_tokens += count
        counted = float(micro.loss_mask.sum())  # the ratio diagnostics are means over the loss's tokens
        self.loss += float(output.loss.detach())
        self.entropy += float((scores.entropy * batch.mask).sum())
        self.tokens += float(batch.mask.sum())
        self.counted_tokens += counted
        self.ratio += float(output.ratio_mean) * counted
        self.clip_fraction += float(output.clip_fraction) * counted
        self.approx_kl += float(output.approx_kl) * counted
        if output.kl_loss is not None:
            self.kl_loss = (self.kl_loss or 0.0) + float(output.kl_loss.detach())

    def result(self, rows: PolicyRows, overlong_filtering: bool) -> PolicyUpdate:
        tokens = max(self.tokens, 1.0)
        counted = max(self.counted_tokens, 1.0)
        count = max(len(rows), 1)
        diagnostics: Dict[str, Optional[float]] = {}
        if any(o is not None for o in rows.old_logprobs):
            # over every row with sampling log-probs: on fresh rows the ratio only measures how closely
            # scoring reproduces the sampling log-probs (1 up to float noise)
            diagnostics = dict(stale_fraction=sum(rows.stale) / count,
                               logprob_mismatch=self.mismatch / self.fresh_tokens if self.fresh_tokens else None)
            if self.counted_tokens:  # the ratio's means over the tokens the loss counted (none: not logged)
                diagnostics.update(ratio=self.ratio / counted, clip_fraction=self.clip_fraction / counted,
                                   approx_kl=self.approx_kl / counted)
        if overlong_filtering:
            diagnostics["overlong_filtered_fraction"] = sum(rows.masked) / count
        return PolicyUpdate(self.loss, self.entropy / tokens, self.tokens / count, kl_loss=self.kl_loss,
                            auxiliary=dict(self.auxiliary), **diagnostics)


@dataclass
class MicroBatch:
    """One micro-batch's forward and loss: what its metrics are read from."""

    loss: torch.Tensor
    output: PolicyLossOutput
    scores: CompletionScores
    batch: SequenceBatch
    old: Optional[torch.Tensor]  # the sampling log-probs, [R, C] (None when no row has any)
    loss_mask: torch.Tensor  # [R, C]: batch.mask without the rows masked out of the loss


def step_tokens(rows: PolicyRows, sum_over_ranks: Any = None) -> float:
    """The mean real tokens per row over one optimizer step's rows (every data-parallel rank's, when
    ``sum_over_ranks(*tensors)`` is given; a row masked out of the loss counts as a row of no tokens):
    the "step_tokens" normaliser (DAPO's token mean over the tokens the loss counts). A step whose
    every row is masked out has no term to divide: 1.0 then, and its loss and gradient are 0."""
    tokens, count = torch.tensor([float(rows.tokens())]), torch.tensor([float(len(rows))])
    if sum_over_ranks is not None:
        tokens, count = sum_over_ranks(tokens, count)
    if float(tokens[0]) == 0.0:  # every row masked out (all truncated): every term is 0, whatever divides it
        return 1.0
    return float(tokens[0]) / max(float(count[0]), 1.0)


def backward_policy_rows(agent: PolicyAgent, rows: PolicyRows, settings: UpdateSettings, *, label: str,
                         sum_over_ranks: Any = None, auxiliary: Optional[AuxiliaryLoss] = None) -> PolicyUpdate:
    """Forward and backward ``settings.loss`` over ``rows`` (plus the reference-KL term and
    ``auxiliary``'s term, from the same forward) through ``agent.optimizer``.

    Rows marked stale are importance-weighted with their sampling log-probs and clipped; the others
    take the plain on-policy loss. A loss with the "step_tokens" normaliser divides by the whole
    step's mean tokens per row (``step_tokens``, summed over data-parallel ranks with
    ``sum_over_ranks``). With ``settings.kl_coef`` every token adds ``kl_coef * k2_token_kl`` inside the
    policy loss's aggregation (the same ``w_r / n_r``); on stale rows each token of that term is weighted
    by the detached, untruncated ``pi / pi_old``, so it estimates the current policy's KL gradient
    without bias. With ``settings.overlong_filtering`` truncated completions are masked out of the loss
    (``PolicyRows.mask_truncated``). Dropout is off (eval mode), as in sampling.
    Raises FloatingPointError on a non-finite loss.
    """
    scoring_mode(agent.model)
    size = settings.micro_batch_size or len(rows)
    if settings.overlong_filtering:
        rows.mask_truncated(settings.max_length, agent.eos_ids)
    step_token_mean = step_tokens(rows, sum_over_ranks) if settings.loss.needs_step_tokens else None
    totals = _Totals()
    for start in range(0, len(rows), size):
        stop = min(start + size, len(rows))
        micro = _micro_batch_loss(agent, rows, slice(start, stop), settings, step_token_mean, auxiliary, totals)
        if not torch.isfinite(micro.loss):
            raise FloatingPointError(
                f"{label}: the policy loss is {float(micro.loss.detach())}. Check that rewards are finite and of a sane "
                f"scale, lower the learning rate, or set max_grad_norm."
            )
        agent.optimizer.backward(micro.loss, last=stop == len(rows))
        totals.add(micro, rows.stale[start:stop])
    return totals.result(rows, settings.overlong_filtering)


def _micro_batch_loss(agent: PolicyAgent, rows: PolicyRows, at: slice, settings: UpdateSettings, step_token_mean: Optional[float],
                      auxiliary: Optional[AuxiliaryLoss], totals: "_Totals") -> MicroBatch:
    """One micro-batch's forward and loss (the auxiliary term's metrics added to ``totals``)."""
    batch = build_sequence_batch(rows.prompts[at], rows.completions[at], agent.pad_id, agent.device,
                                 final_state=auxiliary is not None and auxiliary.final_state)
    with agent.autocast():
        scores = score_completions(agent.model, batch, settings.temperature, with_entropy=True, with_hidden_states=auxiliary is not None)
    old = _old_logprob_tensor(rows.old_logprobs[at], scores.logprobs)
    stale = torch.tensor(rows.stale[at], dtype=torch.bool, device=agent.device)
    weights = torch.tensor(rows.weights[at], device=agent.device)
    loss_mask = batch.mask
    if any(rows.masked[at]):
        keep = torch.tensor([not m for m in rows.masked[at]], dtype=batch.mask.dtype, device=batch.mask.device)
        loss_mask = batch.mask * keep.unsqueeze(1)
    kl_terms = None
    if settings.kl_coef is not None:
        token_weights = None
        if old is not None and bool(stale.any()):  # samples from an older policy: importance-weight the KL too
            token_weights = stale_token_weights(scores.logprobs, old, stale)
        kl_terms = k2_token_kl(scores.logprobs, _reference_tensor(scores.logprobs, rows, at), token_weights)
    inputs = PolicyLossInputs(scores.logprobs, loss_mask, torch.tensor(rows.advantages[at], device=agent.device), weights,
                              old_token_logprobs=old, importance_rows=stale, clip_low=settings.clip_low, clip_high=settings.clip_high,
                              max_length=settings.max_length, step_tokens=step_token_mean, kl_terms=kl_terms,
                              kl_coef=settings.kl_coef or 0.0)
    output = compute_policy_loss(inputs, settings.loss)
    loss = output.loss
    if auxiliary is not None:
        extra, extra_metrics = auxiliary(scores, batch, at)
        loss = loss + extra
        for key, value in extra_metrics.items():
            totals.auxiliary[key] = totals.auxiliary.get(key, 0.0) + value
    return MicroBatch(loss, output, scores, batch, old, loss_mask)


def _reference_tensor(logprobs: torch.Tensor, rows: PolicyRows, at: slice) -> torch.Tensor:
    """``[R, C]`` reference log-probs of the rows of ``rows[at]``, padded to ``logprobs``."""
    reference = torch.zeros_like(logprobs, dtype=torch.float32)
    for r, ref in enumerate(rows.reference_logprobs[at]):
        if ref is None:
            raise ValueError("reference_kl_mode='loss' needs each row's reference log-probs; this row was sampled without them.")
        n = min(reference.shape[1], len(ref))
        reference[r, :n] = ref[:n].to(reference.device)
    return reference


def _old_logprob_tensor(olds: Sequence[Optional[torch.Tensor]], current: torch.Tensor) -> Optional[torch.Tensor]:
    """``[R, C]`` sampling log-probs; rows without any take the current ones (ratio exactly 1)."""
    if all(o is None for o in olds):
        return None
    out = current.detach().clone()
    width = out.shape[1]
    for r, old in enumerate(olds):
        if old is not None:
            n = min(width, len(old))
            out[r, :n] = old[:n].to(out.device)
    return out


def sampler_mismatch(logprobs: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, stale: Sequence[bool]) -> Tuple[float, float]:
    """``(sum over fresh rows' tokens of |log pi_scored - log pi_sampler|, their token count)``: how far
    the trainer's scores are from the log-probs the generation backend recorded for the same policy."""
    fresh = torch.tensor([not s for s in stale], dtype=mask.dtype, device=mask.device).unsqueeze(1) * mask
    return float(((logprobs.detach() - old).abs() * fresh).sum()), float(fresh.sum())
