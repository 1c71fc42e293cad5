"""Batched sampling behind a small backend interface.

A backend turns B prompts into K sampled completions each (rows prompt-major: the K samples of
prompt 0, then of prompt 1, ...). ``HFGenerator`` does it with one Hugging Face ``generate`` call on
the left-padded batch; other engines (vLLM) can implement the same ``generate`` method.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Protocol, Sequence

import torch
import torch.nn as nn

from comlrl.models.preflight import context_length
from comlrl.models.tokenizers import bos_token, eos_token_ids, pad_token_id
from comlrl.models.value_head import CausalLMWithValueHead
from comlrl.rollout.batch import left_pad
from comlrl.rollout.prompt_check import check_encoded
from comlrl.rollout.sampling import TokenSampler, draw_seeds

# Keys ``train(**kwargs)`` may not override: the trainer owns them.
RESERVED_GENERATION_KEYS = frozenset(
    {"input_ids", "attention_mask", "max_new_tokens", "num_return_sequences", "do_sample", "temperature",
     "top_p", "top_k", "pad_token_id", "eos_token_id", "return_dict_in_generate", "generation_config"}
)


# The only ``train(**kwargs)`` settings accepted: they change how ``generate`` runs (cache, outputs,
# a time limit, stop strings that end a completion early), never the distribution each token is
# drawn from, so the recorded sampling log-probs stay those of ``softmax(logits / temperature)``
# that the update scores. Every other GenerationConfig key (penalties, bans, forced or suppressed
# tokens, minimum lengths, beams, other truncations, assisted decoding) is refused.
DISTRIBUTION_FREE_GENERATION_KEYS = frozenset(
    {"use_cache", "cache_implementation", "cache_config", "max_cache_len", "compile_config", "disable_compile", "low_memory",
     "prefill_chunk_size", "output_attentions", "output_hidden_states", "output_scores", "output_logits", "max_time",
     "stop_strings"}
)
# Where a refused setting has a config counterpart, the message names it.
GENERATION_KEY_FIELDS = {"max_length": "max_new_tokens", "num_beams": "num_generations", "min_p": "top_p / top_k"}


def refused_generation_keys(keys: Any) -> List[str]:
    """The keys of ``keys`` that would sample from another distribution than the one the trainer scores."""
    return sorted(set(keys) - DISTRIBUTION_FREE_GENERATION_KEYS - RESERVED_GENERATION_KEYS)


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
    # B*K 1-D tempered sampling log-probs of ``tokens`` (sampled, not greedy, generation only)
    logprobs: Optional[List[torch.Tensor]] = None

    def prompt_of_row(self, row: int) -> torch.Tensor:
        return self.prompt_ids[row // self.num_samples]


class GenerationBackend(Protocol):
    def generate(
        self, prompts: Sequence[str], num_samples: int, sampling: SamplingParams, seeds: Optional[Sequence[int]] = None
    ) -> Completions:
        """K completions per prompt; ``seeds`` (one per row, prompt-major) fix each row's random stream."""
        ...


