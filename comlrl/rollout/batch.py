"""Packing prompts and completions into one padded batch for a single forward pass.

Layout of row r: ``[pad ... pad | prompt_r | completion_r[:-1] | pad ...]``: prompts are left-padded
to a common width P, completions right-padded to C. The logits at positions ``P-1 ... P+C-2`` predict
completion tokens ``0 ... C-1``. Position ids count only attended tokens, exactly as ``generate``
numbers them for left-padded prompts, so scores match the logits the samples were drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class SequenceBatch:
    """Model inputs plus the completion tokens to score (all on one device)."""

    input_ids: torch.Tensor  # [R, P + C - 1]
    attention_mask: torch.Tensor  # [R, P + C - 1]
    position_ids: torch.Tensor  # [R, P + C - 1]
    targets: torch.Tensor  # [R, C] completion token ids
    mask: torch.Tensor  # [R, C] float, 1 for real completion tokens (EOS included)
    prompt_width: int  # P
    final_state: bool = False  # one extra scored column: the state after each whole completion

    @property
    def completion_width(self) -> int:
        return self.targets.shape[1]

    def rows(self, start: int, stop: int) -> "SequenceBatch":
        """Rows ``start:stop`` (for micro-batches), trimmed of columns that are padding in every row."""
        part = SequenceBatch(
            self.input_ids[start:stop],
            self.attention_mask[start:stop],
            self.position_ids[start:stop],
            self.targets[start:stop],
            self.mask[start:stop],
            self.prompt_width,
            self.final_state,
        )
        return part.trimmed()

    def trimmed(self) -> "SequenceBatch":
        """Drop leading prompt columns and trailing completion columns that no row uses."""
        used_prompt = self.attention_mask[:, : self.prompt_width].any(dim=0)
        first = int(used_prompt.float().argmax()) if bool(used_prompt.any()) else self.prompt_width - 1
        first = min(first, self.prompt_width - 1)  # keep position P-1, which predicts token 0
        used_completion = self.mask.any(dim=0)
        width = int(used_completion.nonzero().max()) + 1 if bool(used_completion.any()) else 1
        width += int(self.final_state)
        end = self.prompt_width + width - 1
        return SequenceBatch(
            self.input_ids[:, first:end],
            self.attention_mask[:, first:end],
            self.position_ids[:, first:end],
            self.targets[:, :width],
            self.mask[:, :width],
            self.prompt_width - first,
            self.final_state,
        )


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(mask) - 1`` with padded positions set to 0 (what ``generate`` uses)."""
    positions = attention_mask.long().cumsum(dim=-1) - 1
    return positions.clamp_min(0) * attention_mask.long()


def left_pad(sequences: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D id tensors into ``[B, W]`` ids and mask, padded on the left."""
    width = max(int(s.numel()) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        n = int(seq.numel())
        if n:
            ids[row, width - n :] = seq
            mask[row, width - n :] = 1
    return ids, mask


def right_pad(sequences: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D id tensors into ``[B, W]`` ids and mask, padded on the right."""
    width = max(1, max(int(s.numel()) for s in sequences))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        n = int(seq.numel())
        ids[row, :n] = seq
        mask[row, :n] = 1
    return ids, mask


def build_sequence_batch(
    prompts: Sequence[torch.Tensor],
    completions: Sequence[torch.Tensor],
    pad_id: int,
    device: torch.device,
    *,
    final_state: bool = False,
) -> SequenceBatch:
    """Pack R (prompt, completion) pairs; ``completions[r]`` holds only real tokens (EOS included).

    With ``final_state`` the input holds every completion token and one more (masked) column is
    scored: column ``len(completions[r])`` of row r is then the state after its whole completion.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions.")
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    completion_ids, completion_mask = right_pad(completions, pad_id)
    if final_state:
        completion_ids = torch.nn.functional.pad(completion_ids, (0, 1), value=pad_id)
        completion_mask = torch.nn.functional.pad(completion_mask, (0, 1), value=0)
    input_ids = torch.cat([prompt_ids, completion_ids[:, :-1]], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask[:, :-1]], dim=1)
    batch = SequenceBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids_from_mask(attention_mask).to(device),
        targets=completion_ids.to(device),
        mask=completion_mask.to(device=device, dtype=torch.float32),
        prompt_width=prompt_ids.shape[1],
        final_state=final_state,
    )
    return batch
