"""``CheckpointStore``: what every trainer's ``save_checkpoint`` / ``load_checkpoint`` and ``train()``'s
checkpoint options run on: when to save, where, resume checks (identity, config, world size),
pruning, and the data-parallel hooks. One folder's files are written and validated by
``checkpoint.folder``; the folder's layout (manifest, models, optimizers, training state, RNG) is in
docs/checkpoints.md. What a checkpoint holds is the store's ``owner``'s (``CheckpointOwner``).

Loading validates everything (class, config, dataset, tokenizers, every component's structure,
file integrity, decodability) before the trainer is changed at all. Saving captures the RNG state
first and restores it afterwards, so a run with checkpoints draws the same numbers as one without.
"""

from __future__ import annotations

import abc
import os
import shutil
import uuid
import warnings
from typing import Any, Dict, Mapping, Optional, Protocol

from comlrl.checkpoint import layout
from comlrl.checkpoint.files import CheckpointError
from comlrl.checkpoint.folder import (  # noqa: F401  (write_checkpoint, LoadPlan, ...: also imported from here)
    LoadPlan,
    _names_must_match,
    apply_components,
    inside,
    optimizer_differences,
    validate_components,
    write_checkpoint,
)
from comlrl.checkpoint.interrupt import Interruptible, TrainingInterrupted
from comlrl.models.storage import writing
from comlrl.checkpoint.schedule import CheckpointSchedule
from comlrl.checkpoint.state import (
    CheckpointComponents,
    capture_rng_state,
    check_reward_fingerprint,
    config_defaults,
    config_differences,
    config_record,
    dataset_info,
    jsonable,
    restore_rng_state,
    reward_fingerprint,
    tokenizer_fingerprint,
)


class CheckpointOwner(Protocol):
    """What a ``CheckpointStore`` asks of the run it checkpoints."""

    config: Any  # the run's config (its defaults and resumable fields)
    class_name: str  # "module.Class" of the trainer: a checkpoint resumes only in the same class

    def checkpoint_components(self) -> CheckpointComponents: ...

    def checkpoint_identity(self) -> Dict[str, Any]:
        """config, dataset, tokenizers, W&B identity, progress, generation settings (all JSON)."""

    def checkpoint_check(self, manifest: Mapping[str, Any], states: Mapping[str, Any]) -> None:
        """Run-level validation before anything is restored (raise CheckpointError)."""

    def checkpoint_restored(self, manifest: Mapping[str, Any]) -> None:
        """Called after every component is restored and before the RNG is."""

    # data parallelism: one writer, the others take part in gathering their states
    def is_writer(self) -> bool: ...

    def share(self, value: Any) -> Any:
        """The writer's ``value`` on every process."""

    def barrier(self) -> None: ...

    def prepare(self, rng: Mapping[str, Any]) -> Optional[Mapping[int, Any]]:
        """Collect what every process contributes to the next checkpoint (collective); may return the
        full states of sharded models and optimizers (see ``write_checkpoint``)."""

    def own_rng(self, rng: Mapping[str, Any]) -> Mapping[str, Any]:
        """The RNG state this process resumes with (the checkpoint's, or its own rank's)."""


class TrainingCheckpointMixin(abc.ABC):
    """CoMLRL 1.4.x's name for a trainer that writes and resumes exact checkpoints. In comlrl the
    machinery is the composed ``CheckpointStore``; this is the interface it gives a class: any class
    with ``save_checkpoint`` and ``load_checkpoint`` is one (``isinstance`` works, nothing is inherited)."""

    @classmethod
    def __subclasshook__(cls, other: type) -> Any:
        if cls is TrainingCheckpointMixin:
            names = set().union(*(vars(klass) for klass in other.__mro__))
            return {"save_checkpoint", "load_checkpoint"} <= names or NotImplemented
        return NotImplemented


