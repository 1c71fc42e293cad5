"""``CheckpointStore``: what every trainer's ``save_checkpoint`` / ``load_checkpoint`` and ``train()``'s
checkpoint options run on: when to save, where, resume checks (identity, config, world size),
pruning, and the data-parallel hooks. One folder's files are written and validated by
``checkpoint.folder``; the folder's layout (manifest, models, optimizers, training state, RNG) is in
docs/checkpoints.md. What a checkpoint holds is the store's ``owner``'s (``CheckpointOwner``).

Loading validates everything (class, config, dataset, tokenizers, every component's structure,
file integrity, decodability) before the trainer is changed at all. Saving captures the RNG state
first and restores it afterwards, so a run with checkpoints draws the same numbers as one without.

During ``train()`` the run calls ``boundary`` at every step boundary (``after_step``, a preference
phase's ``commit``, an epoch end): there a checkpoint is written when one is due (every N steps, or
``every_s`` seconds after the last save by the store's ``clock``), and the run is preempted
(``TrainingPreempted``, after a checkpoint of that boundary) when a scheduler's signal was noted or
the soft deadline is near: when the next step, taking as long as the longest interval between two
boundaries so far, would end past ``stop_after_s``. Under torchrun every rank takes the same decision
(rank 0's clock, any rank's signal).
"""

from __future__ import annotations

