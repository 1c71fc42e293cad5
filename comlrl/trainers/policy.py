"""What every policy-gradient trainer does with one agent: sample, score, and take gradient steps.

``PolicyAgent`` bundles an agent's model, tokenizer, sampler, optimizer and optional frozen reference.
``PolicyRows`` is a batch of sampled completions with their advantages; ``backward_policy_rows``
runs the batched forward/backward of the policy-gradient loss over them (in row micro-batches).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, ContextManager, Dict, List, Optional, Protocol, Sequence, Tuple

import torch
import torch.nn as nn

from comlrl.core.kl import k2_token_kl_loss, sequence_kl, sequence_log_ratio, stale_token_weights
from comlrl.core.policy_losses import PolicyLossInputs, upper_clip_bound
from comlrl.core.registry import get_policy_loss
from comlrl.models.gradient_checkpointing import scoring_mode
from comlrl.models.loading import frozen_copy, model_device
from comlrl.models.lora import adapter_free_reference
from comlrl.models.precision import Precision
from comlrl.models.tokenizers import pad_token_id
from comlrl.rollout.batch import SequenceBatch, build_sequence_batch
from comlrl.rollout.generation import Completions, GenerationBackend, HFGenerator
from comlrl.rollout.scoring import CompletionScores, score_completions
from comlrl.trainers.optim import AgentOptimizer


class PolicyAgent:
    """One agent: model, tokenizer, sampler, optimizer, optional frozen reference.

    ``precision`` decides the compute dtype of its forwards (``autocast()``); ``generator`` is the
    sampling backend (Hugging Face ``generate`` unless a trainer installs another one).
    """

    def __init__(self, index: int, model: nn.Module, tokenizer: Any, device: torch.device, reference: Optional[nn.Module] = None,
                 precision: Optional[Precision] = None):
        self.index = index
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.reference = reference
        self.precision = precision
        self.pad_id = pad_token_id(tokenizer)
        self.generator: GenerationBackend = HFGenerator(model, tokenizer, device, autocast=self.autocast)
        self.optimizer: Optional[AgentOptimizer] = None

    def autocast(self) -> ContextManager:
        """The compute-dtype context of this agent's forwards (a no-op unless mixed precision)."""
        return self.precision.autocast(self.device) if self.precision is not None else contextlib.nullcontext()

    def token_logprobs(self, model: nn.Module, prompts: Sequence[torch.Tensor], completions: Sequence[torch.Tensor], temperature: float) -> torch.Tensor:
        """``[R, C]`` log-probs of the completions under ``model`` (no grad, eval mode)."""
        device = model_device(model)
        batch = build_sequence_batch(prompts, completions, self.pad_id, device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), self.autocast():
                logprobs = score_completions(model, batch, temperature).logprobs
        finally:
            model.train(was_training)
        return (logprobs * batch.mask).cpu()

    @property
    def version(self) -> int:
        """Optimizer steps this agent has taken: a sample drawn at another version is stale."""
        return self.optimizer.updates if self.optimizer is not None else 0

    def rollout_extras(self, completions: Completions, temperature: float, *, reference_kl: bool) -> Dict[str, Any]:
        """Per row of ``completions`` (when asked and a reference exists): ``reference_kl``, the k3 estimate
        of KL(pi || pi_ref) (logged), and ``reference_log_ratio``, k1 = log pi - log pi_ref (the penalty:
        see ``core.kl.sequence_log_ratio``) and ``reference_logprobs``, each row's per-token reference
        log-probs (the KL loss of ``reference_kl_mode="loss"``). The policy's side is the log-probs recorded while sampling;
        only greedy completions (which record none) need a forward of the policy."""
        if not (reference_kl and self.reference is not None):
            return {}
        prompts = [completions.prompt_of_row(r) for r in range(len(completions.tokens))]
        reference = self.token_logprobs(self.reference, prompts, completions.tokens, temperature)
        if completions.logprobs is not None:
            policy = torch.zeros_like(reference)
            for r, logprobs in enumerate(completions.logprobs):
                policy[r, : len(logprobs)] = logprobs
        else:
            policy = self.token_logprobs(self.model, prompts, completions.tokens, temperature)
        mask = torch.zeros_like(policy)
        for r, t in enumerate(completions.tokens):
            mask[r, : len(t)] = 1.0
        return {"reference_kl": sequence_kl(policy, reference, mask), "reference_log_ratio": sequence_log_ratio(policy, reference, mask),
                "reference_logprobs": [reference[r, : len(t)].clone() for r, t in enumerate(completions.tokens)]}


