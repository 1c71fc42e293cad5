"""The mixin behind every trainer's ``save_checkpoint`` / ``load_checkpoint`` and ``train()``'s
checkpoint options: when to save, where, resume checks (identity, config, world size), pruning, and
the data-parallel hooks. One folder's files are written and validated by ``checkpoint.folder``;
the folder's layout (manifest, models, optimizers, training state, RNG) is in docs/checkpoints.md.

Loading validates everything (class, config, dataset, tokenizers, every component's structure,
file integrity, decodability) before the trainer is changed at all. Saving captures the RNG state
first and restores it afterwards, so a run with checkpoints draws the same numbers as one without.
"""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from typing import Any, Dict, Mapping, Optional

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
from comlrl.checkpoint.interrupt import TrainingInterrupted
from comlrl.models.storage import writing
from comlrl.checkpoint.schedule import CheckpointSchedule
from comlrl.checkpoint.state import (
    CheckpointComponents,
    capture_rng_state,
    config_defaults,
    config_differences,
    config_record,
    dataset_info,
    jsonable,
    restore_rng_state,
    check_reward_fingerprint,
    reward_fingerprint,
    tokenizer_fingerprint,
)


class TrainingCheckpointMixin:
    """``save_checkpoint`` / ``load_checkpoint`` and the checkpoint side of ``train()``.

    A trainer provides ``_checkpoint_components()`` (what to save, see ``CheckpointComponents``),
    ``_checkpoint_identity()`` (config, dataset, tokenizers, W&B identity and the progress
    cursor, all JSON) and ``_checkpoint_check(manifest, states)`` / ``_checkpoint_restored(manifest)``
    for trainer-level checks and follow-up (see ``TrainerBase``).
    """

    _checkpoint_run_id: Optional[str] = None
    _checkpoint_sequence: int = 0
    _checkpoint_schedule: Optional[CheckpointSchedule] = None
    _training_active: bool = False
    _training_failure: Optional[str] = None
    _interrupt: Any = None  # the Interruptible of a running train() (comlrl.checkpoint.interrupt)

    # ------------------------------------------------------------------ trainer interface
    def _checkpoint_components(self) -> CheckpointComponents:
        raise NotImplementedError

    def _checkpoint_identity(self) -> Dict[str, Any]:
        raise NotImplementedError

    def _checkpoint_check(self, manifest: Mapping[str, Any], states: Mapping[str, Any]) -> None:
        """Trainer-level validation before anything is restored (raise CheckpointError)."""

    def _checkpoint_restored(self, manifest: Mapping[str, Any]) -> None:
        """Called after every component is restored and before the RNG is."""

    # data parallelism (see TrainerBase): one writer, the others take part in gathering their states
    def _checkpoint_is_writer(self) -> bool:
        return True

    def _checkpoint_share(self, value: Any) -> Any:
        """The writer's ``value`` on every process."""
        return value

    def _checkpoint_barrier(self) -> None:
        pass

    def _checkpoint_prepare(self, rng: Mapping[str, Any]) -> Optional[Mapping[int, Any]]:
        """Collect what every process must contribute to the next checkpoint (collective); may return
        the full states of sharded models and optimizers (see ``write_checkpoint``)."""
        return None

    def _checkpoint_own_rng(self, rng: Mapping[str, Any]) -> Mapping[str, Any]:
        """The RNG state this process resumes with (the checkpoint's, or its own rank's)."""
        return rng

    # ------------------------------------------------------------------ public
    def save_checkpoint(self, output_dir: str) -> str:
        """Write a checkpoint of the trainer as it is now into ``output_dir`` (new or empty); return it.

        Refused while ``train()`` runs (checkpoints are taken between steps by ``train`` itself) and
        after a ``train()`` that raised, whose state is partial.
        """
        self._checkpoint_require_consistent("save_checkpoint")
        target = os.path.abspath(os.fspath(output_dir))
        if os.path.exists(target) and self._checkpoint_is_writer():
            if not os.path.isdir(target) or os.listdir(target):
                raise FileExistsError(f"{target} already exists and is not an empty directory; refusing to overwrite it. Choose a new path.")
            os.rmdir(target)
        return self._checkpoint_write(target, self._checkpoint_sequence + 1)

    def load_checkpoint(self, path: str) -> Dict[str, Any]:
        """Validate the checkpoint at ``path`` against this trainer, then restore it; return its progress.

        ``path``: a checkpoint folder, its manifest, or a checkpoint_dir (its latest checkpoint).
        Nothing is changed unless every check passes.
        """
        if self._training_active:
            raise RuntimeError("load_checkpoint cannot run while train() is running.")
        plan = self._checkpoint_validate(layout.resolve_checkpoint(path))
        self._checkpoint_apply(plan)
        return dict(plan.manifest["progress"])

    # ------------------------------------------------------------------ train() integration
    def _checkpoint_begin(self, resume_from_checkpoint: Any, schedule: CheckpointSchedule) -> None:
        """At train() start: validate the resume source and ``checkpoint_dir``, then restore."""
        source = self._checkpoint_source(resume_from_checkpoint, schedule)
        plan = None
        if source is not None:
            plan = self._checkpoint_validate(source)
            saved, now = plan.manifest["generation"], self._checkpoint_identity()["generation"]
            if saved != now:
                raise CheckpointError(
                    f"train() generation settings differ from the checkpoint's: {saved} in the checkpoint, {now} here. "
                    f"Pass the same keyword arguments to train() when resuming."
                )
        elif schedule.directory is not None:
            self._checkpoint_require_consistent("train(checkpoint_dir=...)")
        run_id = plan.manifest["run_id"] if plan is not None else self._checkpoint_run_id
        if schedule.directory is not None:
            resuming = run_id is not None
            run_id = self._checkpoint_share(run_id or uuid.uuid4().hex)
            layout.check_directory(schedule.directory, run_id, resuming)
            if self._checkpoint_is_writer():
                layout.open_directory(schedule.directory, run_id)
            self._checkpoint_barrier()
        if plan is not None:
            self._checkpoint_apply(plan)
        self._checkpoint_run_id = run_id
        self._checkpoint_schedule = schedule

    @staticmethod
    def _checkpoint_source(resume_from_checkpoint: Any, schedule: CheckpointSchedule) -> Optional[str]:
        if resume_from_checkpoint is None:
            return None
        if resume_from_checkpoint is True:
            source = layout.latest_checkpoint(schedule.directory)
            if source is None:
                raise FileNotFoundError(f"resume_from_checkpoint=True but {schedule.directory} holds no checkpoint yet.")
            return source
        return layout.resolve_checkpoint(resume_from_checkpoint)

    def _checkpoint_after_step(self, global_step: int) -> None:
        schedule = self._checkpoint_schedule
        saved = None
        if schedule is not None and schedule.due_after_step(global_step):
            saved = self._checkpoint_save_to_directory(schedule, layout.step_checkpoint_name(global_step))
        interrupt = self._interrupt
        if interrupt is not None and interrupt.pending is not None:  # SIGTERM during this step: save it, then stop
            if saved is None and schedule is not None and schedule.directory is not None:
                saved = self._checkpoint_save_to_directory(schedule, layout.step_checkpoint_name(global_step))
            raise TrainingInterrupted(interrupt.pending, saved)

    def _checkpoint_after_epoch(self, epoch: int, final: bool) -> None:
        schedule = self._checkpoint_schedule
        if schedule is not None and schedule.due_after_epoch(epoch, final):
            self._checkpoint_save_to_directory(schedule, layout.epoch_checkpoint_name(epoch))

    def _checkpoint_save_to_directory(self, schedule: CheckpointSchedule, name: str) -> str:
        if self._checkpoint_is_writer():
            sequence = layout.next_sequence(schedule.directory, self._checkpoint_run_id, self._checkpoint_sequence)
            name = layout.free_name(schedule.directory, name)
        else:
            sequence = 0
        sequence, name = self._checkpoint_share((sequence, name))
        path = self._checkpoint_write(os.path.join(schedule.directory, name), sequence)
        if self._checkpoint_is_writer():
            layout.prune(schedule.directory, self._checkpoint_run_id, schedule.total_limit)
        self._checkpoint_barrier()
        return path

    # ------------------------------------------------------------------ internals
    def _checkpoint_class_name(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}"

    def _checkpoint_require_consistent(self, action: str) -> None:
        if self._training_active:
            raise RuntimeError(f"{action} is not possible while train() is running; train() checkpoints between steps itself (checkpoint_dir=...).")
        if self._training_failure is not None:
            raise RuntimeError(
                f"{action} refused: the last train() call raised during {self._training_failure}, so models, optimizers "
                f"and buffers may hold a partial step. Build a new trainer and resume from the latest checkpoint "
                f"(train(resume_from_checkpoint=...))."
            )

    def _checkpoint_write(self, target: str, sequence: int) -> str:
        rng = capture_rng_state()
        if self._checkpoint_run_id is None:
            self._checkpoint_run_id = self._checkpoint_share(uuid.uuid4().hex)
        gathered = self._checkpoint_prepare(rng)
        if not self._checkpoint_is_writer():
            restore_rng_state(rng)
            self._checkpoint_barrier()
            self._checkpoint_sequence = sequence
            return target
        parent = os.path.dirname(target)
        staging = layout.staging_folder(parent, sequence, self._checkpoint_run_id)
        try:
            identity = dict(
                self._checkpoint_identity(), trainer_class=self._checkpoint_class_name(), run_id=self._checkpoint_run_id,
                sequence=sequence, rng=rng,
            )
            with writing(target, "the checkpoint", lambda: self._checkpoint_kept(parent)):
                write_checkpoint(staging, self._checkpoint_components(), identity, gathered)
                layout.publish(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            restore_rng_state(rng)
        self._checkpoint_barrier()
        self._checkpoint_sequence = sequence
        return target

    @staticmethod
    def _checkpoint_kept(directory: str) -> str:
        """What a failed checkpoint write leaves (its partial folder is removed)."""
        latest = layout.latest_checkpoint(directory) if os.path.isdir(directory) else None
        earlier = f" The earlier checkpoints are untouched (latest: {latest}; resume from it with " \
                  f"resume_from_checkpoint=... / --resume)." if latest else ""
        return f" The partial checkpoint was removed.{earlier}"

    def _checkpoint_validate(self, folder: str) -> LoadPlan:
        manifest = layout.read_manifest(folder)
        layout.check_restorable(manifest, folder)
        expected = self._checkpoint_class_name()
        if manifest["trainer_class"] != expected:
            raise CheckpointError(
                f"The checkpoint at {folder} was written by {manifest['trainer_class']}; this trainer is {expected}. "
                f"Resume it with the same trainer class."
            )
        current = self._checkpoint_identity()
        diffs = config_differences(manifest["config"], current["config"], config_defaults(self.args))
        if diffs:
            allowed = ", ".join(current["config"]["resumable"]) or "none"
            raise CheckpointError(
                f"Checkpoint configuration does not match: {'; '.join(diffs)}. Only these fields may change on resume: {allowed}."
            )
        self._checkpoint_compare_identity(manifest, current)
        plan = LoadPlan(folder, manifest, self._checkpoint_components())
        validate_components(plan)
        self._checkpoint_check(manifest, plan.states)
        return plan

    @staticmethod
    def _checkpoint_compare_identity(manifest: Mapping[str, Any], current: Mapping[str, Any]) -> None:
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

    def _checkpoint_apply(self, plan: LoadPlan) -> None:
        apply_components(plan)
        self._checkpoint_run_id = plan.manifest["run_id"]
        self._checkpoint_sequence = plan.manifest["sequence"]
        self._training_failure = None
        self._checkpoint_restored(plan.manifest)
        restore_rng_state(self._checkpoint_own_rng(plan.rng))


def build_identity(*, config: Any, dataset: Any, tokenizers: Mapping[str, Any], wandb: Optional[Mapping[str, Any]], progress: Mapping[str, Any],
                   generation: Mapping[str, Any], reward: Any = None) -> Dict[str, Any]:
    """The JSON identity a trainer's ``_checkpoint_identity`` returns (``reward``: the task's reward function,
    fingerprinted)."""
    return {
        "reward": reward_fingerprint(reward),
        "config": config_record(config),
        "dataset": dataset_info(dataset),
        "tokenizers": {name: tokenizer_fingerprint(tok) for name, tok in tokenizers.items()},
        "wandb": {key: value or None for key, value in wandb.items()} if wandb else None,
        "progress": jsonable(dict(progress)),
        "generation": jsonable(dict(generation)),
    }
