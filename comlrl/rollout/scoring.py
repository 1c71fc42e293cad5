"""Log-probabilities of sampled completions from one batched, masked forward pass.

Only the completion positions reach the language-model head (``logits_to_keep``), the log-softmax
is taken in float32 as ``logit[y] - logsumexp(logits)`` (no full log-probability tensor), and the
logits are divided by the sampling temperature. Top-k / top-p truncation is not modelled (as in TRL):
the scores are those of the tempered full distribution, so importance ratios and the k3 KL against
samples drawn with truncation are approximations (exact when top_k and top_p are off). The sampler
records the same tempered, untruncated log-probabilities, so a fresh sample's ratio is 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from comlrl.core.logprobs import row_chunk, selected_logprobs
from comlrl.models.signatures import model_forward_parameters
from comlrl.rollout.batch import SequenceBatch


def _accepts(model: nn.Module, name: str) -> bool:
    return name in model_forward_parameters(model)


@dataclass
class CompletionScores:
    """Per-token results of scoring a ``SequenceBatch``: ``[R, C]`` each."""

    logprobs: torch.Tensor
    entropy: Optional[torch.Tensor] = None  # detached; only when requested
    hidden_states: Optional[torch.Tensor] = None  # [R, C, H] last-layer states at the scored positions


def model_inputs(model: nn.Module, batch: SequenceBatch, keep: int) -> dict:
    """Keyword arguments of a forward that returns logits for the last ``keep`` positions."""
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    if _accepts(model, "position_ids"):
        inputs["position_ids"] = batch.position_ids
    if _accepts(model, "use_cache"):
        inputs["use_cache"] = False
    if _accepts(model, "logits_to_keep"):
        inputs["logits_to_keep"] = keep
    return inputs


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / T)[y]`` in float32: ``[R, C]``. Overwrites ``logits`` during backward."""
    return selected_logprobs(logits, targets, temperature)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits / T)`` per position, without gradient: ``[..., V] -> [...]``."""
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    step = row_chunk(flat.shape[1])
    with torch.no_grad():
        for start in range(0, flat.shape[0], step):
            chunk = flat[start : start + step].float()
            if temperature != 1.0:
                chunk = chunk / temperature
            logp = torch.log_softmax(chunk, dim=-1)
            out[start : start + step] = -(logp.exp() * logp).sum(dim=-1)
    return out.reshape(logits.shape[:-1])


def score_completions(
    model: nn.Module,
    batch: SequenceBatch,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    with_hidden_states: bool = False,
) -> CompletionScores:
    """Score every completion token of ``batch`` in one forward of ``model``.

    Grad mode is the caller's: call under ``torch.no_grad()`` for rollout-time scores.
    """
    width = batch.completion_width
    inputs = model_inputs(model, batch, width)
    if with_hidden_states:
        inputs["output_hidden_states"] = True
    output = model(**inputs)
    logits = output.logits if hasattr(output, "logits") else output[0]
    logits = logits[:, -width:, :]
    entropy = token_entropy(logits, temperature) if with_entropy else None  # before backward reuses logits
    scores = CompletionScores(logprobs=token_logprobs(logits, batch.targets, temperature), entropy=entropy)
    if with_hidden_states:
        scores.hidden_states = output.hidden_states[-1][:, -width:, :]
    return scores
