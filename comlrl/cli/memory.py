"""Predicted peak memory of a training run from model configs alone (no weights are loaded).

``estimate_memory(run)`` adds up, per device, what a comlrl step keeps alive at its two peaks:

- resident: weights of every distinct model (agents, critics, frozen references, shared LoRA bases)
  and AdamW state of every trained tensor;
- rollout peak: one agent's generate call (KV cache of B*K rows over prompt + new tokens, the
  per-step logits and sampler temporaries, the prefill's largest layer transient, and under
  bf16-mixed autocast's bfloat16 copy of the agent's float32 weights) or, with reference KL, the
  reference's no-grad scoring forward;
- update peak: one micro-batch's forward/backward (the activations autograd saves in every decoder
  layer, or only each layer's input under gradient checkpointing plus one layer recomputed, the
  completion logits kept for the log-prob backward, the in-backward gradient of the largest
  tensor, or, without the in-backward step, every gradient of the model being updated (the step
  frees them before the next model's update), autocast's weight copies), for the actor or the
  critic step, whichever is larger.

peak = resident + max(rollout peak, update peak).

The preference trainers: MADPO's rollout is its candidate collection (``collection_batch_size``
items x ``preference_num_candidates`` rows per generate call) and its update one micro-batch of
``train_batch_size`` pairs, winners and losers in one forward (2 rows per pair), with no
reference. MARLHF is the run of its RL backend (``rl_algorithm``) plus the joint reward model's
weights, resident throughout (its AdamW moments are released after reward learning); its
collection is MADPO's and counts when larger than the backend's rollout.

Activation sizes are per token and decoder layer, counted from the tensors autograd saves in
transformers' Llama / Qwen2 / Qwen3 decoder layers (``ACTIVATION_BYTES``, measured with
``torch.autograd.graph.saved_tensors_hooks`` on transformers 5.24 / torch 2.13). Attention adds
``nh * L`` probabilities per token on the CPU (a padded batch takes SDPA's math path) and only a
log-sum-exp on CUDA (memory-efficient kernels). Prompt length is an input: configs do not say it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

from comlrl.cli.model_shapes import (  # noqa: F401  (ModelShape, PUBLISHED_MODELS, ...: also imported from here)
    ACTIVATION_BYTES,
    EMBEDDING_OUTPUT_BYTES,
    GIB,
    LOGPROB_CHUNK_BYTES,
    MIB,
    PUBLISHED_MODELS,
    QWEN_VOCAB,
    ModelShape,
)

ESTIMATOR_MODELS = ("magrpo", "iac", "maac", "madpo", "marlhf")
"""The runs ``run_shape`` models (``MEMORY_MODELS``): MAGRPO-style group rollouts (the MAGRPO family),
IAC (per-agent critics or value heads), MAAC (one centralized critic), MADPO (candidate collection and
pair updates) and MARLHF (its RL backend plus the joint reward model). An algorithm's registry record
names its model (``comlrl.trainers.registry.Algorithm.estimator``); the CLI's choices need no import."""


@dataclass(frozen=True)
class Entity:
    """One trained model slot: its shape, where its weights come from (same key = same base for LoRA,
    same frozen reference), and its LoRA adapter (rank 0: full fine-tuning)."""

    shape: ModelShape
    source: str
    lora_rank: int = 0
    lora_targets: Sequence[str] = ("all-linear",)
    value_head: bool = False


@dataclass(frozen=True)
class RunShape:
    """Everything about a run that memory depends on (see ``estimate_memory``)."""

    agents: Sequence[Entity]
    critics: Sequence[Entity] = ()
    algorithm: str = "magrpo"  # one of ESTIMATOR_MODELS: magrpo | iac | maac | madpo | marlhf
    shared_value_heads: bool = False  # IAC with use_separate_critic=False
    critic_type: str = "v"
    num_generations: int = 4
    prompt_tokens: int = 256
    max_new_tokens: int = 256
    items_per_generate: int = 1  # prompts (tree nodes) per generate call of one agent
    rows_per_update: int = 4  # completions per optimizer step of one agent
    micro_batch_rows: Optional[int] = None
    critic_input_tokens: Optional[int] = None  # default: the prompt (V) or prompt + completion (Q); MAAC: all agents'
    reference_kl: bool = False
    precision: str = "bf16-mixed"
    gradient_checkpointing: bool = False
    optimizer: str = "adamw"
    optimizer_in_backward: bool = True
    device: str = "cuda"
    reward_model: Optional[ModelShape] = None  # MARLHF's joint reward model (weights resident)
    collection_rows: int = 0  # preference trainers: rows of one candidate-collection generate call