class CheckpointStore:
    """The checkpoints of one trainer (see the module docstring); ``owner`` says what they hold."""

    def __init__(self, owner: CheckpointOwner):
        self.owner = owner
        self.run_id: Optional[str] = None
        self.sequence = 0
        self.schedule: Optional[CheckpointSchedule] = None
        self.active = False  # train() is running
        self.failure: Optional[str] = None  # where the last train() raised, if it did
        self.interrupt: Optional[Interruptible] = None  # the signal handling of a running train()

    # ------------------------------------------------------------------ public
    def save(self, output_dir: str) -> str:
        """Write a checkpoint of the trainer as it is now into ``output_dir`` (new or empty); return it.

        Refused while ``train()`` runs (checkpoints are taken between steps by ``train`` itself) and
        after a ``train()`` that raised, whose state is partial.
        """
        self.require_consistent("save_checkpoint")
        target = os.path.abspath(os.fspath(output_dir))
        if os.path.exists(target) and self.owner.is_writer():
            if not os.path.isdir(target) or os.listdir(target):
                raise FileExistsError(f"{target} already exists and is not an empty directory; refusing to overwrite it. Choose a new path.")
            os.rmdir(target)
        return self._write(target, self.sequence + 1)

    def load(self, path: str) -> Dict[str, Any]:
        """Validate the checkpoint at ``path`` against this trainer, then restore it; return its progress.

        ``path``: a checkpoint folder, its manifest, or a checkpoint_dir (its latest checkpoint).
        Nothing is changed unless every check passes.
        """
        if self.active:
            raise RuntimeError("load_checkpoint cannot run while train() is running.")
        plan = self._validate(layout.resolve_checkpoint(path))
        self._apply(plan)
        return dict(plan.manifest["progress"])

    # ------------------------------------------------------------------ train() integration
    def begin(self, resume_from_checkpoint: Any, schedule: CheckpointSchedule) -> None:
        """At train() start: validate the resume source and ``checkpoint_dir``, then restore."""
        source = self._source(resume_from_checkpoint, schedule)
        plan = None
        if source is not None:
            plan = self._validate(source)
            saved, now = plan.manifest["generation"], self.owner.checkpoint_identity()["generation"]
            if saved != now:
                raise CheckpointError(
                    f"train() generation settings differ from the checkpoint's: {saved} in the checkpoint, {now} here. "
                    f"Pass the same keyword arguments to train() when resuming."
                )
        elif schedule.directory is not None:
            self.require_consistent("train(checkpoint_dir=...)")
        run_id = plan.manifest["run_id"] if plan is not None else self.run_id
        if schedule.directory is not None:
            resuming = run_id is not None
            run_id = self.owner.share(run_id or uuid.uuid4().hex)
            layout.check_directory(schedule.directory, run_id, resuming)
            if self.owner.is_writer():
                layout.open_directory(schedule.directory, run_id)
            self.owner.barrier()
        if plan is not None:
            self._apply(plan)
        self.run_id = run_id
        self.schedule = schedule

    @staticmethod
    def _source(resume_from_checkpoint: Any, schedule: CheckpointSchedule) -> Optional[str]:
        if resume_from_checkpoint is None:
            return None
        if resume_from_checkpoint is True:
            source = layout.latest_checkpoint(schedule.directory)
            if source is None:
                raise FileNotFoundError(f"resume_from_checkpoint=True but {schedule.directory} holds no checkpoint yet.")
            return source
        return layout.resolve_checkpoint(resume_from_checkpoint)

    @property
    def saving(self) -> bool:
        """Whether the running train() writes checkpoints (it has a checkpoint_dir)."""
        return self.schedule is not None and self.schedule.directory is not None

    def after_step(self, global_step: int) -> None:
        """A step checkpoint when one is due; on a deferred SIGTERM, a checkpoint of this step, then stop."""
        schedule = self.schedule
        saved = None
        if schedule is not None and schedule.due_after_step(global_step):
            saved = self.save_to_directory(layout.step_checkpoint_name(global_step))
        interrupt = self.interrupt
        if interrupt is not None and interrupt.pending is not None:  # SIGTERM during this step: save it, then stop
            if saved is None and self.saving:
                saved = self.save_to_directory(layout.step_checkpoint_name(global_step))
            raise TrainingInterrupted(interrupt.pending, saved)

    def due_after_epoch(self, epoch: int, final: bool) -> bool:
        return self.schedule is not None and self.schedule.due_after_epoch(epoch, final)

    def commit(self, name: str) -> Optional[str]:
        """A checkpoint into folder ``name`` of the running train()'s checkpoint_dir (None when it has none)."""
        return self.save_to_directory(name) if self.saving else None

    def save_to_directory(self, name: str) -> str:
        directory = self.schedule.directory
        if self.owner.is_writer():
            sequence = layout.next_sequence(directory, self.run_id, self.sequence)
            name = layout.free_name(directory, name)
        else:
            sequence = 0
        sequence, name = self.owner.share((sequence, name))
        path = self._write(os.path.join(directory, name), sequence)
        if self.owner.is_writer():
            layout.prune(directory, self.run_id, self.schedule.total_limit)
        self.owner.barrier()
        return path

    def finish(self) -> None:
        """train() ended (successfully or not): no schedule, no signal handling."""
        self.active = False
        self.schedule = None
        self.interrupt = None

    # ------------------------------------------------------------------ internals
    def require_consistent(self, action: str) -> None:
        if self.active:
            raise RuntimeError(f"{action} is not possible while train() is running; train() checkpoints between steps itself (checkpoint_dir=...).")
        if self.failure is not None:
            raise RuntimeError(
                f"{action} refused: the last train() call raised during {self.failure}, so models, optimizers "
                f"and buffers may hold a partial step. Build a new trainer and resume from the latest checkpoint "
                f"(train(resume_from_checkpoint=...))."
            )

    def _write(self, target: str, sequence: int) -> str:
        owner = self.owner
        rng = capture_rng_state()
        if self.run_id is None:
            self.run_id = owner.share(uuid.uuid4().hex)
        gathered = owner.prepare(rng)
        if not owner.is_writer():
            restore_rng_state(rng)
            owner.barrier()
            self.sequence = sequence
            return target
        parent = os.path.dirname(target)
        staging = layout.staging_folder(parent, sequence, self.run_id)
        try:
            identity = dict(owner.checkpoint_identity(), trainer_class=owner.class_name, run_id=self.run_id, sequence=sequence, rng=rng)
            with writing(target, "the checkpoint", lambda: _kept(parent)):
                write_checkpoint(staging, owner.checkpoint_components(), identity, gathered)
                layout.publish(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            restore_rng_state(rng)
        owner.barrier()
        self.sequence = sequence
        return target

    def _validate(self, folder: str) -> LoadPlan:
        owner = self.owner
        manifest = layout.read_manifest(folder)
        layout.check_restorable(manifest, folder)
        if manifest["trainer_class"] != owner.class_name:
            raise CheckpointError(
                f"The checkpoint at {folder} was written by {manifest['trainer_class']}; this trainer is {owner.class_name}. "
                f"Resume it with the same trainer class."
            )
        current = owner.checkpoint_identity()
        diffs = config_differences(manifest["config"], current["config"], config_defaults(owner.config))
        if diffs:
            allowed = ", ".join(current["config"]["resumable"]) or "none"
            raise CheckpointError(
                f"Checkpoint configuration does not match: {'; '.join(diffs)}. Only these fields may change on resume: {allowed}."
            )
        _compare_identity(manifest, current)
        plan = LoadPlan(folder, manifest, owner.checkpoint_components())
        validate_components(plan)
        owner.checkpoint_check(manifest, plan.states)
        return plan

    def _apply(self, plan: LoadPlan) -> None:
        apply_components(plan)
        self.run_id = plan.manifest["run_id"]
        self.sequence = plan.manifest["sequence"]
        self.failure = None
        self.owner.checkpoint_restored(plan.manifest)
        restore_rng_state(self.owner.own_rng(plan.rng))


def _kept(directory: str) -> str:
    """What a failed checkpoint write leaves (its partial folder is removed)."""
    latest = layout.latest_checkpoint(directory) if os.path.isdir(directory) else None
    earlier = f" The earlier checkpoints are untouched (latest: {latest}; resume from it with " \
              f"resume_from_checkpoint=... / --resume)." if latest else ""
    return f" The partial checkpoint was removed.{earlier}"


def _compare_identity(manifest: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    saved_tokenizers, tokenizers = manifest["tokenizers"], current["tokenizers"]
    _names_must_match("tokenizers", tokenizers, saved_tokenizers)
    for name in sorted(tokenizers):
        if saved_tokenizers[name] != tokenizers[name]:
            raise CheckpointError(
                f"The tokenizer of {name} differs from the checkpoint's ({saved_tokenizers[name]['class']} "
                f"sha256 {saved_tokenizers[name]['sha256'][:12]}..., here {tokenizers[name]['class']} sha256 "
                f"{tokenizers[name]['sha256'][:12]}...): vocabulary, special tokens, chat template or settings changed."
            )
    check_reward_fingerprint(manifest.get("reward"), current.get("reward"))
    saved_world = (manifest.get("data_parallel") or {}).get("world_size", 1)
    world = (current.get("data_parallel") or {}).get("world_size", 1)
    if saved_world != world:
        raise CheckpointError(
            f"The checkpoint was written by a run of {saved_world} data-parallel process(es); this run has {world}. "
            f"Each process's rollout buffers and random streams are in it, so resume with "
            f"`torchrun --nproc_per_node={saved_world}` (or a single process when it says 1)."
        )
    saved, now = manifest.get("dataset"), current.get("dataset")
    if saved is None or now is None:
        return
    if saved["length"] != now["length"]:
        raise CheckpointError(
            f"The training dataset has {now['length']} items; the checkpoint's had {saved['length']}. The resume "
            f"position counts items of that dataset, so it must be the same dataset."
        )
    if saved["fingerprint"] and now["fingerprint"] and saved["fingerprint"] != now["fingerprint"]:
        warnings.warn(
            f"The training dataset's fingerprint ({now['fingerprint']}) differs from the checkpoint's "
            f"({saved['fingerprint']}); resuming on data that may differ.",
            stacklevel=4,
        )


def build_identity(*, config: Any, dataset: Any, tokenizers: Mapping[str, Any], wandb: Optional[Mapping[str, Any]], progress: Mapping[str, Any],
                   generation: Mapping[str, Any], reward: Any = None) -> Dict[str, Any]:
    """The JSON identity a run's ``checkpoint_identity`` returns (``reward``: the task's reward function,
    fingerprinted)."""
    return {
        "config": config_record(config),
        "dataset": dataset_info(dataset),
        "tokenizers": {name: tokenizer_fingerprint(tok) for name, tok in tokenizers.items()},
        "wandb": {key: value or None for key, value in wandb.items()} if wandb else None,
        "progress": jsonable(dict(progress)),
        "generation": jsonable(dict(generation)),
        "reward": reward_fingerprint(reward),
    }
