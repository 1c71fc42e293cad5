"""Who the actors and critics of an IAC / MAAC run are, and loading them.

``CriticArrangement`` says where each agent's critic sits (a separate model, or a value head on the
actor's own backbone), whose tokens it reads and what it reads; IAC (``iac.IndependentCritics``)
and MAAC (``maac.CentralCritic``) are two arrangements. ``load_actor_critic_team`` loads the actors
into a ``Team`` and the critics into a ``CriticSet``, every check before the first model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from comlrl.models.critics import CriticPlan, check_critic_reads, load_critics
from comlrl.models.entities import AgentPlan, check_plan_sources, load_agents
from comlrl.models.preflight import check_sources_loadable
from comlrl.models.tokenizers import pad_token_id
from comlrl.models.value_head import CausalLMWithValueHead
from comlrl.telemetry.progress import library_bars
from comlrl.trainers.actor_critic.export import ExportEntry
from comlrl.trainers.combinations import check_data_parallel
from comlrl.trainers.optim import AgentOptimizer
from comlrl.trainers.reporting import console_enabled
from comlrl.trainers.team import Team


def head_dim(args: Any, model_config: Dict[str, Any], field: str) -> Optional[int]:
    """A value-head width from the config field or ``model_config[field]`` (they must agree)."""
    from_config = getattr(args, field)
    from_model_config = model_config.get(field)
    if from_model_config is not None and from_config is not None and from_model_config != from_config:
        raise ValueError(f"{field} is {from_config!r} in the trainer config but {from_model_config!r} in model_config; set it once.")
    return from_config if from_config is not None else from_model_config


class CriticArrangement:
    """Where an actor-critic team's critics are and what they read (see the module docstring)."""

    name = "ActorCritic"
    actor_value_heads = False  # the actors carry value heads (IAC with use_separate_critic=False)

    def __init__(self, args: Any):
        self.args = args

    def check_critic_arguments(self, critic_model: Any, critics: Any) -> None:
        """Refuse critic arguments the arrangement cannot use (before anything loads)."""

    def plan(self, critic_model: Any, critics: Any, count: int) -> Optional[CriticPlan]:
        raise NotImplementedError

    def devices(self, team: Team, count: int) -> List[torch.device]:
        """One device per critic slot."""
        raise NotImplementedError

    def slots(self, count: int) -> List[Optional[int]]:
        """For each agent, the index of its critic (None: the head on its own backbone)."""
        raise NotImplementedError

    def reader(self, slot: int) -> int:
        """The agent whose tokenizer makes the ids critic ``slot`` reads."""
        raise NotImplementedError

    def actor_head_dim(self, model_config: Dict[str, Any]) -> Optional[int]:
        return None

    def critic_input(self, tokenizers: Sequence[Any], agent: int, node: Any, j: int, prompt_ids: torch.Tensor,
                     completion_ids: torch.Tensor) -> torch.Tensor:
        """The ids the critic of ``agent`` reads for joint response ``j`` of ``node``."""
        raise NotImplementedError

    @property
    def value_clip_range(self) -> Optional[float]:
        return None

    def metric_prefix(self, slot: int) -> str:
        return f"critic_{slot}/"

    def export_entries(self, output_dir: str, agents: Sequence[nn.Module], tokenizers: Sequence[Any],
                       critics: Sequence[nn.Module]) -> List[ExportEntry]:
        raise NotImplementedError

    def named_critic_optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> List[Tuple[str, torch.optim.Optimizer]]:
        raise NotImplementedError


@dataclass
class CriticSet:
    """The critics of a run, one entry per slot (slots sharing a model object share its entry's
    model and optimizer): sources, the slot of each agent, each slot's pad id and optimizer."""

    models: List[CausalLMWithValueHead]
    sources: List[Any]
    of_agent: List[Optional[int]]
    pad_ids: List[int]
    optimizers: List[AgentOptimizer]
    devices: List[torch.device]

    def distinct(self) -> List[Tuple[int, CausalLMWithValueHead]]:
        """``(first slot, model)`` of every distinct critic model."""
        seen: Dict[int, int] = {}
        for slot, model in enumerate(self.models):
            seen.setdefault(id(model), slot)
        return [(slot, self.models[slot]) for slot in seen.values()]


