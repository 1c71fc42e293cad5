"""The team: the agents of a run and everything that trains them.

A ``Team`` holds one ``PolicyAgent`` per agent (model, tokenizer, device, sampler, optimizer,
frozen reference), the precision, the LoRA bases, FSDP sharding, the torchrun process group and
the agent workers of ``parallel_training="mp"``. Trainers build it in stages before and while their
models load (``join`` -> ``devices`` -> ``load_options`` -> load -> ``build_policies``), so every
check runs before the first model loads.
"""

from __future__ import annotations

import contextlib
from typing import Any, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from comlrl.models.loading import LoadOptions
from comlrl.models.lora import BaseReference, LoraBases
from comlrl.models.precision import Precision, resolve_precision
from comlrl.parallel.devices import resolve_devices
from comlrl.parallel.fsdp import Sharding, is_sharded_tensor
from comlrl.parallel.workers import AgentWorkers
from comlrl.rollout.sampling import draw_seeds
from comlrl.trainers.agent import PolicyAgent, build_references
from comlrl.trainers.backends import install_generation_backends, require_optional_packages
from comlrl.trainers.combinations import join_process_group
from comlrl.trainers.optim import AgentOptimizer


class Team:
    """The agents and their training machinery (see the module docstring). ``args``: the run's config."""

    def __init__(self, args: Any, name: str, *, data_parallel: bool = True):
        self.args = args
        self.name = name  # the trainer's name, for messages
        self.dist = join_process_group(args, name, data_parallel=data_parallel)
        self.sharding: Optional[Sharding] = (
            Sharding(self.dist.device().type, self.dist.world_size) if args.fsdp and self.dist.enabled else None
        )
        self.lora: Optional[LoraBases] = None
        self.precision: Optional[Precision] = None
        self.requested_precision: Optional[str] = None
        self.devices: List[torch.device] = []
        self.policies: List[PolicyAgent] = []
        self.agents: List[nn.Module] = []  # the trained modules (an actor-critic actor carries its value head)
        self.tokenizers: List[Any] = []
        self.sources: List[Any] = []
        self.reference_models: List[nn.Module] = []
        self.workers: Optional[AgentWorkers] = None

    # ------------------------------------------------------------------ before anything loads
    def model_devices(self, spec: Any, count: int, kind: str) -> List[torch.device]:
        """One device per model; under torchrun, devices left to comlrl are this rank's (cuda:LOCAL_RANK)."""
        if self.dist.enabled and (spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto")):
            return [self.dist.device()] * count
        return resolve_devices(spec, count, kind)

    def place_agents(self, count: int) -> List[torch.device]:
        """The agents' devices (``agent_devices``) and the references' (``reference_devices``, else the agents')."""
        self.devices = self.model_devices(self.args.agent_devices, count, "agent_devices")
        spec = self.args.reference_devices
        return resolve_devices(spec, count, "reference_devices") if spec is not None else list(self.devices)

    def load_options(self, model_config: Mapping[str, Any]) -> LoadOptions:
        """Resolve the GPU-path settings before anything loads: the precision (stored back into the
        config as the value used), the optional packages they need, and how models are loaded."""
        a = self.args
        explicit = a.precision is not None
        self.requested_precision = a.precision  # what the user asked for (a sub-engine resolves it the same way)
        self.precision = resolve_precision(a.precision, model_config, self.devices)
        a.precision = self.precision.name
        require_optional_packages(a)
        mp_recompute = a.parallel_training == "mp" and a.gradient_checkpointing
        self.lora = LoraBases("parallel_training='mp' with gradient_checkpointing=True" if mp_recompute else None)
        return LoadOptions(self.precision, explicit, a.gradient_checkpointing)

    # ------------------------------------------------------------------ once the models are loaded
    def build_policies(self, models: Sequence[nn.Module], trainable: Sequence[nn.Module], tokenizers: Sequence[Any],
                       sources: Sequence[Any], reference_devices: Sequence[torch.device], *, references: bool) -> None:
        """Frozen references (when ``references``), then one ``PolicyAgent`` per language model and one
        optimizer over each ``trainable`` module (the model itself, or a wrapper adding a value head)."""
        self.agents = list(trainable)
        self.tokenizers = list(tokenizers)
        self.sources = list(sources)
        if self.sharding is not None:  # shards and references start from rank 0's weights
            self.dist.broadcast_parameters(trainable)
        # a trainer that loads its models without load_options trains as before: float32, no autocast
        precision = self.precision or Precision("fp32", torch.float32)
        frozen = precision.frozen if precision.frozen != precision.weights and isinstance(precision.frozen, torch.dtype) else None
        self.reference_models = build_references(models, sources, reference_devices, frozen) if references else []
        if self.sharding is not None:
            models = [self.sharding.shard(model) for model in models]
        self.policies = [
            PolicyAgent(i, model, tok, device, self.reference_models[i] if self.reference_models else None, precision)
            for i, (model, tok, device) in enumerate(zip(models, self.tokenizers, self.devices))
        ]
        for policy, module in zip(self.policies, trainable):
            policy.optimizer = self.make_optimizer(module.parameters(), self.args.agent_learning_rate)
            if self.sharding is not None:
                policy.generator = self.sharding.generation(policy.generator, policy.model)
        install_generation_backends(self.policies, self.args)

    def start_workers(self, extra_models: Sequence[nn.Module] = ()) -> None:
        """The agent workers of ``parallel_training="mp"`` (one thread per agent), and every rank's
        copy of the models made equal to rank 0's."""
        self.workers = AgentWorkers(len(self.agents), parallel=self.args.parallel_training == "mp")
        self.dist.broadcast_parameters(list(self.agents) + list(extra_models))

    def adopt(self, other: "Team") -> None:
        """Train with ``other``'s policies, optimizers and references from now on (a sub-engine that
        shares this team's agents: MARLHF's actor-critic backend)."""
        for policy in self.policies:
            policy.optimizer.remove_hooks()
        self.policies = other.policies
        self.reference_models = other.reference_models

    # ------------------------------------------------------------------ services to the steps
    @property
    def num_agents(self) -> int:
        return len(self.policies)

    @property
    def optimizers(self) -> List[torch.optim.Optimizer]:
        """Every agent's ``torch.optim`` optimizer."""
        return [policy.optimizer.optimizer for policy in self.policies]

    def make_optimizer(self, parameters: Any, lr: float) -> AgentOptimizer:
        a = self.args
        parameters = list(parameters)
        in_backward = a.optimizer_in_backward if a.optimizer_in_backward is not None else a.max_grad_norm is None
        if any(is_sharded_tensor(p) for p in parameters):
            in_backward = False  # see AgentOptimizer: sharded parameters step after backward
        return AgentOptimizer(
            parameters, lr=lr, betas=a.adam_betas, eps=a.adam_epsilon, weight_decay=a.weight_decay,
            fused=a.optimizer_fused, max_grad_norm=a.max_grad_norm, in_backward=in_backward, kind=a.optimizer,
            grad_sync=self.dist.average_ if self.dist.enabled else None,
        )

    def unsharded(self, modules: Optional[Sequence[nn.Module]] = None) -> Any:
        """A block in which the sharded agents among ``modules`` (all when None) are unsharded, for
        forwards whose number can differ between ranks (collective: every rank enters it). Outside
        FSDP it does nothing."""
        return self.sharding.unsharded(modules) if self.sharding is not None else contextlib.nullcontext()

    def per_rank(self, count: int, name: str) -> int:
        """This process's share of a whole-run count (all of it in a single process)."""
        return self.dist.per_rank(count, name)

    def step_seed(self) -> int:
        """The seed of one training step's random streams: one draw from torch's global generator (on
        rank 0, shared with every rank), so a checkpoint's RNG state covers it."""
        return int(self.dist.broadcast_object(draw_seeds(1)[0] if self.dist.is_main else None))

    def saved_references(self) -> List[Optional[nn.Module]]:
        """References a checkpoint writes: a LoRA agent's reference is its frozen base, not saved."""
        return [None if isinstance(m, BaseReference) else m for m in self.reference_models]

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
