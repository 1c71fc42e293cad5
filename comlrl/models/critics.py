"""Critics as training entities: sources checked first, then loaded, wrapped with value heads, and
checked against the tokenizer whose ids they read.

Rules (the "LLM critics" part of the training-entities contract):
- ``critic_model`` alone: an id or directory is loaded once and copied for every critic slot
  (independent parameters); one loaded model object is shared by every slot (one set of
  parameters, one optimizer, stepped once per update).
- ``critics`` alone: one id, directory or model object per slot (the same object twice is refused).
- both: ``critics`` must have one entry per slot and every entry must name ``critic_model``.
- a ``CausalLMWithValueHead`` is used as it is (a head is attached if it has none); any other
  causal LM gets a fresh head. Loading a directory restores the backbone only: a saved
  ``value_head.pt`` beside it is kept only when the user asks for it
  (``critic.load_value_head(directory)``, or ``value_head.load_state_dict(torch.load(path,
  weights_only=True))`` as CoMLRL's docs show).
- a critic reads token ids made by an agent's tokenizer, so that tokenizer's vocabulary must fit
  the critic's embedding (the one thing that can be checked without running both; a critic of the
  same model family as the agent is the safe choice).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from comlrl.models.loading import LoadOptions, load_models, own_cpu_parameters, resolve_model_kwargs
from comlrl.models.lora import LoraBases, save_backbone
from comlrl.models.preflight import check_sources_loadable
from comlrl.models.sources import describe_source, resolve_model_sources
from comlrl.models.value_head import VALUE_HEAD_FILE, CausalLMWithValueHead


@dataclass
class CriticPlan:
    sources: List[Any]  # one per critic slot
    model_name: Optional[str]


def plan_critics(*, critic_model: Any, critics: Optional[Sequence[Any]], count: int, label: str) -> CriticPlan:
    """Sources of ``count`` critic slots (no loading); ``label`` names the count in errors."""
    sources, name = resolve_model_sources(
        kind="critics", model=critic_model, models=critics, expected_count=count, expected_label=label,
        model_label="critic_model",
    )
    return CriticPlan(sources, name)


def wrap_with_value_head(model: nn.Module, hidden_dim: Optional[int]) -> CausalLMWithValueHead:
    """``model`` with a value head (a wrapper is kept as given; a head is attached when missing)."""
    if isinstance(model, CausalLMWithValueHead):
        if model.value_head is None:
            model.attach_value_head(hidden_dim)
        return model
    return CausalLMWithValueHead(model, value_head_hidden_dim=hidden_dim)


def load_critics(
    plan: CriticPlan,
    model_config: Mapping[str, Any],
    devices: Sequence[torch.device],
    hidden_dim: Optional[int],
    options: LoadOptions = LoadOptions(),
    peft_configs: Optional[Sequence[Any]] = None,
    lora: Optional[LoraBases] = None,
) -> List[CausalLMWithValueHead]:
    """One critic per slot; slots that share a model object share one wrapper. Slots with a peft
    config get an adapter over a base shared through ``lora`` (and a fully trained value head)."""
    check_sources_loadable(plan.sources, "critics")
    first_device: Dict[int, torch.device] = {}
    for source, device in zip(plan.sources, devices):
        if not isinstance(source, str) and first_device.setdefault(id(source), device) != device:
            raise ValueError(
                f"critic_model {describe_source(source)} is shared by every critic, so it cannot sit on both "
                f"{first_device[id(source)]} and {device}; give one critic device, or critic ids/directories "
                f"to load one copy per device."
            )
    kwargs = resolve_model_kwargs(model_config, model_config.get("critic_model_kwargs"))
    models = load_models(
        plan.sources, kind="critics", model_kwargs=kwargs, devices=devices, options=options, peft_configs=peft_configs, lora=lora
    )
    wrapped: Dict[int, CausalLMWithValueHead] = {}
    critics = []
    for source, model in zip(plan.sources, models):
        if id(model) not in wrapped:
            critic = wrap_with_value_head(model, hidden_dim)
            own_cpu_parameters(critic)
            wrapped[id(model)] = critic.eval()  # no dropout: values are compared across forwards
        critics.append(wrapped[id(model)])
    return critics


def check_critic_reads(critic: nn.Module, tokenizer: Any, critic_label: str, reader_label: str) -> None:
    """Refuse a critic whose embedding cannot index every id of the tokenizer it reads."""
    embeddings = critic.get_input_embeddings() if hasattr(critic, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    try:
        size = len(tokenizer)
    except TypeError:
        return  # a duck-typed tokenizer without a length: nothing to compare
    if rows is not None and size > rows:
        raise ValueError(
            f"{critic_label} reads the token ids of {reader_label} ({size} tokens) but its embedding has only "
            f"{rows} rows. A critic must share the vocabulary of the tokenizer it reads: use a critic of the same "
            f"model family as {reader_label}."
        )


def value_model_writer(
    model: CausalLMWithValueHead,
    tokenizer: Any = None,
    extra: Optional[Callable[[str], None]] = None,
    backbone_state: Optional[dict] = None,
    merge: bool = False,
) -> Callable[[str], None]:
    """``write(dir)``: the backbone (``save_pretrained``; a LoRA backbone writes its adapter, or the
    merged model with ``merge``; ``backbone_state`` in place of its own weights when given: the full
    weights of a sharded backbone), ``value_head.pt`` when a head exists, the tokenizer if given, then
    ``extra(dir)``. Pass it to ``write_dir_atomically`` / ``write_into_dir``."""

    def write(directory: str) -> None:
        save_backbone(model.model, directory, merge, state_dict=backbone_state)
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(directory)
        if model.value_head is not None:
            torch.save(model.value_head.state_dict(), os.path.join(directory, VALUE_HEAD_FILE))
        if extra is not None:
            extra(directory)

    return write