def build_references(
    agents: Sequence[nn.Module], sources: Sequence[Any], devices: Sequence[torch.device], dtype: Optional[torch.dtype] = None
) -> List[nn.Module]:
    """Frozen copies of the initial agents (in ``dtype`` when given); agents loaded from the same id
    share one reference. An agent that is a LoRA adapter over a frozen base gets its initial policy
    over that base instead of a copy (``SharedBase.reference_module``)."""
    shared: Dict[Any, nn.Module] = {}
    references = []
    for model, source, device in zip(agents, sources, devices):
        reference = adapter_free_reference(model)  # each adapter's own initial policy, never shared by source
        if reference is not None:
            references.append(reference)
            continue
        key = (source, device) if isinstance(source, str) else None
        if key is not None and key in shared:
            references.append(shared[key])
            continue
        if reference is None:
            reference = frozen_copy(model, device, dtype)
        if key is not None:
            shared[key] = reference
        references.append(reference)
    return references


@dataclass
class PolicyRows:
    """Sampled completions with their credit, ready for one optimizer step.

    ``old_logprobs[r]`` are the log-probs recorded when row r was sampled (None if unknown);
    ``stale[r]`` says the agent has stepped since then, so the row is importance-weighted;
    ``reference_logprobs[r]`` are its per-token log-probs under the frozen reference (for the KL loss).
    """

    prompts: List[torch.Tensor] = field(default_factory=list)
    completions: List[torch.Tensor] = field(default_factory=list)
    advantages: List[float] = field(default_factory=list)
    weights: List[float] = field(default_factory=list)
    old_logprobs: List[Optional[torch.Tensor]] = field(default_factory=list)
    stale: List[bool] = field(default_factory=list)
    reference_logprobs: List[Optional[torch.Tensor]] = field(default_factory=list)

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

    def __len__(self) -> int:
        return len(self.completions)


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


class AuxiliaryLoss(Protocol):
    """A second objective computed from the same forward as the policy loss (e.g. a value head on
    the policy's backbone). Called per micro-batch with the scores (hidden states included), the
    batch, and the slice of ``rows`` it holds; returns the loss term and metrics to sum."""

    final_state: bool  # the batch must include each row's state after its whole completion

    def __call__(self, scores: CompletionScores, batch: SequenceBatch, rows: slice) -> Tuple[torch.Tensor, Dict[str, float]]: ...