@dataclass
class MemoryEstimate:
    """Bytes per part; ``peak`` = resident + the larger of the rollout and update peaks."""

    resident: Dict[str, int] = field(default_factory=dict)
    rollout: Dict[str, int] = field(default_factory=dict)
    update: Dict[str, int] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return sum(self.resident.values()) + max(sum(self.rollout.values()), sum(self.update.values()))

    def table(self, unit: int = GIB) -> str:
        name = "GiB" if unit == GIB else "MiB"
        lines = [f"{'part':<40} {name:>10}"]
        for title, parts in (("resident", self.resident), ("rollout peak", self.rollout), ("update peak", self.update)):
            lines.append(f"{title} ({sum(parts.values()) / unit:.2f} {name})")
            lines += [f"  {key:<38} {value / unit:>10.2f}" for key, value in parts.items() if value]
        lines.append(f"{'predicted peak':<40} {self.peak / unit:>10.2f}")
        return "\n".join(lines)


def _weight_bytes(precision: str) -> int:
    return 2 if precision in ("bf16", "fp16") else 4


def _frozen_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _mode(precision: str) -> str:
    return "fp32" if precision == "fp32" else "bf16-mixed" if precision == "bf16-mixed" else "bf16"


def _optimizer_bytes(run: RunShape) -> float:
    if run.optimizer == "adamw_8bit":
        return 2.0 + 8.0 / 256  # two 8-bit moments + a float32 scale per 256-element block
    return 2.0 * _weight_bytes(run.precision)


def _resident(run: RunShape) -> Dict[str, int]:
    parts: Dict[str, int] = {}
    w, frozen = _weight_bytes(run.precision), _frozen_bytes(run.precision)
    bases: Dict[str, int] = {}
    trainable = 0
    for kind, entities in (("agents", run.agents), ("critics", run.critics)):
        full = 0
        for entity in entities:
            head = entity.shape.hidden_size + 1 if entity.value_head else 0
            if entity.lora_rank:
                bases[entity.source] = entity.shape.parameters
                adapter = entity.shape.lora_parameters(entity.lora_rank, entity.lora_targets) + head
                parts[f"{kind}: LoRA adapters (fp32)"] = parts.get(f"{kind}: LoRA adapters (fp32)", 0) + 4 * adapter
                trainable += adapter
            else:
                full += entity.shape.parameters * w + 4 * head
                trainable += entity.shape.parameters + head
        parts[f"{kind}: weights"] = full
    parts["LoRA bases (frozen, shared)"] = sum(bases.values()) * frozen
    if run.reference_kl:
        distinct = {e.source: e.shape.parameters for e in run.agents if not e.lora_rank}
        parts["references (frozen)"] = sum(distinct.values()) * (w if run.precision in ("bf16", "fp16") else frozen)
    parts["optimizer state"] = int(trainable * _optimizer_bytes(run))
    if run.reward_model is not None:
        parts["reward model (weights)"] = run.reward_model.parameters * w
    return parts


def _gradient_bytes(run: RunShape, entity: Entity) -> int:
    """Gradients alive during one model's update: every trained tensor's after backward (they are
    freed by the step that follows, so only the model being updated holds them), or inside
    backward the largest tensor's at a time."""
    shape = entity.shape
    if entity.lora_rank:
        trained, largest = shape.lora_parameters(entity.lora_rank, entity.lora_targets), 0
    else:
        trained, largest = shape.parameters, shape.largest_tensor
    element = 4 if entity.lora_rank else _weight_bytes(run.precision)
    return element * (largest if run.optimizer_in_backward else trained)


def _autocast_copy(run: RunShape, entity: Entity) -> int:
    """autocast's bfloat16 copies of a float32 model's matrices (kept for backward, or for a whole generate)."""
    return 2 * entity.shape.parameters if run.precision == "bf16-mixed" and not entity.lora_rank else 0


