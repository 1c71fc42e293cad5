"""Training checkpoints: save everything a run needs to continue, and resume it exactly.

A checkpoint folder (see ``docs/checkpoints.md``)::

    manifest.json            identity, progress, components, size + SHA-256 of every other file
    models/<name>/           one folder per distinct model: safetensors shards + index.json
    optimizers/<name>.pt     optimizer state_dict            (torch, weights_only)
    schedulers/<name>.pt     scheduler state_dict            (torch, weights_only)
    training_state.pt        runtime states: progress cursor, buffers, metrics, callbacks
    rng_state.pt             Python, NumPy, torch (CPU, CUDA, MPS) generator states

Loading validates everything (class, config, dataset, tokenizers, every component's structure,
file integrity, decodability) before the trainer is changed at all. Saving captures the RNG state
first and restores it afterwards, so a run with checkpoints draws the same numbers as one without.
"""

from __future__ import annotations

import datetime
import os
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import torch

from comlrl.checkpoint import layout
from comlrl.checkpoint.interrupt import TrainingInterrupted
from comlrl.checkpoint.files import (
    MODEL_INDEX_FILENAME,
    CheckpointError,
    check_shard_headers,
    fsync_tree,
    load_module,
    load_torch,
    module_differences,
    read_json,
    record_files,
    save_module,
    save_torch,
    verify_files,
    write_json,
)
from comlrl.checkpoint.layout import MANIFEST_FILENAME, RNG_FILENAME, STATE_FILENAME
from comlrl.parallel.fsdp import optimizer_is_sharded, plain_class_name, shard_optimizer_state
from comlrl.checkpoint.state import (
    CheckpointComponents,
    capture_rng_state,
    check_rng_state,
    config_defaults,
    config_differences,
    config_record,
    dataset_info,
    decode_value,
    encode_value,
    jsonable,
    pair_up,
    restore_rng_state,
    tokenizer_fingerprint,
)