def completion_lengths(new_tokens: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """Length of each generated row up to and including its first EOS (the whole row without one)."""
    width = new_tokens.shape[1]
    if not eos_ids or width == 0:
        return torch.full((new_tokens.shape[0],), width, dtype=torch.long)
    is_eos = torch.isin(new_tokens, torch.tensor(list(eos_ids), device=new_tokens.device))
    has_eos = is_eos.any(dim=1)
    first = is_eos.float().argmax(dim=1)
    return torch.where(has_eos, first + 1, torch.full_like(first, width)).long().cpu()


_TOKENIZER_LOCKS: Dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def tokenizer_lock(tokenizer: Any) -> threading.Lock:
    """One lock per tokenizer object: identical agents share a tokenizer, and a Hugging Face tokenizer
    call may reconfigure its backend's padding/truncation state, so concurrent agents take turns."""
    with _LOCKS_GUARD:
        return _TOKENIZER_LOCKS.setdefault(id(tokenizer), threading.Lock())


@contextlib.contextmanager
def neutral_generation_config(model: nn.Module) -> Iterator[None]:
    """Hide ``model.generation_config`` while ``generate`` runs.

    Hugging Face fills every setting the caller leaves at its default (4.x) or unset (5.x) from the
    model's own generation config: a checkpoint's temperature, top_p, top_k, min_p, repetition penalty,
    suppressed tokens or ``do_sample`` would change the distribution that is sampled, away from the one
    the trainer scores. A fresh ``GenerationConfig()`` in its place leaves nothing to inherit.
    """
    from transformers import GenerationConfig

    if not hasattr(model, "generation_config"):
        yield
        return
    original = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = original


def encode_prompts(tokenizer: Any, bos: Optional[tuple], prompts: Sequence[str]) -> List[torch.Tensor]:
    """Token ids of each prompt, with the tokenizer's special tokens, and exactly one BOS when the
    text already starts with it (a chat template that writes ``{{ bos_token }}``)."""
    with tokenizer_lock(tokenizer):
        encoded = tokenizer(list(prompts))
    ids = encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded.input_ids
    out = []
    for index, (text, row) in enumerate(zip(prompts, ids)):
        row = list(row)
        if bos is not None:
            bos_text, bos_id = bos
            if len(row) >= 2 and row[0] == bos_id and row[1] == bos_id and text.startswith(bos_text):
                row = row[1:]  # the template's BOS and the tokenizer's: keep one
        if not row:
            raise ValueError(f"prompt {index} encodes to no tokens; prompts must not be empty.")
        out.append(torch.tensor(row, dtype=torch.long))
    return out


def finish_completions(
    tokenizer: Any, prompt_ids: List[torch.Tensor], new_tokens: torch.Tensor, eos_ids: Sequence[int], num_samples: int,
    logprob_table: Optional[torch.Tensor], row_lengths: Optional[Sequence[int]] = None,
) -> Completions:
    """``Completions`` from ``[R, W]`` generated ids (cut after each row's first EOS, and at
    ``row_lengths`` when rows are padded) and optional ``[R, W]`` sampling log-probs."""
    lengths = completion_lengths(new_tokens, eos_ids)
    if row_lengths is not None:
        lengths = torch.minimum(lengths, torch.tensor(list(row_lengths), dtype=torch.long))
    tokens = [new_tokens[row, : int(lengths[row])].clone() for row in range(new_tokens.shape[0])]
    with tokenizer_lock(tokenizer):
        texts = tokenizer.batch_decode(
            [(t[:-1] if len(t) and int(t[-1]) in eos_ids else t).tolist() for t in tokens], skip_special_tokens=True
        )
    logprobs = None
    if logprob_table is not None:
        logprobs = [logprob_table[row, : int(lengths[row])].clone() for row in range(len(tokens))]
    return Completions(prompt_ids=prompt_ids, tokens=tokens, texts=list(texts), num_samples=num_samples, logprobs=logprobs)


class HFGenerator:
    """Sampling with ``model.generate`` over a left-padded batch (KV cache, no Python loop over tokens).

    Nothing of the model's own ``generation_config`` is used (its eos ids only where the tokenizer
    knows them as special tokens). Sampled generation runs Hugging Face's greedy loop with a
    ``TokenSampler`` that draws each token from the trainer's temperature / top-k / top-p
    distribution with one random stream per row and records its sampling log-probability.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, device: torch.device, autocast: Optional[Callable[[], ContextManager]] = None):
        self.model = model.model if isinstance(model, CausalLMWithValueHead) else model  # generate is the backbone's
        self.tokenizer = tokenizer
        self.device = device
        # the compute-dtype context (mixed precision: bfloat16 autocast, whose weight-cast cache holds one
        # bfloat16 copy of the weights for the duration of the call)
        self.autocast = autocast or contextlib.nullcontext
        self.pad_id = pad_token_id(tokenizer)
        self.eos_ids = eos_token_ids(tokenizer, self.model)
        self.bos = bos_token(tokenizer)
        self.context = context_length(getattr(self.model, "config", None))

    def encode(self, prompts: Sequence[str]) -> List[torch.Tensor]:
        return encode_prompts(self.tokenizer, self.bos, prompts)

    def _generation_config(self, sampling: SamplingParams):
        from transformers import GenerationConfig

        settings: Dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=False,  # sampled decoding draws its token in TokenSampler; the loop then takes it
            num_beams=1,
            num_return_sequences=1,
            pad_token_id=self.pad_id,
            eos_token_id=list(self.eos_ids) or None,
            use_cache=True,
        )
        settings.update(sampling.extra)
        return GenerationConfig(**settings)

    def generate(
        self, prompts: Sequence[str], num_samples: int, sampling: SamplingParams, seeds: Optional[Sequence[int]] = None
    ) -> Completions:
        from transformers import LogitsProcessorList

        prompt_ids = self.encode(prompts)
        check_encoded([len(ids) for ids in prompt_ids], self.context, sampling.max_new_tokens)
        rows = [ids for ids in prompt_ids for _ in range(num_samples)]  # prompt-major, K per prompt
        input_ids, attention_mask = left_pad(rows, self.pad_id)
        sampler = None
        if sampling.do_sample:
            if seeds is None:
                seeds = draw_seeds(len(rows))
            if len(seeds) != len(rows):
                raise ValueError(f"{len(seeds)} seeds for {len(rows)} generated rows; give one seed per row.")
            sampler = TokenSampler(sampling.temperature, sampling.top_k, sampling.top_p, seeds, sampling.max_new_tokens)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), neutral_generation_config(self.model), self.autocast():
                sequences = self.model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=attention_mask.to(self.device),
                    generation_config=self._generation_config(sampling),
                    logits_processor=LogitsProcessorList([sampler] if sampler is not None else []),
                    # each process generates its own items; an FSDP model is unsharded first, so no rank
                    # waits for the others' decode steps (transformers would for an FSDP module)
                    synced_gpus=False,
                )
        finally:
            self.model.train(was_training)
        sequences = sequences.sequences if hasattr(sequences, "sequences") else sequences
        new_tokens = sequences[:, input_ids.shape[1] :].cpu().clone()  # out of inference mode
        if new_tokens.shape[1] == 0:
            raise RuntimeError("generate() returned no new tokens; check max_new_tokens.")
        table = sampler.logprobs() if sampler is not None else None
        return finish_completions(self.tokenizer, prompt_ids, new_tokens, self.eos_ids, num_samples, table)
