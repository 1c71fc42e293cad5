"""What a run's checkpoint holds, the identity and checks a resume compares, and the data-parallel
hooks by which rank 0 writes every rank's buffers and random state (``RunCheckpoints``, the
``CheckpointOwner`` of a run's ``CheckpointStore``). See docs/checkpoints.md.

The run's own parts (agents, LoRA bases, policy versions, progress, metrics, log) are added here;
the step and the trainer add theirs through the ``contributors`` (objects with
``add_checkpoint_state(components)``), callbacks through ``callbacks``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

from comlrl.checkpoint.files import CheckpointError
from comlrl.checkpoint.state import AttributeState, CheckpointComponents, DataclassState
from comlrl.checkpoint.store import build_identity
from comlrl.models.lora import describe_mismatch
from comlrl.parallel.fsdp import gather_states
from comlrl.telemetry.redaction import redact_secrets
from comlrl.trainers.agent import PolicyAgent
from comlrl.trainers.datasets import dataset_length, is_map_dataset


class PolicyVersions:
    """Checkpoint state of each agent's optimizer-step count (what decides whether a buffered sample
    is stale), restored in place."""

    def __init__(self, policies: Callable[[], Sequence[PolicyAgent]]):
        self.policies = policies

    def state_dict(self) -> List[int]:
        return [policy.version for policy in self.policies()]

    def load_state_dict(self, state: Sequence[int]) -> None:
        for policy, updates in zip(self.policies(), state):
            policy.optimizer.updates = int(updates)

    @staticmethod
    def check(state: Any) -> None:
        if not isinstance(state, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in state):
            raise CheckpointError(f"The checkpoint's policy versions {state!r} are not a list of non-negative integers.")


class RankStates:
    """Checkpoint state of a data-parallel run: each rank's rollout buffers, pending metric sums and RNG state, by rank
    (gathered on rank 0 when the checkpoint is written; each rank takes its own when it is loaded)."""

    def __init__(self, contents: "RunCheckpoints"):
        self.contents = contents

    def state_dict(self) -> List[Any]:
        return self.contents.gathered

    def load_state_dict(self, state: Sequence[Any]) -> None:
        self.contents.restored_rank = state[self.contents.run.team.dist.rank]


class RunCheckpoints:
    """The ``CheckpointOwner`` of a ``Run`` (see the module docstring)."""

    def __init__(self, run: Any):
        self.run = run
        self.contributors: List[Any] = []  # the step and trainer parts that add their own state
        self.callbacks: Callable[[], Dict[str, Any]] = lambda: {}
        self.tokenizers: Callable[[], Dict[str, Any]] = lambda: {f"agents.{i}": t for i, t in enumerate(run.team.tokenizers)}
        self.buffers: Optional[Any] = None  # the object whose ``buffers`` attribute holds each rank's rollout buffers
        self.rank_records: tuple = ()  # the dataclass types those buffers hold
        self.epoch_length: Callable[[Mapping[str, Any]], Optional[int]] = lambda states: dataset_length(run.task.train_dataset)
        self.on_restored: List[Callable[[Mapping[str, Any]], None]] = []
        self.gathered: Optional[List[Any]] = None
        self.restored_rank: Optional[Mapping[str, Any]] = None

    @property
    def config(self) -> Any:
        return self.run.args

    @property
    def class_name(self) -> str:
        return self.run.class_name

    # ------------------------------------------------------------------ contents
    def checkpoint_components(self) -> CheckpointComponents:
        run, team = self.run, self.run.team
        components = CheckpointComponents()
        components.add_models("agents", team.agents)  # a LoRA agent's tensors are its adapter's
        if team.lora is not None and team.lora.bases:
            components.add_state("lora_bases", team.lora, check=self._check_lora_bases)
        components.add_state("policy_versions", PolicyVersions(lambda: team.policies), check=PolicyVersions.check)
        if team.dist.enabled:  # every process's own buffers and random state (rank 0 writes them all)
            components.add_state("data_parallel_ranks", RankStates(self), records=self.rank_records)
        progress = DataclassState(run.state)
        components.add_state("progress", progress, check=progress.check)
        components.add_state("metrics", run.metrics)
        components.add_state("log_history", AttributeState(run.reporting.memory, "rows"))
        # An iterable dataset is re-iterated and the consumed items skipped; restoring its own iteration
        # state as well would skip them twice, so only indexable datasets' states are kept.
        datasets = {"train_dataset": run.task.train_dataset, "eval_dataset": run.task.eval_dataset}
        components.add_callbacks({name: d for name, d in datasets.items() if is_map_dataset(d)})
        for part in self.contributors:
            part.add_checkpoint_state(components)
        # whether the task reward turned out to score one joint response per call (its calling convention)
        components.add_state("reward_per_response", AttributeState(run.task.reward, "per_response"))
        return components.add_callbacks({**run.task.user_callbacks(), **self.callbacks()})

    def _check_lora_bases(self, state: Any) -> None:
        problem = describe_mismatch(state, self.run.team.lora.state_dict())
        if problem:
            raise CheckpointError(f"{problem}: adapters resume only on the frozen bases they were trained on.")

    def checkpoint_identity(self) -> Dict[str, Any]:
        run = self.run
        wandb = run.reporting.wandb
        # the manifest is written to disk: credentials in URLs, headers and credential fields masked
        identity = redact_secrets(build_identity(
            config=run.args, dataset=run.task.train_dataset, tokenizers=self.tokenizers(),
            wandb=wandb.identity if wandb is not None else None, progress=asdict(run.state), generation=run.generation_kwargs,
            reward=run.task.reward_func,
        ))
        if run.team.dist.enabled:
            identity["data_parallel"] = {"world_size": run.team.dist.world_size}
        return identity

    def checkpoint_check(self, manifest: Mapping[str, Any], states: Mapping[str, Any]) -> None:
        progress, total = states["progress"], self.run.args.num_train_epochs
        for name, value in progress.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CheckpointError(f"The checkpoint's progress {name}={value!r} is not a non-negative integer.")
        epoch, position = progress["epoch"], progress["position"]
        if epoch > total or (epoch == total and position > 0):
            needed = epoch + (1 if position else 0)
            raise CheckpointError(
                f"The checkpoint is past epoch {needed - 1} ({epoch} complete, {position} items into the next) but "
                f"num_train_epochs is {total}; set num_train_epochs >= {needed} to resume it."
            )
        length = self.epoch_length(states)
        if length is not None and position > length:
            raise CheckpointError(f"The checkpoint's position ({position} items) is beyond the training dataset ({length} items).")
        identity = manifest.get("wandb")
        reporting = self.run.reporting
        sink = reporting.wandb
        if identity and sink is not None and not sink.owned and sink.run.id != identity["id"] and "id" not in (reporting.wandb_config or {}):
            raise CheckpointError(
                f"Cannot replace an external W&B run ({sink.run.id}) with the checkpoint's run {identity['id']}: finish "
                f"the active run first, or pass wandb_config with the id you want."
            )

    def checkpoint_restored(self, manifest: Mapping[str, Any]) -> None:
        """Drop log rows of the abandoned continuation; continue the checkpoint's W&B run unless
        ``wandb_config`` names a run (id or resume)."""
        run = self.run
        if self.restored_rank is not None:
            self.buffers.buffers = self.restored_rank["rollout_buffers"]
            run.metrics.load_state_dict(self.restored_rank["metrics"])
        run.metrics.rewind(run.reporting.log_history, run.state.env_step)
        for hook in self.on_restored:
            hook(manifest)
        self._continue_wandb(manifest.get("wandb"))

    def _continue_wandb(self, identity: Optional[Mapping[str, Any]]) -> None:
        reporting = self.run.reporting
        config = reporting.wandb_config
        if not identity or config is None or "id" in config or "resume" in config:
            return
        if reporting.wandb is not None:
            if reporting.wandb.run.id == identity["id"]:
                return
            reporting.stop_wandb()
        config.update(id=identity["id"], resume="allow")
        for key in ("project", "entity"):
            if identity.get(key) and not config.get(key):
                config[key] = identity[key]
        reporting.start_wandb()

    # ------------------------------------------------------------------ data parallelism: rank 0 writes every rank's state
    def is_writer(self) -> bool:
        return self.run.team.dist.is_main

    def share(self, value: Any) -> Any:
        return self.run.team.dist.broadcast_object(value)

    def barrier(self) -> None:
        self.run.team.dist.barrier()

    def agree(self, flags: Sequence[bool], main_only: Sequence[bool]) -> List[bool]:
        """Each flag set on any rank (``main_only``: rank 0's alone), the same on every rank: one small
        all-reduce per step boundary under torchrun, so every rank saves and stops at the same step."""
        dist = self.run.team.dist
        if not dist.enabled:
            return [bool(flag) for flag in flags]
        own = torch.tensor([float(bool(flag) and (dist.is_main or not only)) for flag, only in zip(flags, main_only)])
        return [bool(value > 0) for value in dist.sum_tensors(own)[0].tolist()]

    def prepare(self, rng: Mapping[str, Any]) -> Optional[Dict[int, Any]]:
        team = self.run.team
        if team.dist.enabled:
            # pending metric sums (and the epoch's) are per rank until a row merges them
            own = {"rollout_buffers": self.buffers.buffers, "rng": dict(rng), "metrics": self.run.metrics.state_dict()}
            self.gathered = team.dist.gather_objects(own)
        if team.sharding is None:
            return None
        components = self.checkpoint_components()
        return gather_states(components.models, components.optimizers, keep=team.dist.is_main)

    def own_rng(self, rng: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.restored_rank["rng"] if self.restored_rank is not None else rng