def _library_versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__}
    for name in ("comlrl", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "unknown"
    return out


def _file_name(name: str) -> str:
    return name.replace(os.sep, "_").replace("/", "_")


# ----------------------------------------------------------------------------- writing
def write_checkpoint(
    staging: str, components: CheckpointComponents, identity: Mapping[str, Any], gathered: Optional[Mapping[int, Any]] = None,
) -> Dict[str, Any]:
    """Write every component into ``staging`` and the manifest last; return the manifest.

    ``gathered``: full states of sharded models and optimizers by ``id`` of the object (FSDP:
    gathered by every rank beforehand), written in place of their own sharded ones."""
    gathered = gathered or {}
    models: Dict[str, Dict[str, str]] = {}
    written: Dict[int, str] = {}
    for name, module in components.models.items():
        if id(module) not in written:
            folder = f"models/{_file_name(name)}"
            save_module(os.path.join(staging, folder), module, state=gathered.get(id(module)))
            written[id(module)] = folder
        models[name] = {"folder": written[id(module)], "class": plain_class_name(module)}
    tables: Dict[str, Dict[str, Dict[str, str]]] = {}
    for kind, table in (("optimizers", components.optimizers), ("schedulers", components.schedulers)):
        tables[kind] = {}
        if table:
            os.makedirs(os.path.join(staging, kind), exist_ok=True)
        for name, obj in table.items():
            relative = f"{kind}/{_file_name(name)}.pt"
            state = gathered.get(id(obj))
            save_torch(os.path.join(staging, relative), state if state is not None else obj.state_dict())
            tables[kind][name] = {"file": relative, "class": type(obj).__name__}
    states = {
        name: encode_value(entry.obj.state_dict(), entry.records, where=f"checkpoint state {name!r}")
        for name, entry in components.states.items()
    }
    save_torch(os.path.join(staging, STATE_FILENAME), states)
    save_torch(os.path.join(staging, RNG_FILENAME), identity["rng"])
    manifest = {
        "format": layout.FORMAT_NAME,
        "version": layout.CHECKPOINT_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "libraries": _library_versions(),
        **{k: v for k, v in identity.items() if k != "rng"},
        "models": models,
        "optimizers": tables["optimizers"],
        "schedulers": tables["schedulers"],
        "states": sorted(states),
        "files": record_files(staging),
    }
    write_json(os.path.join(staging, MANIFEST_FILENAME), manifest)
    fsync_tree(staging)
    return manifest


# ----------------------------------------------------------------------------- validating
@dataclass
class LoadPlan:
    """Everything read and checked from a checkpoint, ready to be applied in one go."""

    folder: str
    manifest: Dict[str, Any]
    components: CheckpointComponents
    optimizers: Dict[str, Any] = field(default_factory=dict)
    schedulers: Dict[str, Any] = field(default_factory=dict)
    states: Dict[str, Any] = field(default_factory=dict)
    rng: Dict[str, Any] = field(default_factory=dict)
    model_indexes: Dict[str, Dict[str, Any]] = field(default_factory=dict)


def _names_must_match(kind: str, current: Any, saved: Any) -> None:
    only_here, only_saved = pair_up(current, saved)
    if only_here or only_saved:
        parts = []
        if only_saved:
            parts.append(f"only in the checkpoint: {only_saved}")
        if only_here:
            parts.append(f"only in this trainer: {only_here}")
        raise CheckpointError(f"The checkpoint's {kind} do not match this trainer's ({'; '.join(parts)}).")


def optimizer_differences(saved: Mapping[str, Any], optimizer: Any) -> List[str]:
    """Structural differences between a saved optimizer state_dict and a torch optimizer."""
    if not isinstance(saved, Mapping) or "state" not in saved or "param_groups" not in saved:
        return ["the saved state is not an optimizer state_dict"]
    if not isinstance(optimizer, torch.optim.Optimizer):
        return []
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        return [f"{len(saved['param_groups'])} parameter groups in the checkpoint, {len(groups)} here"]
    params = {}
    for index, (old, new) in enumerate(zip(saved["param_groups"], groups)):
        if len(old["params"]) != len(new["params"]):
            return [f"group {index} has {len(old['params'])} parameters in the checkpoint, {len(new['params'])} here"]
        params.update(zip(old["params"], new["params"]))
    diffs = []
    for key, entry in saved["state"].items():
        param = params.get(key)
        if param is None:
            diffs.append(f"state for unknown parameter {key}")
            continue
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != tuple(param.shape):
                diffs.append(f"parameter {key} {name}: shape {tuple(value.shape)} in the checkpoint, {tuple(param.shape)} here")
    return diffs[:5]


def inside(folder: str, relative: str) -> str:
    """``folder/relative``, refusing paths a manifest could use to leave the checkpoint."""
    path = os.path.normpath(os.path.join(folder, relative))
    if os.path.isabs(relative) or os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) != os.path.abspath(folder):
        raise CheckpointError(f"The checkpoint manifest in {folder} names a path outside the checkpoint: {relative!r}.")
    return path


def validate_components(plan: LoadPlan) -> None:
    """Check models, optimizers, schedulers, runtime states and RNG of ``plan`` (reads the files)."""
    manifest, folder, components = plan.manifest, plan.folder, plan.components
    for kind in ("models", "optimizers", "schedulers"):
        _names_must_match(kind, getattr(components, kind), manifest[kind])
    _names_must_match("runtime states", components.states, manifest["states"])
    for relative in manifest["files"]:
        inside(folder, relative)
    verify_files(folder, manifest["files"])
    for name, module in components.models.items():
        model_folder = inside(folder, manifest["models"][name]["folder"])
        index = read_json(os.path.join(model_folder, MODEL_INDEX_FILENAME), "Model index")
        diffs = module_differences(index, module)
        if diffs:
            raise CheckpointError(f"Model {name!r} differs from the checkpoint's: " + "; ".join(diffs) + ".")
        check_shard_headers(model_folder, index)
        plan.model_indexes[name] = index
    for kind, table, out in (("optimizer", components.optimizers, plan.optimizers), ("scheduler", components.schedulers, plan.schedulers)):
        for name, obj in table.items():
            state = load_torch(inside(folder, manifest[f"{kind}s"][name]["file"]), f"{kind.capitalize()} state")
            diffs = optimizer_differences(state, obj) if kind == "optimizer" else []
            if diffs:
                raise CheckpointError(f"Optimizer {name!r} differs from the checkpoint's: " + "; ".join(diffs) + ".")
            out[name] = state
    saved_states = load_torch(os.path.join(folder, STATE_FILENAME), "Training state")
    for name, entry in components.states.items():
        if name not in saved_states:
            raise CheckpointError(f"The checkpoint's {STATE_FILENAME} lacks the runtime state {name!r}.")
        value = decode_value(saved_states[name], entry.records)
        if entry.check is not None:
            entry.check(value)
        plan.states[name] = value
    plan.rng = load_torch(os.path.join(folder, RNG_FILENAME), "RNG state")
    check_rng_state(plan.rng)