import abc
import os
import shutil
import sys
import time
import uuid
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

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
from comlrl.checkpoint.interrupt import PREEMPTING_SIGNALS, Interruptible, TrainingPreempted
from comlrl.checkpoint.schedule import AUTO, CheckpointSchedule
from comlrl.models.storage import writing
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

    def agree(self, flags: Sequence[bool], main_only: Sequence[bool]) -> List[bool]:
        """Per flag: whether it is set on any process (``main_only``: on the writer; the others' are ignored)."""

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

    def __init__(self, owner: CheckpointOwner, clock: Callable[[], float] = time.monotonic):
        self.owner = owner
        self.clock = clock  # seconds, for every_s and stop_after_s (a test's own clock makes them deterministic)
        self.log: Callable[[str], None] = _stderr_line  # the job log (the writer's lines only)
        self.run_id: Optional[str] = None
        self.sequence = 0
        self.schedule: Optional[CheckpointSchedule] = None
        self.active = False  # train() is running
        self.failure: Optional[str] = None  # where the last train() raised, if it did
        self.interrupt: Optional[Interruptible] = None  # the signal handling of a running train()
        self.resumed_from: Optional[str] = None  # the checkpoint the running train() started from
        self._times = _Times(0.0)

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
        auto = isinstance(resume_from_checkpoint, str) and resume_from_checkpoint == AUTO
        if auto:
            plan = self._auto_plan(schedule.directory)
        else:
            source = self._source(resume_from_checkpoint, schedule)
            plan = self._validate(source) if source is not None else None
        if plan is not None:
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
            layout.check_directory(schedule.directory, run_id, resuming, skip_foreign=auto)
            if self.owner.is_writer():
                layout.open_directory(schedule.directory, run_id)
            self.owner.barrier()
        if plan is not None:
            self._apply(plan)
        self.run_id = run_id
        self.schedule = schedule
        self.resumed_from = plan.folder if plan is not None else None
        self._times = _Times(self.clock())

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

    def _auto_plan(self, directory: str) -> Optional[LoadPlan]:
        """``resume_from_checkpoint="auto"``: the writer chooses (``choose_auto``), every process loads its choice."""
        plan = self.choose_auto(directory) if self.owner.is_writer() else None
        path = self.owner.share(plan.folder if plan is not None else None)
        if plan is None and path is not None:
            plan = self._validate(path)
        return plan

    def choose_auto(self, directory: str) -> Optional[LoadPlan]:
        """The newest checkpoint of the run that owns ``directory`` that passes every check of a resume,
        validated; None (a fresh start) when the directory holds no checkpoint. Every other entry is
        named in the log with the reason it is skipped; none usable is an error listing them all."""
        for leftover in layout.leftovers(directory):
            self.log(f"comlrl: ignoring {leftover}: an unfinished save (its run removes it)")
        entries = layout.list_entries(directory)
        if not entries:
            self.log(f"comlrl: no checkpoint in {directory}: starting a new run")
            return None
        owner = layout.read_owner(directory)
        runs = sorted({e.run_id for e in entries if e.run_id is not None})
        if owner is None and len(runs) > 1:
            raise CheckpointError(f"{directory} holds checkpoints of {len(runs)} runs ({', '.join(runs)}) and no "
                                  f"{layout.OWNER_FILENAME} saying which owns it; resume one with an explicit checkpoint path.")
        owner = owner or (runs[0] if runs else None)
        skipped = []
        # the unreadable ones first (their age is unknown), then the others from the highest sequence down
        for entry in [e for e in entries if e.run_id is None] + [e for e in reversed(entries) if e.run_id is not None]:
            plan, reason = self._usable(entry, owner, directory)
            if plan is not None:
                self.log(f"comlrl: resuming from {entry.path} (run {owner}, checkpoint {entry.sequence})")
                return plan
            skipped.append(f"{os.path.basename(entry.path)}: {reason}")
            self.log(f"comlrl: skipping checkpoint {entry.path}: {reason}")
        raise CheckpointError(
            f"resume_from_checkpoint='auto': {directory} holds checkpoints but none this run can resume: {'; '.join(skipped)}. "
            f"Resume one explicitly after fixing what is named, or start a new run in an empty checkpoint_dir."
        )

    def _usable(self, entry: layout.Entry, owner: Optional[str], directory: str) -> Tuple[Optional[LoadPlan], str]:
        """``(plan, "")`` for a checkpoint this run can resume, else ``(None, why not)``."""
        if entry.run_id is None:
            try:
                layout.read_manifest(entry.path)
            except (CheckpointError, OSError) as error:
                return None, f"torn or unreadable ({error})"
            return None, "torn or unreadable"
        if entry.run_id != owner:
            return None, f"written by run {entry.run_id}, but {directory} belongs to run {owner}"
        try:
            return self._validate(entry.path), ""
        except (CheckpointError, OSError) as error:
            return None, str(error)

    @property
    def saving(self) -> bool:
        """Whether the running train() writes checkpoints (it has a checkpoint_dir)."""
        return self.schedule is not None and self.schedule.directory is not None

    def after_step(self, global_step: int) -> None:
        """A step checkpoint when one is due (every N steps, or ``every_s`` seconds after the last save);
        on a noted signal or at the deadline, a checkpoint of this step, then ``TrainingPreempted``."""
        schedule = self.schedule
        saved = None
        if schedule is not None and schedule.due_after_step(global_step):
            saved = self.save_to_directory(layout.step_checkpoint_name(global_step))
        self.boundary(layout.step_checkpoint_name(global_step), saved)

    def boundary(self, name: str, saved: Optional[str]) -> Optional[str]:
        """A point where the run may save (into folder ``name``) and stop; ``saved``: the checkpoint
        just written here, if any. Returns the checkpoint of this boundary (None: none written)."""
        if not self.saving:
            return saved
        schedule, times, now = self.schedule, self._times, self.clock()
        times.longest_step = max(times.longest_step, now - times.last_boundary)
        times.last_boundary = now
        time_due = schedule.every_s is not None and saved is None and now - times.last_save >= schedule.every_s
        deadline = schedule.stop_after_s is not None and now - times.started + times.longest_step >= schedule.stop_after_s
        pending = self.interrupt.pending if self.interrupt is not None else None
        signals = [pending == s.name for s in PREEMPTING_SIGNALS]
        time_due, deadline, *signals = self.owner.agree([time_due, deadline, *signals], [True, True] + [False] * len(signals))
        stop = next((s.name for s, noted in zip(PREEMPTING_SIGNALS, signals) if noted), "time limit" if deadline else None)
        if saved is None and (time_due or stop):
            saved = self.save_to_directory(name)
        if stop:
            raise TrainingPreempted(stop, saved, schedule.requeue_exit_code)
        return saved

    def stop_notice(self, schedule: CheckpointSchedule) -> str:
        """What the job log says when a preempting signal is noted."""
        return (f"finishing this step, then checkpointing into {schedule.directory} and exiting with code "
                f"{schedule.requeue_exit_code} (resume with resume_from_checkpoint='auto' / --resume auto)")

    def due_after_epoch(self, epoch: int, final: bool) -> bool:
        return self.schedule is not None and self.schedule.due_after_epoch(epoch, final)

    def commit(self, name: str) -> Optional[str]:
        """A checkpoint into folder ``name`` of the running train()'s checkpoint_dir (None when it has none);
        a boundary where the run may stop."""
        return self.boundary(name, self.save_to_directory(name)) if self.saving else None

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
            self._times.last_save = self.clock()
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
        self._times.last_save = self.clock()
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


class _Times:
    """The clock readings of a running train(): its start, the last save and boundary, the longest step."""

    def __init__(self, now: float):
        self.started = self.last_save = self.last_boundary = now
        self.longest_step = 0.0


def _stderr_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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
