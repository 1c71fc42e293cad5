"""Agents as training entities: count, sources and tokenizers checked first, then loaded.

``plan_agents`` validates everything that can be validated without loading a model;
``load_agents`` loads and places them and checks what needs a loaded model (vocabulary sizes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from comlrl.models.loading import LoadOptions, load_models, own_cpu_parameters, resize_for_tokenizer, resolve_model_kwargs
from comlrl.models.lora import LoraBases
from comlrl.models.preflight import check_sources_loadable, source_context_length
from comlrl.models.sources import check_sources_exist, resolve_model_sources
from comlrl.models.tokenizers import (
    add_special_tokens,
    check_vocabulary_fits,
    load_tokenizers,
    pad_token_id,
    plan_tokenizers,
)


@dataclass
class AgentPlan:
    count: int
    sources: List[Any]
    tokenizer_plan: List[Any]
    model_name: Optional[str]


def agent_count(agent_model: Any, agents: Any, num_agents: Optional[int], config: Any) -> int:
    """How many agents a trainer builds, with every disagreement between the arguments refused.

    ``agents`` decides when given; else the trainer's ``num_agents`` argument; else
    ``config.num_agents``. A config field set explicitly must agree with the count.
    """
    if num_agents is not None and (isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1):
        raise ValueError(f"num_agents must be an integer >= 1. Got {num_agents!r}.")
    count: int
    if agents is not None and isinstance(agents, Sequence) and not isinstance(agents, (str, bytes)):
        count = len(agents)
        if count == 0:
            raise ValueError("agents must not be empty; give one model id, directory or model object per agent.")
        if num_agents is not None and num_agents != count:
            raise ValueError(
                f"num_agents ({num_agents}) does not match len(agents) ({count}); drop num_agents or make them agree."
            )
    elif num_agents is not None:
        count = num_agents
    else:
        count = config.num_agents
    if config.is_explicit("num_agents") and config.num_agents != count:
        raise ValueError(
            f"args.num_agents ({config.num_agents}) does not match the {count} agents given; set "
            f"{type(config).__name__}(num_agents={count}) or leave the field at its default."
        )
    return count


def plan_agents(
    *,
    agent_model: Any,
    agents: Any,
    count: int,
    tokenizer: Any,
    homogeneous_objects: bool = False,
) -> AgentPlan:
    """Sources and tokenizer plan for ``count`` agents (no loading)."""
    if agents is None and agent_model is not None and not isinstance(agent_model, str) and count > 1 and not homogeneous_objects:
        raise ValueError(
            f"agent_model should be a string to create homogeneous agents: {count} agents cannot share one "
            f"{type(agent_model).__name__} object. Pass a model id or directory, or agents=[model_0, model_1, ...] "
            f"with one independent model object per agent."
        )
    sources, name = resolve_model_sources(
        kind="agents",
        model=agent_model,
        models=agents,
        expected_count=count,
        expected_label=f"num_agents ({count})",
        model_label="agent_model",
    )
    return AgentPlan(count, sources, plan_tokenizers(tokenizer, sources), name)


def check_plan_sources(plan: AgentPlan) -> None:
    """Refuse local agent or tokenizer paths that do not exist (hub ids are left to the loader)."""
    check_sources_loadable(plan.sources, "agents")
    check_sources_exist(plan.tokenizer_plan, "tokenizer")


def load_agents(
    plan: AgentPlan, model_config: Mapping[str, Any], devices: Sequence[torch.device], options: LoadOptions = LoadOptions(),
    peft_configs: Optional[Sequence[Any]] = None, lora: Optional[LoraBases] = None,
    check_prompts: Optional[Callable[[List[Any], List[Optional[int]]], None]] = None,
) -> tuple[List[nn.Module], List[Any]]:
    """Load (or adopt) the planned agents and tokenizers; check every tokenizer fits its model.
    Agents with a peft config become adapters over bases shared through ``lora``. Local paths that
    do not exist, and weight files that are not whole, are named before anything loads;
    ``check_prompts(tokenizers, context lengths)`` runs once the tokenizers are loaded, before any model."""
    check_plan_sources(plan)
    tokenizers = load_tokenizers(plan.tokenizer_plan)
    special = model_config.get("special_tokens")
    for tok in {id(t): t for t in tokenizers}.values():
        add_special_tokens(tok, special)
        pad_token_id(tok)  # raises early for a tokenizer with neither pad nor eos
    if check_prompts is not None:
        check_prompts(tokenizers, [source_context_length(source) for source in plan.sources])
    kwargs = resolve_model_kwargs(model_config, model_config.get("model_kwargs"))
    models = load_models(
        plan.sources, kind="agents", model_kwargs=kwargs, devices=devices, options=options, peft_configs=peft_configs, lora=lora
    )
    for index, (model, tok) in enumerate(zip(models, tokenizers)):
        if special:
            resize_for_tokenizer(model, tok, f"agents[{index}]")
        check_vocabulary_fits(model, tok, f"agents[{index}]")
        own_cpu_parameters(model)
    return models, tokenizers
