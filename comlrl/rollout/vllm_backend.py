"""Rollouts with vLLM behind the ``GenerationBackend`` interface (``generation_backend="vllm"``).

Each agent gets one colocated engine on its device (a CUDA device or the CPU). ``VLLMGenerator``
owns the contract with the trainer; the engine is behind the small ``RolloutEngine`` protocol: the
real one is ``comlrl.rollout.vllm_engine.VLLMEngine`` (tested against vLLM's CPU build in its own
CI job), and a scripted engine in the tests checks the contract where vLLM is not installed.

The contract:
- weights: before every ``generate`` the engine holds the agent's current weights. The generator
  remembers the policy version (optimizer steps) it last pushed and pushes again whenever the agent
  has stepped since (full models: every tensor; LoRA agents: the merged weights of the adapted
  layers only). Pushing lazily before the next generation, instead of eagerly after each step,
  gives the same weights at every sampling call and pushes once when several steps happen between
  two generations.
- sampling: the same prompt ids as the Hugging Face backend (one BOS), one request per row with the
  row's own seed, the trainer's temperature / top-k / top-p / max_new_tokens (greedy: temperature 0),
  stopping at the tokenizer's EOS ids, which are kept in the completion as in the HF backend.
- log-probs: vLLM reports the sampled tokens' log-probs under the distribution it sampled from
  (``logprobs_mode="processed_logprobs"``: tempered and, when top-k / top-p are on, truncated and
  renormalised), while the trainer scores the tempered untruncated distribution. So that sampling
  records, importance ratios, the reference KL and the losses use one definition, the recorded
  log-probs of a sampled row are the trainer's own (one batched no-grad forward of the agent after
  the engine returns, ``scorer``); the engine's are only checked to be there. ``engine_gap`` holds
  the mean ``|engine - trainer|`` per token of the last call (engine numerics plus truncation).
- memory: an engine that can (``can_sleep``: on CUDA) sleeps (weights and KV cache released) after
  generating and wakes before the next generation, so updates get the memory back
  (``sleep_between_phases``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional, Sequence

import torch

from comlrl.models.tokenizers import bos_token, eos_token_ids, pad_token_id
from comlrl.rollout.generation import Completions, SamplingParams, encode_prompts, finish_completions
from comlrl.rollout.sampling import draw_seeds
from comlrl.rollout.vllm_engine import NamedTensors, RolloutEngine, RowOutput, RowRequest  # noqa: F401  (the engine protocol)

# (per-row prompt ids, completion ids, temperature) -> [R, C] the trainer's own log-probs (CPU)
Scorer = Callable[[List[torch.Tensor], List[torch.Tensor], float], torch.Tensor]


def policy_weights(model: torch.nn.Module) -> NamedTensors:
    """What an engine loads to match the agent's language model: every tensor of its state dict, by the
    model's own names. A LoRA agent (``AdapterModel``) pushes its base's tensors with the layers its
    adapter changes merged (``adapted_weights``): vLLM's in-place reload re-processes whole layers, so
    a layer whose tensors arrive only in part (q and v of a fused qkv) would be wrong."""
    adapted = getattr(model, "adapted_weights", None)
    if not callable(adapted):
        return model.state_dict().items()
    merged = dict(adapted())
    out = []
    for name, tensor in model.shared.peft_model.get_base_model().state_dict().items():
        parts = name.split(".")
        if any(part.startswith("lora_") for part in parts):
            continue  # every adapter's own tensors
        plain = ".".join(part for part in parts if part != "base_layer")
        out.append((plain, merged.get(plain, tensor)))
    return out


class VLLMGenerator:
    """``GenerationBackend`` over a ``RolloutEngine`` (see the module docstring)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, model: torch.nn.Module, version: Callable[[], int],
                 sleep_between_phases: bool = True, scorer: Optional[Scorer] = None):
        self.engine = engine
        self.scorer = scorer
        self.engine_gap: Optional[float] = None
        self.tokenizer = tokenizer
        self.model = model
        self.version = version
        self.sleep_between_phases = sleep_between_phases
        self.pad_id = pad_token_id(tokenizer)
        self.eos_ids = list(eos_token_ids(tokenizer, model))
        self.bos = bos_token(tokenizer)
        # None: push before the first generation too (the engine loaded the files, the agent may differ:
        # a resumed checkpoint, a continued adapter, a model object changed in memory)
        self.synced_version: Optional[int] = None
        self.asleep = False
        self.pushes = 0

    @classmethod
    def for_policy(cls, policy: Any, gpu_memory_utilization: float) -> "VLLMGenerator":
        engine = ENGINE_FACTORY(policy.model, policy.device, gpu_memory_utilization)
        agent = weakref.proxy(policy)  # the agent owns this generator: no cycle keeps the engine alive after it
        scorer = lambda prompts, tokens, temperature: agent.token_logprobs(agent.model, prompts, tokens, temperature)  # noqa: E731
        return cls(engine, policy.tokenizer, policy.model, lambda: agent.version, sleep_between_phases=engine.can_sleep, scorer=scorer)

    def _sync(self) -> None:
        version = self.version()
        if version != self.synced_version:
            with torch.no_grad():
                self.engine.load_weights(policy_weights(self.model))
            self.synced_version = version
            self.pushes += 1

    def _requests(self, prompt_ids: List[torch.Tensor], num_samples: int, sampling: SamplingParams,
                  seeds: Optional[Sequence[int]]) -> List[RowRequest]:
        rows = len(prompt_ids) * num_samples
        if sampling.do_sample:
            seeds = list(seeds) if seeds is not None else draw_seeds(rows)
            if len(seeds) != rows:
                raise ValueError(f"{len(seeds)} seeds for {rows} generated rows; give one seed per row.")
        else:
            seeds = [None] * rows
        if sampling.extra:
            raise ValueError(
                f"generation_backend='vllm' does not forward train() generation settings {sorted(sampling.extra)}; "
                f"use generation_backend='hf' for them."
            )
        return [
            RowRequest(
                prompt_ids=prompt_ids[row // num_samples].tolist(), max_tokens=sampling.max_new_tokens,
                temperature=float(sampling.temperature) if sampling.do_sample else 0.0, top_p=float(sampling.top_p) if sampling.do_sample else 1.0,
                top_k=int(sampling.top_k or 0) if sampling.do_sample else 0, seed=seeds[row], stop_token_ids=list(self.eos_ids),
            )
            for row in range(rows)
        ]

    def generate(self, prompts: Sequence[str], num_samples: int, sampling: SamplingParams, seeds: Optional[Sequence[int]] = None) -> Completions:
        prompt_ids = encode_prompts(self.tokenizer, self.bos, prompts)
        requests = self._requests(prompt_ids, num_samples, sampling, seeds)
        if self.asleep:
            self.engine.wake_up()
            self.asleep = False
        self._sync()
        outputs = self.engine.generate(requests)
        if self.sleep_between_phases:
            self.engine.sleep()
            self.asleep = True
        width = max(1, max(len(o.token_ids) for o in outputs))
        ids = torch.full((len(outputs), width), self.pad_id, dtype=torch.long)
        table = torch.zeros(len(outputs), width) if sampling.do_sample else None
        for row, output in enumerate(outputs):
            ids[row, : len(output.token_ids)] = torch.tensor(output.token_ids, dtype=torch.long)
            if table is not None:
                if output.logprobs is None or len(output.logprobs) != len(output.token_ids):
                    raise RuntimeError("the vLLM engine returned no sampling log-prob for some generated tokens.")
                table[row, : len(output.logprobs)] = torch.tensor(output.logprobs, dtype=torch.float32)
        lengths = [len(o.token_ids) for o in outputs]
        completions = finish_completions(self.tokenizer, prompt_ids, ids, self.eos_ids, num_samples, table, lengths)
        if completions.logprobs is not None and self.scorer is not None:
            self._rescore(completions, sampling.temperature)
        return completions

    def _rescore(self, completions: Completions, temperature: float) -> None:
        """Replace the engine's log-probs by the trainer's own (see the module docstring)."""
        prompts = [completions.prompt_of_row(r) for r in range(len(completions.tokens))]
        own = self.scorer(prompts, completions.tokens, temperature)
        rows = [own[r, : len(t)].clone() for r, t in enumerate(completions.tokens)]
        tokens = sum(len(t) for t in completions.tokens)
        gap = sum(float((a - b).abs().sum()) for a, b in zip(rows, completions.logprobs))
        self.engine_gap = gap / max(tokens, 1)
        completions.logprobs = rows


def engine_model_path(model: torch.nn.Module) -> str:
    """A directory or id vLLM can load the agent's architecture and base weights from."""
    shared = getattr(model, "shared", None)
    source = getattr(shared, "source", None) if shared is not None else getattr(getattr(model, "config", None), "_name_or_path", None)
    if isinstance(source, str) and source:
        return source
    raise ValueError(
        "generation_backend='vllm' loads each agent's model into its engine by id or directory; this agent has none "
        "(a model object built in code). Save it with save_pretrained and pass the directory."
    )


def colocated_engine(model: torch.nn.Module, device: torch.device, gpu_memory_utilization: float) -> RolloutEngine:
    """The default engine factory: a ``VLLMEngine`` (``comlrl.rollout.vllm_engine``) on the agent's device
    (a CUDA device or the CPU)."""
    from comlrl.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(engine_model_path(model), torch.device(device), gpu_memory_utilization)


# (model, device, gpu_memory_utilization) -> engine; tests install a scripted engine here.
ENGINE_FACTORY: Callable[[torch.nn.Module, torch.device, float], RolloutEngine] = colocated_engine