def _rollout(run: RunShape) -> Dict[str, int]:
    best: Dict[str, int] = {}
    element = 4 if run.precision == "fp32" else 2
    rows = max(run.items_per_generate * run.num_generations, run.collection_rows)
    length = run.prompt_tokens + run.max_new_tokens
    for entity in run.agents:
        s = entity.shape
        parts = {
            "KV cache": rows * length * s.num_layers * 2 * s.kv_width * element,
            "generation logits + sampler": rows * s.vocab_size * 4 * 4,
            "prefill layer transient": rows * run.prompt_tokens * (3 * s.intermediate_size + 4 * s.hidden_size) * element,
            "autocast weight copy (generate)": _autocast_copy(run, entity),
        }
        if run.reference_kl:  # the reference scores the rows after generation (the cache is gone by then)
            scoring = rows * run.max_new_tokens * s.vocab_size * element + LOGPROB_CHUNK_BYTES
            scoring += rows * length * (3 * s.intermediate_size + 4 * s.hidden_size) * element
            parts = max(parts, {"reference scoring forward": scoring}, key=lambda p: sum(p.values()))
        if sum(parts.values()) > sum(best.values()):
            best = parts
    return best


def _saved_activations(run: RunShape, shape: ModelShape, rows: int, tokens: int) -> int:
    mode = _mode(run.precision)
    element = 4 if mode == "fp32" else 2
    per_layer = shape.activation_bytes_per_token(mode, run.device, tokens)
    outside = EMBEDDING_OUTPUT_BYTES * shape.hidden_size * rows * tokens
    if run.gradient_checkpointing:  # layer inputs, plus one layer recomputed during backward
        return int(rows * tokens * (shape.num_layers * shape.hidden_size * element + per_layer) + outside)
    return int(rows * tokens * shape.num_layers * per_layer + outside)


def _update(run: RunShape) -> Dict[str, int]:
    element = 4 if run.precision == "fp32" else 2
    rows = run.micro_batch_rows or run.rows_per_update
    tokens = run.prompt_tokens + run.max_new_tokens
    best: Dict[str, int] = {}
    for entity in run.agents:
        s = entity.shape
        parts = {
            "actor activations": _saved_activations(run, s, rows, tokens),
            "completion logits": rows * run.max_new_tokens * s.vocab_size * element + LOGPROB_CHUNK_BYTES,
            "autocast weight copy (update)": _autocast_copy(run, entity),
            "gradients": _gradient_bytes(run, entity),
        }
        if sum(parts.values()) > sum(best.values()):
            best = parts
    for entity in run.critics:
        s = entity.shape
        length = run.critic_input_tokens or (run.prompt_tokens + (run.max_new_tokens if run.critic_type == "q" else 0))
        parts = {
            "critic activations": _saved_activations(run, s, rows, length),
            "autocast weight copy (update)": _autocast_copy(run, entity),
            "gradients": _gradient_bytes(run, entity),
        }
        if sum(parts.values()) > sum(best.values()):
            best = parts
    return best


def estimate_memory(run: RunShape) -> MemoryEstimate:
    """The predicted peak memory of one device holding every model of ``run`` (module docstring)."""
    if run.precision not in ("fp32", "bf16-mixed", "bf16", "fp16"):
        raise ValueError(f"precision must be fp32, bf16-mixed, bf16 or fp16. Got {run.precision!r}.")
    if run.device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu'. Got {run.device!r}.")
    estimate = MemoryEstimate(_resident(run), _rollout(run), _update(run))
    return estimate


# ----------------------------------------------------------------------------- from trainer configs
@dataclass(frozen=True)
class ShapeInputs:
    """What every memory model reads besides the config: model shapes and sources, prompt length,
    LoRA, device (see ``run_shape``)."""

    agent_shapes: Sequence[ModelShape]
    agent_sources: Sequence[str]
    critic_shapes: Sequence[ModelShape]
    critic_sources: Sequence[str]
    prompt_tokens: int
    lora_rank: int
    lora_targets: Sequence[str]
    critic_lora_rank: Optional[int]
    device: str
    reward_model_shape: Optional[ModelShape] = None


def _entities(given: ShapeInputs, shared_heads: bool) -> tuple:
    agents = [Entity(s, src, given.lora_rank, tuple(given.lora_targets), value_head=shared_heads)
              for s, src in zip(given.agent_shapes, given.agent_sources)]
    critic_rank = given.lora_rank if given.critic_lora_rank is None else given.critic_lora_rank
    critics = [Entity(s, src, critic_rank, tuple(given.lora_targets), value_head=True) for s, src in zip(given.critic_shapes, given.critic_sources)]
    return agents, critics