def apply_components(plan: LoadPlan) -> None:
    """Restore every component of a validated plan (RNG excluded: the caller restores it last)."""
    components = plan.components
    for name, module in components.models.items():
        load_module(inside(plan.folder, plan.manifest["models"][name]["folder"]), plan.model_indexes[name], module)
    for name, obj in components.optimizers.items():
        state = plan.optimizers[name]
        obj.load_state_dict(shard_optimizer_state(obj, state) if optimizer_is_sharded(obj) else state)
    for name, obj in components.schedulers.items():
        obj.load_state_dict(plan.schedulers[name])
    for name, entry in components.states.items():
        entry.obj.load_state_dict(plan.states[name])


# ----------------------------------------------------------------------------- schedule of train()
def _positive_int_or_none(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None. Got {value!r}.")


@dataclass(frozen=True)
class CheckpointSchedule:
    """When ``train()`` writes checkpoints into ``directory`` (None: never)."""

    directory: Optional[str]
    interval: int = 1  # epochs
    steps: Optional[int] = None  # training steps
    total_limit: Optional[int] = None

    @classmethod
    def from_train_args(cls, *, checkpoint_dir: Any, checkpoint_interval: Any, checkpoint_total_limit: Any, checkpoint_steps: Any, resume_from_checkpoint: Any) -> "CheckpointSchedule":
        if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int) or checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be an integer >= 1 (epochs between checkpoints). Got {checkpoint_interval!r}.")
        _positive_int_or_none("checkpoint_total_limit", checkpoint_total_limit)
        _positive_int_or_none("checkpoint_steps", checkpoint_steps)
        if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise ValueError(f"checkpoint_dir must be a path or None. Got {checkpoint_dir!r}.")
        if resume_from_checkpoint is not None and resume_from_checkpoint is not True and not isinstance(resume_from_checkpoint, (str, os.PathLike)):
            raise ValueError(
                f"resume_from_checkpoint must be a checkpoint path, a checkpoint_dir, True (the latest checkpoint in "
                f"checkpoint_dir) or None. Got {resume_from_checkpoint!r}."
            )
        if resume_from_checkpoint is True and checkpoint_dir is None:
            raise ValueError("resume_from_checkpoint=True resumes the latest checkpoint of checkpoint_dir; give checkpoint_dir=... too.")
        directory = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        return cls(directory, checkpoint_interval, checkpoint_steps, checkpoint_total_limit)

    def due_after_step(self, global_step: int) -> bool:
        return self.directory is not None and self.steps is not None and global_step % self.steps == 0

    def due_after_epoch(self, epoch: int, final: bool) -> bool:
        return self.directory is not None and (final or epoch % self.interval == 0)


# ----------------------------------------------------------------------------- the mixin
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


def build_identity(*, config: Any, dataset: Any, tokenizers: Mapping[str, Any], wandb: Optional[Mapping[str, Any]], progress: Mapping[str, Any], generation: Mapping[str, Any]) -> Dict[str, Any]:
    """The JSON identity a trainer's ``_checkpoint_identity`` returns."""
    return {
        "config": config_record(config),
        "dataset": dataset_info(dataset),
        "tokenizers": {name: tokenizer_fingerprint(tok) for name, tok in tokenizers.items()},
        "wandb": {key: value or None for key, value in wandb.items()} if wandb else None,
        "progress": jsonable(dict(progress)),
        "generation": jsonable(dict(generation)),
    }