def backward_policy_rows(
    agent: PolicyAgent,
    rows: PolicyRows,
    *,
    temperature: float,
    clip_range: Optional[float],
    micro_batch_size: Optional[int],
    label: str,
    auxiliary: Optional[AuxiliaryLoss] = None,
    kl_coef: Optional[float] = None,
    loss_type: str = "sequence_sum",
    clip_high: Optional[float] = None, max_length: Optional[int] = None, batch_tokens: Optional[float] = None,
) -> Dict[str, float]:
    """Forward and backward the policy loss registered as ``loss_type`` over ``rows`` (plus
    ``auxiliary``'s term, from the same forward) through ``agent.optimizer`` (the caller finishes with
    ``agent.optimizer.step``).

    With ``kl_coef``, every row with reference log-probs adds ``kl_coef * w_r * k2_token_kl_loss`` (the
    reference KL as its own loss term, ``reference_kl_mode="loss"``); a row without them is refused.
    On stale rows each token of that term is weighted by ``pi / pi_old`` (detached, truncated at the
    upper clip), so it estimates the current policy's KL gradient.

    Rows marked stale are importance-weighted with their sampling log-probs and clipped to
    ``[1 - clip_range, 1 + (clip_high or clip_range)]``; the others take the plain on-policy loss.
    ``max_length`` and ``batch_tokens`` are the normalisers of the token-mean losses (``batch_tokens``
    defaults to the weighted mean length of ``rows``). Dropout is off (eval mode), as in sampling.
    Raises FloatingPointError on a non-finite loss.
    """
    scoring_mode(agent.model)
    size = micro_batch_size or len(rows)
    loss_fn = get_policy_loss(loss_type)
    batch_tokens = weighted_mean_length(rows) if batch_tokens is None else batch_tokens
    totals = {"loss": 0.0, "entropy": 0.0, "ratio": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "tokens": 0.0}
    extra_totals: Dict[str, float] = {}
    for start in range(0, len(rows), size):
        stop = min(start + size, len(rows))
        loss, output, scores, batch, old = _micro_batch_loss(
            agent, rows, slice(start, stop), temperature=temperature, auxiliary=auxiliary, kl_coef=kl_coef,
            loss_fn=loss_fn, totals=totals, extra_totals=extra_totals,
            settings=dict(clip_low=clip_range, clip_high=clip_high, max_length=max_length, batch_tokens=batch_tokens),
        )
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"{label}: the policy loss is {float(loss.detach())}. Check that rewards are finite and of a sane "
                f"scale, lower the learning rate, or set max_grad_norm."
            )
        agent.optimizer.backward(loss, last=stop == len(rows))
        _add_micro_batch(totals, output, scores, batch, old, rows.stale[start:stop])
    metrics = _policy_metrics(totals, rows)
    if "kl_loss" in totals:
        metrics["kl_loss"] = totals["kl_loss"]
    return {**metrics, **extra_totals}


def _micro_batch_loss(agent: PolicyAgent, rows: PolicyRows, at: slice, *, temperature: float, auxiliary: Optional[AuxiliaryLoss],
                      kl_coef: Optional[float], loss_fn: Any, totals: Dict[str, float], extra_totals: Dict[str, float],
                      settings: Dict[str, Any]) -> Tuple[torch.Tensor, Any, CompletionScores, SequenceBatch, Optional[torch.Tensor]]:
    """One micro-batch's forward and loss: the registered policy loss over ``rows[at]`` (``settings``:
    its clip and length normalisers), plus the KL loss term and ``auxiliary``'s term when given (their
    values added to ``totals`` / ``extra_totals``). Returns the loss and what the metrics need."""
    start, stop = at.start, at.stop
    batch = build_sequence_batch(
        rows.prompts[at], rows.completions[at], agent.pad_id, agent.device,
        final_state=auxiliary is not None and auxiliary.final_state,
    )
    with agent.autocast():
        scores = score_completions(agent.model, batch, temperature, with_entropy=True, with_hidden_states=auxiliary is not None)
    old = _old_logprob_tensor(rows.old_logprobs[at], scores.logprobs)
    stale = torch.tensor(rows.stale[at], dtype=torch.bool, device=agent.device)
    output = loss_fn(PolicyLossInputs(
        scores.logprobs,
        batch.mask,
        torch.tensor(rows.advantages[at], device=agent.device),
        torch.tensor(rows.weights[at], device=agent.device),
        old_token_logprobs=old,
        importance_rows=stale,
        **settings,
    ))
    loss = output.loss
    if kl_coef is not None:
        token_weights = None
        if old is not None and bool(stale.any()):  # samples from an older policy: importance-weight the KL too
            cap = upper_clip_bound(settings["clip_low"], settings["clip_high"])
            token_weights = stale_token_weights(scores.logprobs, old, stale, cap)
        kl_term = _kl_loss(scores.logprobs, batch.mask, rows, start, stop, kl_coef, token_weights)
        loss = loss + kl_term
        totals["kl_loss"] = totals.get("kl_loss", 0.0) + float(kl_term.detach())
    if auxiliary is not None:
        extra, extra_metrics = auxiliary(scores, batch, at)
        loss = loss + extra
        for key, value in extra_metrics.items():
            extra_totals[key] = extra_totals.get(key, 0.0) + value
    return loss, output, scores, batch, old


