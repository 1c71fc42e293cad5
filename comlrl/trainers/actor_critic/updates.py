"""Critic forwards and losses of the actor-critic update.

- ``sequence_values``: the value of the last token of each sequence, in one batched forward of a
  critic's transformer (no LM head). Rows that are the same sequence (K samples of one prompt
  under a V critic, or every agent's sample of one joint history under MAAC) are computed once.
- ``critic_step``: one optimizer step of a separate critic on the samples of every agent it serves.
- ``SharedValueLoss``: the value loss of a head on an actor's own backbone, computed from the
  hidden states of the same forward that scores the actor's log-probs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch

from comlrl.core.advantages import normalize_flat
from comlrl.core.value_loss import value_loss
from comlrl.models.gradient_checkpointing import scoring_mode
from comlrl.models.value_head import CausalLMWithValueHead, ValueHead, head_values
from comlrl.rollout.batch import SequenceBatch, left_pad, position_ids_from_mask
from comlrl.rollout.scoring import CompletionScores
from comlrl.trainers.actor_critic.samples import RolloutSample
from comlrl.trainers.optim import AgentOptimizer


def unique_sequences(sequences: Sequence[torch.Tensor]) -> Tuple[List[torch.Tensor], torch.Tensor]:
    """``(distinct sequences in first-seen order, [len(sequences)] index of each into them)``."""
    index: Dict[Tuple[int, ...], int] = {}
    unique: List[torch.Tensor] = []
    inverse = []
    for seq in sequences:
        key = tuple(seq.tolist())
        if key not in index:
            index[key] = len(unique)
            unique.append(seq)
        inverse.append(index[key])
    return unique, torch.tensor(inverse, dtype=torch.long)


def sequence_values(model: CausalLMWithValueHead, sequences: Sequence[torch.Tensor], pad_id: int) -> torch.Tensor:
    """``[B]`` float32 values at the last token of each sequence (left-padded, one forward).

    Grad mode is the caller's.
    """
    device = next(model.parameters()).device
    ids, mask = left_pad(sequences, pad_id)
    return model.last_token_values(ids.to(device), mask.to(device), position_ids_from_mask(mask).to(device))


def rollout_values(
    model: CausalLMWithValueHead, sequences: Sequence[torch.Tensor], pad_id: int, chunk: Optional[int],
    autocast: Callable[[], ContextManager] = contextlib.nullcontext,
) -> torch.Tensor:
    """``[len(sequences)]`` values without gradient, each distinct sequence computed once
    (backbone under ``autocast()``, the head in float32)."""
    unique, inverse = unique_sequences(sequences)
    size = chunk or len(unique)
    model.eval()  # no dropout, as in every forward of the trainers
    with torch.no_grad(), autocast():
        parts = [sequence_values(model, unique[s : s + size], pad_id).cpu() for s in range(0, len(unique), size)]
    return torch.cat(parts)[inverse]


def normalized_advantages(samples: Sequence[RolloutSample], normalize: bool, *, center_leave_one_out: bool = False) -> torch.Tensor:
    """``[len(samples)]`` advantages of one (agent, turn) group, standardised when ``normalize``.

    ``center_leave_one_out`` (a Q critic with one sample per node, whose stored advantage is the raw
    ``Q(h, a)``): ``A_i = Q_i - mean_{k != i} Q_k``, a baseline that does not depend on sample i's
    action; a single sample gets 0. Under data parallelism ``samples`` is the whole run's group (the
    drain exchanges the ranks' buffers first), so every rank computes the same statistics.
    """
    advantages = torch.stack([s.advantage.float() for s in samples])
    if center_leave_one_out:
        n = advantages.numel()
        advantages = (advantages - (advantages.sum() - advantages) / (n - 1)) if n > 1 else torch.zeros_like(advantages)
    return normalize_flat(advantages) if normalize and advantages.numel() > 1 else advantages


def _targets(samples: Sequence[RolloutSample]) -> Tuple[torch.Tensor, torch.Tensor]:
    targets = torch.stack([s.value_target.float() for s in samples])
    old_values = torch.stack([s.old_value.float() for s in samples])
    return targets, old_values


def critic_step(
    critic: CausalLMWithValueHead,
    optimizer: AgentOptimizer,
    samples: Sequence[RolloutSample],
    *,
    pad_id: int,
    coef: float,
    clip_range: Optional[float],
    micro_batch_size: Optional[int],
    label: str,
    autocast: Callable[[], ContextManager] = contextlib.nullcontext,
) -> Dict[str, float]:
    """One update of a separate critic: ``coef * mean_s value_loss(V(s), y_s)`` over ``samples``.

    Each distinct critic input is forwarded once (in chunks of ``micro_batch_size`` distinct rows,
    the backbone under ``autocast()``); every sample contributes its own target.
    """
    scoring_mode(critic)  # no dropout: the values are those the targets were computed against
    unique, inverse = unique_sequences([s.critic_input_ids for s in samples])
    targets, old_values = _targets(samples)
    size = micro_batch_size or len(unique)
    totals = {"value_loss": 0.0, "value_mean": 0.0}
    for start in range(0, len(unique), size):
        stop = min(start + size, len(unique))
        rows = ((inverse >= start) & (inverse < stop)).nonzero().squeeze(-1)
        with autocast():
            chunk_values = sequence_values(critic, unique[start:stop], pad_id)
        device = chunk_values.device
        values = chunk_values[(inverse[rows] - start).to(device)]
        err = value_loss(values, targets[rows].to(device), old_values[rows].to(device), clip_range)
        share = len(rows) / len(samples)
        loss = coef * err * share
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{label}: the value loss is {float(loss.detach())}. Check the rewards' scale.")
        optimizer.backward(loss, last=stop == len(unique))
        totals["value_loss"] += float(err.detach()) * share
        totals["value_mean"] += float(values.detach().mean()) * share
    totals["grad_norm"] = optimizer.step(label)
    return totals


@dataclass
class SharedValueLoss:
    """``coef * value_loss`` of a value head on the actor's backbone, for ``backward_policy_rows``.

    V critic: the value of the prompt is read at the last prompt position (scored column 0). Q
    critic: at the state after the whole completion (the batch's extra final column).
    """

    head: ValueHead
    samples: Sequence[RolloutSample]
    coef: float
    clip_range: Optional[float]
    final_state: bool

    def __post_init__(self) -> None:
        self.targets, self.old_values = _targets(self.samples)

    def __call__(self, scores: CompletionScores, batch: SequenceBatch, rows: slice) -> Tuple[torch.Tensor, Dict[str, float]]:
        hidden = scores.hidden_states
        count = hidden.shape[0]
        if self.final_state:
            position = batch.mask.sum(dim=1).long()  # column len(completion): after its last token
        else:
            position = torch.zeros(count, dtype=torch.long, device=hidden.device)
        states = hidden[torch.arange(count, device=hidden.device), position]
        values = head_values(self.head, states)
        device = values.device
        err = value_loss(values, self.targets[rows].to(device), self.old_values[rows].to(device), self.clip_range)
        share = count / len(self.samples)
        metrics = {"value_loss": float(err.detach()) * share, "value_mean": float(values.detach().mean()) * share}
        return self.coef * err * share, metrics
