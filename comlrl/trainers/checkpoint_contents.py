"""The checkpoint side every trainer shares (``TrainerBase`` derives from ``TrainerCheckpoints``):
what a checkpoint holds, the identity and checks a resume compares, and the data-parallel hooks by
which rank 0 writes every rank's buffers and random state. See docs/checkpoints.md."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, List, Mapping, Optional, Sequence

from comlrl.models.lora import describe_mismatch
from comlrl.trainers.datasets import dataset_length, is_map_dataset
from comlrl.trainers.policy import PolicyAgent
from comlrl.checkpoint.store import TrainingCheckpointMixin, build_identity
from comlrl.checkpoint.files import CheckpointError
from comlrl.checkpoint.state import AttributeState, CheckpointComponents, DataclassState
from comlrl.parallel.fsdp import gather_states
from comlrl.telemetry.redaction import redact_secrets


class PolicyVersions:
    """Checkpoint state of each agent's optimizer-step count (what decides whether a buffered sample
    is stale), restored in place."""

    def __init__(self, policies: Sequence[PolicyAgent]):
        self.policies = policies

    def state_dict(self) -> List[int]:
        return [policy.version for policy in self.policies]

    def load_state_dict(self, state: Sequence[int]) -> None:
        for policy, updates in zip(self.policies, state):
            policy.optimizer.updates = int(updates)

    @staticmethod
    def check(state: Any) -> None:
        if not isinstance(state, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in state):
            raise CheckpointError(f"The checkpoint's policy versions {state!r} are not a list of non-negative integers.")


class RankStates:
    """Checkpoint state of a data-parallel run: each rank's rollout buffers, pending metric sums and RNG state, by rank
    (gathered on rank 0 when the checkpoint is written; each rank takes its own when it is loaded)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def state_dict(self) -> List[Any]:
        return self.trainer._gathered_rank_states

    def load_state_dict(self, state: Sequence[Any]) -> None:
        self.trainer._restored_rank_state = state[self.trainer._dist.rank]