def _kl_loss(logprobs: torch.Tensor, mask: torch.Tensor, rows: PolicyRows, start: int, stop: int, coef: float,
             token_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``coef * sum_r w_r * k2_token_kl_loss`` over rows ``start:stop`` (their reference log-probs padded to
    ``logprobs``; ``token_weights``: the stale rows' importance weights, ``stale_token_weights``)."""
    reference = torch.zeros_like(logprobs, dtype=torch.float32)
    for r, ref in enumerate(rows.reference_logprobs[start:stop]):
        if ref is None:
            raise ValueError("reference_kl_mode='loss' needs each row's reference log-probs; this row was sampled without them.")
        n = min(reference.shape[1], len(ref))
        reference[r, :n] = ref[:n].to(reference.device)
    weights = torch.tensor(rows.weights[start:stop], dtype=logprobs.dtype, device=logprobs.device)
    return coef * (k2_token_kl_loss(logprobs, reference, mask, token_weights) * weights).sum()


def _add_micro_batch(totals: Dict[str, float], output: Any, scores: CompletionScores, batch: SequenceBatch,
                     old: Optional[torch.Tensor], stale: Sequence[bool]) -> None:
    """Add one micro-batch's loss, entropy, token count, ratio diagnostics and sampler mismatch to ``totals``."""
    if old is not None:
        gap, count = sampler_mismatch(scores.logprobs, old, batch.mask, stale)
        totals["mismatch"] = totals.get("mismatch", 0.0) + gap
        totals["fresh_tokens"] = totals.get("fresh_tokens", 0.0) + count
    tokens = float(batch.mask.sum())
    totals["loss"] += float(output.loss.detach())
    totals["entropy"] += float((scores.entropy * batch.mask).sum())
    totals["tokens"] += tokens
    for key, value in (("ratio", output.ratio_mean), ("clip_fraction", output.clip_fraction), ("approx_kl", output.approx_kl)):
        totals[key] += float(value) * tokens


def weighted_mean_length(rows: PolicyRows) -> float:
    """``sum_r w_r |y_r| / sum_r w_r``: the mean completion length, weighted as the loss weights rows."""
    total = sum(rows.weights)
    return sum(w * len(c) for w, c in zip(rows.weights, rows.completions)) / total if total > 0 else 0.0


def sampler_mismatch(logprobs: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, stale: Sequence[bool]) -> Tuple[float, float]:
    """``(sum over fresh rows' tokens of |log pi_scored - log pi_sampler|, their token count)``: how far
    the trainer's scores are from the log-probs the generation backend recorded for the same policy."""
    fresh = torch.tensor([not s for s in stale], dtype=mask.dtype, device=mask.device).unsqueeze(1) * mask
    return float(((logprobs.detach() - old).abs() * fresh).sum()), float(fresh.sum())


def _policy_metrics(totals: Dict[str, float], rows: PolicyRows) -> Dict[str, float]:
    """Loss sum, per-token means (entropy, and the ratio diagnostics of off-policy rows), mean length."""
    tokens = max(totals["tokens"], 1.0)
    metrics = {
        "loss": totals["loss"],
        "entropy": totals["entropy"] / tokens,
        "completion_length": totals["tokens"] / max(len(rows), 1),
    }
    if any(o is not None for o in rows.old_logprobs):
        # over every row with sampling log-probs: on fresh rows the ratio only measures how closely
        # scoring reproduces the sampling log-probs (1 up to float noise)
        metrics.update(ratio=totals["ratio"] / tokens, clip_fraction=totals["clip_fraction"] / tokens, approx_kl=totals["approx_kl"] / tokens)
        metrics["stale_fraction"] = sum(rows.stale) / max(len(rows), 1)
        fresh_tokens = totals.get("fresh_tokens", 0.0)
        if fresh_tokens:
            metrics["logprob_mismatch"] = totals["mismatch"] / fresh_tokens
    return metrics
