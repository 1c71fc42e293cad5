"""Batched sampling behind a small backend interface.

A backend turns B prompts into K sampled completions each (rows prompt-major: the K samples of
prompt 0, then of prompt 1, ...). ``HFGenerator`` does it with one Hugging Face ``generate`` call on
the left-padded batch; other engines (vLLM) can implement the same ``generate`` method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Sequence

import torch
import torch.nn as nn

from comlrl.models.tokenizers import eos_token_ids, pad_token_id
from comlrl.rollout.batch import left_pad
from comlrl.rollout.sampling import NucleusFilter

# Generation settings a model's own generation_config could otherwise leak into sampling; pinned so
# that samples come from exactly the distribution the trainer scores.
_NEUTRAL_SETTINGS: Dict[str, Any] = {
    "num_beams": 1,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "typical_p": 1.0,
    "min_length": 0,
    "min_new_tokens": None,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "length_penalty": 1.0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
}

# Keys ``train(**kwargs)`` may not override: the trainer owns them.
RESERVED_GENERATION_KEYS = frozenset(
    {"input_ids", "attention_mask", "max_new_tokens", "num_return_sequences", "do_sample", "temperature",
     "top_p", "top_k", "pad_token_id", "eos_token_id", "return_dict_in_generate", "generation_config"}
)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Optional[int] = None
    do_sample: bool = True
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Completions:
    """K completions for each of B prompts of one agent; every tensor lives on the CPU."""

    prompt_ids: List[torch.Tensor]  # B unpadded 1-D prompts
    tokens: List[torch.Tensor]  # B*K 1-D completions: real tokens only, EOS included when sampled
    texts: List[str]  # B*K decoded completions (special tokens and EOS removed)
    num_samples: int  # K

    def prompt_of_row(self, row: int) -> torch.Tensor:
        return self.prompt_ids[row // self.num_samples]


class GenerationBackend(Protocol):
    def generate(self, prompts: Sequence[str], num_samples: int, sampling: SamplingParams) -> Completions: ...


def completion_lengths(new_tokens: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """Length of each generated row up to and including its first EOS (the whole row without one)."""
    width = new_tokens.shape[1]
    if not eos_ids or width == 0:
        return torch.full((new_tokens.shape[0],), width, dtype=torch.long)
    is_eos = torch.isin(new_tokens, torch.tensor(list(eos_ids), device=new_tokens.device))
    has_eos = is_eos.any(dim=1)
    first = is_eos.float().argmax(dim=1)
    return torch.where(has_eos, first + 1, torch.full_like(first, width)).long().cpu()


class HFGenerator:
    """Sampling with ``model.generate`` over a left-padded batch (KV cache, no Python loop over tokens)."""

    def __init__(self, model: nn.Module, tokenizer: Any, device: torch.device):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.pad_id = pad_token_id(tokenizer)
        self.eos_ids = eos_token_ids(tokenizer, model)

    def encode(self, prompts: Sequence[str]) -> List[torch.Tensor]:
        encoded = self.tokenizer(list(prompts))
        ids = encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded.input_ids
        out = [torch.tensor(row, dtype=torch.long) for row in ids]
        for index, row in enumerate(out):
            if row.numel() == 0:
                raise ValueError(f"prompt {index} encodes to no tokens; prompts must not be empty.")
        return out

    def _generation_config(self, sampling: SamplingParams, num_samples: int):
        from transformers import GenerationConfig

        settings = dict(_NEUTRAL_SETTINGS)
        settings.update(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=sampling.do_sample,
            num_return_sequences=num_samples,
            pad_token_id=self.pad_id,
            eos_token_id=list(self.eos_ids) or None,
            use_cache=True,
        )
        # temperature, top-k and top-p are applied by NucleusFilter (see generate), not by generate's warpers
        settings.update(temperature=1.0, top_p=1.0, top_k=0)
        settings.update(sampling.extra)
        return GenerationConfig(**settings)

    @staticmethod
    def _filters(sampling: SamplingParams):
        from transformers import LogitsProcessorList

        if not sampling.do_sample:
            return LogitsProcessorList()
        return LogitsProcessorList([NucleusFilter(sampling.temperature, sampling.top_k, sampling.top_p)])

    def generate(self, prompts: Sequence[str], num_samples: int, sampling: SamplingParams) -> Completions:
        prompt_ids = self.encode(prompts)
        input_ids, attention_mask = left_pad(prompt_ids, self.pad_id)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                sequences = self.model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=attention_mask.to(self.device),
                    generation_config=self._generation_config(sampling, num_samples),
                    logits_processor=self._filters(sampling),
                )
        finally:
            self.model.train(was_training)
        sequences = sequences.sequences if hasattr(sequences, "sequences") else sequences
        new_tokens = sequences[:, input_ids.shape[1] :].cpu().clone()  # out of inference mode
        if new_tokens.shape[1] == 0:
            raise RuntimeError("generate() returned no new tokens; check max_new_tokens.")
        lengths = completion_lengths(new_tokens, self.eos_ids)
        tokens = [new_tokens[row, : int(lengths[row])].clone() for row in range(new_tokens.shape[0])]
        texts = self.tokenizer.batch_decode(
            [(t[:-1] if int(t[-1]) in self.eos_ids else t).tolist() for t in tokens], skip_special_tokens=True
        )
        return Completions(prompt_ids=prompt_ids, tokens=tokens, texts=list(texts), num_samples=num_samples)