class TrainerCheckpoints(TrainingCheckpointMixin):
    """The checkpoint contents, identity and resume checks of ``TrainerBase`` (its attributes:
    ``agents``, ``policies``, ``state``, ``metrics``, ``_dist``, ``_lora``, ``_sharding``, ...)."""

    # ------------------------------------------------------------------ checkpoint contents
    def _checkpoint_components(self) -> CheckpointComponents:
        """What every trainer's checkpoint holds; subclasses add their models, optimizers, buffers
        and callbacks (``super()._checkpoint_components().add_models(...)...``)."""
        components = CheckpointComponents()
        components.add_models("agents", self.agents)  # a LoRA agent's tensors are its adapter's
        if self._lora is not None and self._lora.bases:
            components.add_state("lora_bases", self._lora, check=self._check_lora_bases)
        components.add_state("policy_versions", PolicyVersions(self.policies), check=PolicyVersions.check)
        if self._dist.enabled:  # every process's own buffers and random state (rank 0 writes them all)
            components.add_state("data_parallel_ranks", RankStates(self), records=self._rank_records())
        progress = DataclassState(self.state)
        components.add_state("progress", progress, check=progress.check)
        components.add_state("metrics", self.metrics)
        components.add_state("log_history", AttributeState(self._memory, "rows"))
        # An iterable dataset is re-iterated and the consumed items skipped; restoring its own iteration
        # state as well would skip them twice, so only indexable datasets' states are kept.
        datasets = {"train_dataset": self.train_dataset, "eval_dataset": self.eval_dataset}
        return components.add_callbacks({name: d for name, d in datasets.items() if is_map_dataset(d)})

    def _rank_records(self) -> tuple:
        """Dataclass types the rollout buffers hold (for the per-rank checkpoint state)."""
        return ()

    # data parallelism: rank 0 writes checkpoints that hold every rank's buffers and RNG state
    def _checkpoint_is_writer(self) -> bool:
        return self._dist.is_main

    def _checkpoint_share(self, value: Any) -> Any:
        return self._dist.broadcast_object(value)

    def _checkpoint_barrier(self) -> None:
        self._dist.barrier()

    def _checkpoint_prepare(self, rng: Mapping[str, Any]) -> Optional[Dict[int, Any]]:
        if self._dist.enabled:
            # pending metric sums (and the epoch's) are per rank until a row merges them
            own = {"rollout_buffers": self.rollout_buffers, "rng": dict(rng), "metrics": self.metrics.state_dict()}
            self._gathered_rank_states = self._dist.gather_objects(own)
        if self._sharding is None:
            return None
        components = self._checkpoint_components()
        return gather_states(components.models, components.optimizers, keep=self._dist.is_main)

    def _checkpoint_own_rng(self, rng: Mapping[str, Any]) -> Mapping[str, Any]:
        restored = getattr(self, "_restored_rank_state", None)
        return restored["rng"] if restored is not None else rng
    def _check_lora_bases(self, state: Any) -> None:
        problem = describe_mismatch(state, self._lora.state_dict())
        if problem:
            raise CheckpointError(f"{problem}: adapters resume only on the frozen bases they were trained on.")

    def _checkpoint_identity(self) -> Dict[str, Any]:
        identity = self._checkpoint_base_identity()
        if self._dist.enabled:
            identity["data_parallel"] = {"world_size": self._dist.world_size}
        return identity

    def _checkpoint_base_identity(self) -> Dict[str, Any]:
        # the manifest is written to disk: credentials in URLs, headers and credential fields masked
        return redact_secrets(build_identity(
            config=self.args,
            dataset=self.train_dataset,
            tokenizers={f"agents.{i}": tok for i, tok in enumerate(self.tokenizers)},
            wandb=self._wandb.identity if self._wandb is not None else None,
            progress=asdict(self.state),
            generation=self._generation_kwargs,
            reward=self.reward_func,
        ))

    def _checkpoint_check(self, manifest: Mapping[str, Any], states: Mapping[str, Any]) -> None:
        progress, total = states["progress"], self.args.num_train_epochs
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
        length = self._checkpoint_epoch_length(states)
        if length is not None and position > length:
            raise CheckpointError(f"The checkpoint's position ({position} items) is beyond the training dataset ({length} items).")
        identity = manifest.get("wandb")
        run = self._wandb
        if identity and run is not None and not run.owned and run.run.id != identity["id"] and "id" not in (self.wandb_config or {}):
            raise CheckpointError(
                f"Cannot replace an external W&B run ({run.run.id}) with the checkpoint's run {identity['id']}: finish "
                f"the active run first, or pass wandb_config with the id you want."
            )

    def _checkpoint_epoch_length(self, states: Mapping[str, Any]) -> Optional[int]:
        """The epoch length a checkpoint's position is checked against (before it is restored)."""
        return dataset_length(self.train_dataset)

    def _checkpoint_restored(self, manifest: Mapping[str, Any]) -> None:
        """Drop log rows of the abandoned continuation; continue the checkpoint's W&B run unless
        ``wandb_config`` names a run (id or resume)."""
        restored = getattr(self, "_restored_rank_state", None)
        if restored is not None:
            self.rollout_buffers = restored["rollout_buffers"]
            self.metrics.load_state_dict(restored["metrics"])
        self.metrics.rewind(self.log_history, self.env_step)
        identity = manifest.get("wandb")
        config = self.wandb_config
        if not identity or config is None or "id" in config or "resume" in config:
            return
        if self._wandb is not None:
            if self._wandb.run.id == identity["id"]:
                return
            self.metrics.sinks.remove(self._wandb)
            self._wandb.close()
            self._wandb = None
        config.update(id=identity["id"], resume="allow")
        for key in ("project", "entity"):
            if identity.get(key) and not config.get(key):
                config[key] = identity[key]
        self._start_wandb()