def _rollout_shape(algorithm: str, given: ShapeInputs, config: Any, *, generate_items: int, rows: int,
                   shared_heads: bool = False, critic_tokens: Optional[int] = None) -> RunShape:
    agents, critics = _entities(given, shared_heads)
    precision = config.precision or ("bf16-mixed" if given.device == "cuda" else "fp32")
    in_backward = config.optimizer_in_backward if config.optimizer_in_backward is not None else config.max_grad_norm is None
    return RunShape(
        agents=agents, critics=critics, algorithm=algorithm, shared_value_heads=shared_heads, critic_type=getattr(config, "critic_type", "v"),
        num_generations=config.num_generations, prompt_tokens=given.prompt_tokens, max_new_tokens=config.max_new_tokens,
        items_per_generate=generate_items, rows_per_update=rows, micro_batch_rows=config.update_micro_batch_size,
        critic_input_tokens=critic_tokens, reference_kl=config.reference_kl_enabled, precision=precision,
        gradient_checkpointing=config.gradient_checkpointing, optimizer=config.optimizer, optimizer_in_backward=in_backward,
        device=given.device,
    )


def group_shape(given: ShapeInputs, config: Any) -> RunShape:
    """The MAGRPO family: a step generates ``rollout_buffer_size // nodes`` items per agent (at least 1)
    at the widest tree level; an optimizer step scores ``train_batch_size`` groups of K completions."""
    k = config.num_generations
    width = k ** (len(given.agent_shapes) if getattr(config, "joint_mode", "aligned") == "cross" else 1)
    items = max(1, config.rollout_buffer_size // sum(width**t for t in range(config.num_turns)))
    return _rollout_shape("magrpo", given, config, generate_items=items * width ** (config.num_turns - 1), rows=config.train_batch_size * k)


def _actor_critic_items(config: Any) -> int:
    k = config.num_generations
    items = max(1, config.rollout_buffer_size // (k * sum(k**t for t in range(config.num_turns))))
    return items * k ** (config.num_turns - 1)


def iac_shape(given: ShapeInputs, config: Any) -> RunShape:
    """IAC: a step generates enough items to fill a buffer; an optimizer step scores ``train_batch_size``
    samples (one completion each); critics per agent, or value heads on the actors."""
    shared = not getattr(config, "use_separate_critic", True)
    return _rollout_shape("iac", given, config, generate_items=_actor_critic_items(config), rows=config.train_batch_size, shared_heads=shared)


def maac_shape(given: ShapeInputs, config: Any) -> RunShape:
    """MAAC: as IAC, with one centralized critic reading every agent's prompt (and completion for Q)."""
    per_agent = given.prompt_tokens + (config.max_new_tokens if config.critic_type == "q" else 0)
    return _rollout_shape("maac", given, config, generate_items=_actor_critic_items(config), rows=config.train_batch_size,
                          critic_tokens=per_agent * len(given.agent_shapes))


def _collection_rows(config: Any) -> int:
    """Rows of one MADPO collection generate call (the preference trainers' collection batch)."""
    items = config.collection_batch_size or max(config.rollout_buffer_size, 64 // config.preference_num_candidates)
    return items * config.preference_num_candidates


def madpo_shape(given: ShapeInputs, config: Any) -> RunShape:
    """MADPO: candidate collection, then pair updates scoring winners and losers (2 rows per pair)."""
    base = group_shape(given, replace_fields(config, num_generations=1, reference_kl_enabled=False))
    return replace(base, algorithm="madpo", num_generations=1, items_per_generate=0, rows_per_update=2 * config.train_batch_size,
                   micro_batch_rows=2 * config.update_micro_batch_size if config.update_micro_batch_size else None,
                   collection_rows=_collection_rows(config))


def marlhf_shape(given: ShapeInputs, config: Any) -> RunShape:
    """MARLHF: the run of its RL backend (the memory model of the ``rl_algorithm`` record) plus the
    joint reward model (the first agent's shape unless ``reward_model_shape`` is given)."""
    from comlrl.trainers.registry import ALGORITHMS

    base = MEMORY_MODELS[ALGORITHMS[config.rl_algorithm].estimator](given, config)
    return replace(base, algorithm="marlhf", reward_model=given.reward_model_shape or given.agent_shapes[0],
                   collection_rows=_collection_rows(config))


MEMORY_MODELS: Dict[str, Callable[[ShapeInputs, Any], RunShape]] = {
    "magrpo": group_shape, "iac": iac_shape, "maac": maac_shape, "madpo": madpo_shape, "marlhf": marlhf_shape,
}
"""The memory models by name; an algorithm's registry record names its own (``Algorithm.estimator``)."""


def run_shape(
    algorithm: str,
    agent_shapes: Sequence[ModelShape],
    config: Any,
    *,
    agent_sources: Optional[Sequence[str]] = None,
    critic_shapes: Sequence[ModelShape] = (),
    critic_sources: Optional[Sequence[str]] = None,
    prompt_tokens: int = 256,
    lora_rank: int = 0,
    lora_targets: Sequence[str] = ("all-linear",),
    critic_lora_rank: Optional[int] = None,
    device: str = "cuda",
    reward_model_shape: Optional[ModelShape] = None,
) -> RunShape:
    """A ``RunShape`` from model shapes and a trainer config (``MAGRPOConfig``, ``IACConfig``, ... or a
    plain object with the same fields), by the memory model ``algorithm`` (a key of ``MEMORY_MODELS``):
    the batch arithmetic the trainers use."""
    model = MEMORY_MODELS.get(algorithm.lower())
    if model is None:
        raise ValueError(f"algorithm={algorithm!r} is not modelled by the estimator; use one of {', '.join(MEMORY_MODELS)} "
                         f"(an algorithm's record in comlrl.trainers.registry names its model: estimator=...).")
    given = ShapeInputs(
        agent_shapes=agent_shapes, agent_sources=list(agent_sources or [s.name for s in agent_shapes]), critic_shapes=critic_shapes,
        critic_sources=list(critic_sources or [s.name for s in critic_shapes]), prompt_tokens=prompt_tokens, lora_rank=lora_rank,
        lora_targets=lora_targets, critic_lora_rank=critic_lora_rank, device=device, reward_model_shape=reward_model_shape,
    )
    return model(given, config)


def replace_fields(config: Any, **changes: Any) -> Any:
    """A plain copy of ``config``'s fields with ``changes`` (for shapes only; nothing is validated)."""
    from types import SimpleNamespace

    names = config.field_names() if hasattr(config, "field_names") else list(vars(config))
    return SimpleNamespace(**{**{n: getattr(config, n) for n in names}, **changes})


def with_settings(run: RunShape, **changes: Any) -> RunShape:
    """``run`` with other precision / checkpointing / LoRA settings (``lora_rank`` applies to every entity)."""
    rank = changes.pop("lora_rank", None)
    if rank is not None:
        changes["agents"] = [replace(e, lora_rank=rank) for e in run.agents]
        changes["critics"] = [replace(e, lora_rank=rank) for e in run.critics]
    return replace(run, **changes)


def published_key(source: str) -> Optional[str]:
    """The ``PUBLISHED_MODELS`` key of a published name or of its hub ids (``Qwen/Qwen3-1.7B``,
    ``Qwen/Qwen2.5-1.5B-Instruct``, ``Qwen/Qwen3-4B-Instruct-2507``: instruct and base share a shape), else None."""
    key = source.lower().removeprefix("qwen/")
    key = re.sub(r"-instruct(-\d+)?$", "", key)
    return key if key in PUBLISHED_MODELS else None


def shapes_from_sources(sources: Sequence[str]) -> List[ModelShape]:
    """``ModelShape``s of model ids / directories (their ``config.json`` only) or published names."""
    shapes = []
    for source in sources:
        published = None if os.path.isdir(source) else published_key(source)
        if published is not None:
            shapes.append(PUBLISHED_MODELS[published])
            continue
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(source)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"no model config for {source!r}: give a directory with config.json, a reachable hub id, or one of "
                f"{', '.join(sorted(PUBLISHED_MODELS))}. ({exc})"
            ) from None
        shapes.append(ModelShape.from_config(config, name=source))
    return shapes


def estimate_from_config(
    algorithm: str,
    agents: Sequence[str],
    config: Any,
    *,
    critics: Sequence[str] = (),
    prompt_tokens: int = 256,
    lora_rank: int = 0,
    lora_targets: Sequence[str] = ("all-linear",),
    device: str = "cuda",
) -> MemoryEstimate:
    """``estimate_memory`` of a run described as a trainer is: model ids / directories / published
    names for the agents (and critics), and the trainer's config object. Critics of the agents'
    source share its LoRA base."""
    shapes = shapes_from_sources(agents)
    critic_shapes = shapes_from_sources(critics)
    critic_sources = [c if lora_rank else f"critic:{i}:{c}" for i, c in enumerate(critics)]
    shape = run_shape(
        algorithm, shapes, config, agent_sources=list(agents), critic_shapes=critic_shapes, critic_sources=critic_sources,
        prompt_tokens=prompt_tokens, lora_rank=lora_rank, lora_targets=lora_targets, device=device,
    )
    return estimate_memory(shape)