def wrap_actor(model: nn.Module, dim: Optional[int], heads: bool) -> CausalLMWithValueHead:
    """The actor as a ``CausalLMWithValueHead``; with shared heads, a fresh head unless the model
    object already carries one (a directory's saved ``value_head.pt`` is loaded only on request:
    ``trainer.agents[i].load_value_head(directory)``)."""
    if isinstance(model, CausalLMWithValueHead):
        actor = model
        if heads and actor.value_head is None:
            actor.attach_value_head(dim)
    else:
        actor = CausalLMWithValueHead(model, value_head_hidden_dim=dim, attach_value_head=heads)
    return actor.eval()  # dropout stays off: updates score the distribution that sampled


def load_actor_critic_team(arrangement: CriticArrangement, plan: AgentPlan, critic_plan: Optional[CriticPlan], model_config: Dict[str, Any],
                           peft_configs: Tuple[Any, Any], head_dims: Tuple[Optional[int], Optional[int]], wandb_config: Any,
                           *, references: bool, items_per_step: int = 1, dataset: Any = None,
                           check_prompts: Any = None) -> Tuple[Team, CriticSet]:
    """Join torchrun (the run's counts must split over its processes), place actors and critics,
    resolve precision, load the actors (wrapped with value heads when they carry them) and the
    critics, and build the policies and every optimizer."""
    from comlrl.telemetry.wandb_sink import check_wandb_ready

    args = arrangement.args
    count = len(plan.sources)
    team = Team(args, arrangement.name)
    check_data_parallel(args, team.dist, items_per_step, dataset)
    check_wandb_ready(wandb_config)  # a missing login is one line now, not a traceback after loading
    reference_devices = team.place_agents(count)
    critic_devices = arrangement.devices(team, count)
    actor_dim, critic_dim = head_dims
    agent_peft, critic_peft = peft_configs
    with library_bars(console_enabled(args, wandb_config)):
        if critic_plan:  # every missing path is named before the first model loads
            check_sources_loadable(critic_plan.sources, "critics")
        check_plan_sources(plan)
        options = team.load_options(model_config)
        if team.lora is not None and critic_plan:  # a critic over the agents' base is refused before the agents load
            team.lora.refuse_sharing((plan.sources, agent_peft, team.devices, "agent"), (critic_plan.sources, critic_peft, critic_devices, "critic"))
        backbones, tokenizers = load_agents(plan, model_config, team.devices, options, agent_peft, team.lora, check_prompts)
        actors = [wrap_actor(model, actor_dim, arrangement.actor_value_heads) for model in backbones]
        critics = load_critics(critic_plan, model_config, critic_devices, critic_dim, options, critic_peft, team.lora) if critic_plan else []
        for slot, critic in enumerate(critics):
            reader = arrangement.reader(slot)
            check_critic_reads(critic, tokenizers[reader], f"critics[{slot}]", f"the tokenizer of agents[{reader}]")
        team.build_policies([a.model for a in actors], actors, tokenizers, plan.sources, reference_devices, references=references)
    made: Dict[int, AgentOptimizer] = {}
    for critic in critics:  # critics that are one shared object get one optimizer
        if id(critic) not in made:
            made[id(critic)] = team.make_optimizer(critic.parameters(), args.critic_learning_rate)
    critic_set = CriticSet(
        models=critics, sources=list(critic_plan.sources) if critic_plan else [], of_agent=arrangement.slots(count),
        pad_ids=[pad_token_id(tokenizers[arrangement.reader(s)]) for s in range(len(critics))],
        optimizers=[made[id(critic)] for critic in critics], devices=critic_devices,
    )
    return team, critic_set
