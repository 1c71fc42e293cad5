"""Where checkpoints live: the manifest, a directory of checkpoint folders, ownership.

A checkpoint folder holds ``manifest.json`` (small, human-readable: identity, progress, file
records) beside the weight and state files. Its name says where the run was, as CoMLRL 1.4.x's do:
``checkpoint-<epochs done>`` after an epoch, ``checkpoint-step-<global step>`` inside one. A name
that is taken (a run resumed from an older checkpoint reaches an epoch again) gets ``.v2``, ``.v3``,
..., so nothing is ever overwritten. A ``checkpoint_dir`` holds the checkpoints of one run: each
manifest carries the run id and a ``sequence`` that only grows (which checkpoint is the latest), a
new run refuses a directory that holds checkpoints, a resumed run refuses one that holds another
run's, and pruning only ever removes this run's folders. ``run.json`` names the run that owns the
directory (``resume_from_checkpoint="auto"`` continues that run). Writes go to a hidden staging folder that
is renamed into place; a kill leaves at most a hidden leftover, which the same run removes later.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from comlrl.models.saving import make_temp_dir, make_temp_file
from comlrl.checkpoint.files import CheckpointError, fsync_dir, read_json, write_json

CHECKPOINT_VERSION = 2  # CoMLRL 1.4.3 wrote version 1: one training_state.pt holding everything
MANIFEST_FILENAME = "manifest.json"
STATE_FILENAME = "training_state.pt"  # runtime state: progress, buffers, metrics, callbacks
RNG_FILENAME = "rng_state.pt"
FORMAT_NAME = "comlrl-checkpoint"
OWNER_FILENAME = "run.json"  # in a checkpoint_dir: the run that owns it
OWNER_FORMAT = "comlrl-checkpoint-dir"
# checkpoint-<E>, checkpoint-step-<S> and the preference trainers' phase names (checkpoint-collected,
# checkpoint-round-<R>-epoch-<E>, ...), each optionally with a .v<N> suffix
# (other checkpoint-* names, e.g. a user's checkpoint-best, are not ours and are left alone)
_ENTRY = re.compile(r"^checkpoint-(?:step-\d+|\d+|collected|reward-model|round-\d+(?:-collected|-reward-model|-epoch-\d+)?)(?:\.v\d+)?$")
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


# ----------------------------------------------------------------------------- the manifest
def _require(condition: bool, message: str, path: str) -> None:
    if not condition:
        raise CheckpointError(f"Invalid checkpoint manifest {path}: {message}")


def check_manifest(manifest: Any, path: str) -> Dict[str, Any]:
    """Validate the identity fields every reader relies on; return the manifest."""
    _require(isinstance(manifest, dict), "the top level is not an object", path)
    missing = [k for k in ("format", "version", "trainer_class", "sequence", "run_id") if k not in manifest]
    if missing:
        raise CheckpointError(f"Incomplete checkpoint manifest {path}: missing {missing}.")
    _require(manifest["format"] == FORMAT_NAME, f"format is {manifest['format']!r}, expected {FORMAT_NAME!r}", path)
    version = manifest["version"]
    if isinstance(version, bool) or version != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"Unsupported checkpoint version {version!r} in {path}; this comlrl reads version {CHECKPOINT_VERSION}."
        )
    trainer_class = manifest["trainer_class"]
    _require(isinstance(trainer_class, str) and bool(trainer_class), "trainer class must be a non-empty string", path)
    sequence = manifest["sequence"]
    _require(isinstance(sequence, int) and not isinstance(sequence, bool) and sequence >= 0,
             f"sequence must be a non-negative integer, got {sequence!r}", path)
    run_id = manifest["run_id"]
    _require(isinstance(run_id, str) and bool(_RUN_ID.match(run_id)), f"run identity {run_id!r} is not 32 lowercase hex digits", path)
    wandb = manifest.get("wandb")
    if wandb is not None:
        ok = isinstance(wandb, dict) and isinstance(wandb.get("id"), str) and bool(wandb["id"])
        ok = ok and set(wandb) <= {"id", "project", "entity"}
        ok = ok and all(v is None or isinstance(v, str) for v in wandb.values())
        _require(ok, f"W&B identity must be {{id, project, entity}} strings, got {wandb!r}", path)
    return manifest


RESTORE_FIELDS = ("progress", "config", "dataset", "tokenizers", "generation", "models", "optimizers", "schedulers", "states", "files")


def check_restorable(manifest: Mapping[str, Any], path: str) -> None:
    """The fields a restore needs beyond the identity (``read_checkpoint_metadata`` does not need them)."""
    missing = [k for k in RESTORE_FIELDS if k not in manifest]
    if missing:
        raise CheckpointError(f"Incomplete checkpoint manifest in {path}: missing {missing}; the checkpoint cannot be restored.")


def checkpoint_folder(path: str) -> str:
    """The checkpoint folder for a folder path or the path of its manifest."""
    path = os.fspath(path)
    if os.path.isfile(path) and os.path.basename(path) == MANIFEST_FILENAME:
        return os.path.dirname(os.path.abspath(path))
    return path


def read_manifest(path: str) -> Dict[str, Any]:
    folder = checkpoint_folder(path)
    manifest_path = os.path.join(folder, MANIFEST_FILENAME)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"No checkpoint at {folder}: the directory does not exist.")
    if not os.path.isfile(manifest_path):
        if os.path.isfile(os.path.join(folder, STATE_FILENAME)):
            raise CheckpointError(
                f"{folder} holds a {STATE_FILENAME} without {MANIFEST_FILENAME}: a CoMLRL 1.4.3 checkpoint (or an "
                f"incomplete one). comlrl cannot resume 1.4.3 checkpoints; export the models with 1.4.3's save_model "
                f"and start a new run from them."
            )
        raise CheckpointError(f"{folder} is not a comlrl checkpoint: it has no {MANIFEST_FILENAME}.")
    return check_manifest(read_json(manifest_path, "Checkpoint manifest"), manifest_path)


def read_checkpoint_metadata(checkpoint: str) -> Dict[str, Any]:
    """Identity of a checkpoint without loading anything else.

    ``checkpoint``: a checkpoint folder, its ``manifest.json``, or a ``checkpoint_dir`` (its latest
    checkpoint is read). Returns ``version``, ``trainer_class``, ``sequence``, ``run_id``, ``wandb``
    (``{"id", "project", "entity"}`` or None without W&B), ``progress`` (epoch, position,
    env_step, global_step) and ``path`` (the checkpoint folder read).
    """
    folder = resolve_checkpoint(checkpoint)
    manifest = read_manifest(folder)
    return {
        "version": manifest["version"],
        "trainer_class": manifest["trainer_class"],
        "sequence": manifest["sequence"],
        "run_id": manifest["run_id"],
        "wandb": dict(manifest["wandb"]) if manifest.get("wandb") else None,
        "progress": dict(manifest.get("progress") or {}),
        "path": folder,
    }


# ----------------------------------------------------------------------------- a directory of checkpoints
@dataclass
class Entry:
    path: str
    numbers: Tuple[int, ...]  # the numbers of the name (epoch, step, round), for ordering entries without a manifest
    run_id: Optional[str]  # None: no readable manifest (foreign, legacy or damaged)
    sequence: Optional[int]


def epoch_checkpoint_name(epoch: int) -> str:
    return f"checkpoint-{epoch}"


def step_checkpoint_name(global_step: int) -> str:
    return f"checkpoint-step-{global_step}"


def phase_checkpoint_name(phase: str, round_number: Optional[int] = None, epoch: Optional[int] = None) -> str:
    """A preference trainer's commit point: ``checkpoint-<phase>`` (one-round trainers) or
    ``checkpoint-round-<R>[-<phase>][-epoch-<E>]`` (iterative trainers; R counts from 1)."""
    parts = ["checkpoint"] + ([f"round-{round_number}"] if round_number is not None else []) + ([phase] if phase else [])
    if epoch is not None:
        parts.append(f"epoch-{epoch}")
    return "-".join(parts)


def free_name(directory: str, name: str) -> str:
    """``name``, or ``name.v2``, ``name.v3``, ... : the first that does not exist in ``directory``."""
    candidate, version = name, 1
    while os.path.lexists(os.path.join(directory, candidate)):
        version += 1
        candidate = f"{name}.v{version}"
    return candidate


def list_entries(directory: str) -> List[Entry]:
    """Every checkpoint entry of ``directory`` (readable or not), oldest first (by sequence where
    the manifest is readable)."""
    entries = []
    if not os.path.isdir(directory):
        return entries
    for name in os.listdir(directory):
        match = _ENTRY.match(name)
        if not match:
            continue
        path = os.path.join(directory, name)
        run_id = sequence = None
        try:
            manifest = read_manifest(path)
            run_id, sequence = manifest["run_id"], manifest["sequence"]
        except (CheckpointError, OSError):
            pass
        numbers = tuple(int(n) for n in re.findall(r"\d+", name.split(".v")[0]))
        entries.append(Entry(path, numbers, run_id, sequence))
    return sorted(entries, key=lambda e: (e.sequence if e.sequence is not None else -1, e.numbers, e.path))


def latest_checkpoint(directory: str) -> Optional[str]:
    """The readable checkpoint with the highest sequence in ``directory`` (None if there is none)."""
    readable = [e for e in list_entries(directory) if e.run_id is not None]
    runs = {e.run_id for e in readable}
    if len(runs) > 1:
        raise CheckpointError(
            f"{directory} holds checkpoints of {len(runs)} different runs ({sorted(runs)}); name the checkpoint "
            f"folder to resume explicitly."
        )
    return max(readable, key=lambda e: e.sequence).path if readable else None


def resolve_checkpoint(path: Any) -> str:
    """A checkpoint folder from a folder, a manifest path, or a directory of checkpoints (latest)."""
    folder = checkpoint_folder(os.fspath(path))
    if os.path.isdir(folder) and not os.path.exists(os.path.join(folder, MANIFEST_FILENAME)):
        entries = list_entries(folder)
        if entries:
            latest = latest_checkpoint(folder)
            if latest is None:
                try:
                    read_manifest(entries[-1].path)
                except (CheckpointError, OSError) as exc:
                    raise CheckpointError(f"{folder} holds checkpoint-* folders but none is readable; the newest: {exc}") from exc
            return latest
    return folder


def describe_foreign(entries: List[Entry]) -> str:
    parts = []
    for entry in entries[:3]:
        owner = f"run {entry.run_id}" if entry.run_id else "no readable ownership metadata"
        parts.append(f"{os.path.basename(entry.path)} ({owner})")
    return ", ".join(parts) + (" ..." if len(entries) > 3 else "")


def check_directory(directory: str, run_id: str, resuming: bool, skip_foreign: bool = False) -> None:
    """Refuse a ``checkpoint_dir`` that holds checkpoints of another run (nothing is changed).

    A new run needs a directory without ``checkpoint-*`` entries; a resumed run accepts only its own,
    unless ``skip_foreign`` (``resume_from_checkpoint="auto"``, which has named every other entry and
    why it is skipped: they are never read, pruned or overwritten).
    """
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"checkpoint_dir {directory} exists and is not a directory; choose another path.")
    entries = list_entries(directory)
    foreign = [e for e in entries if e.run_id != run_id]
    if foreign and resuming and skip_foreign:
        return
    if foreign and not resuming:
        raise FileExistsError(
            f"checkpoint_dir {directory} already contains another run's checkpoints: {describe_foreign(foreign)}. "
            f"Use an empty checkpoint_dir for a new run, or continue that run with "
            f"train(resume_from_checkpoint=..., checkpoint_dir=...)."
        )
    if foreign:
        raise FileExistsError(
            f"checkpoint_dir {directory} contains checkpoints of another run (this run is {run_id}): "
            f"{describe_foreign(foreign)}. Write into an empty checkpoint_dir or into this run's own."
        )


def open_directory(directory: str, run_id: str) -> None:
    """Create ``directory``, record ``run_id`` as its owner and remove this run's leftovers from a
    kill during a save."""
    os.makedirs(directory, exist_ok=True)
    claim_directory(directory, run_id)
    remove_leftovers(directory, run_id)


def read_owner(directory: str) -> Optional[str]:
    """The run id ``run.json`` of ``directory`` names (None without a readable record)."""
    path = os.path.join(directory, OWNER_FILENAME)
    try:
        record = read_json(path, "Checkpoint directory record")
    except (OSError, CheckpointError):
        return None
    run_id = record.get("run_id") if isinstance(record, dict) and record.get("format") == OWNER_FORMAT else None
    return run_id if isinstance(run_id, str) and _RUN_ID.match(run_id) else None


def claim_directory(directory: str, run_id: str) -> None:
    """Write ``run.json`` naming ``run_id`` (atomically). A record of another run is replaced only when
    the directory holds no checkpoint of that run (it never saved one); ``check_directory`` has refused
    every other case before."""
    owner = read_owner(directory)
    if owner == run_id:
        return
    if owner is not None and any(e.run_id == owner for e in list_entries(directory)):
        raise FileExistsError(f"checkpoint_dir {directory} belongs to run {owner} ({OWNER_FILENAME}), which has checkpoints "
                              f"there; this run is {run_id}. Use another checkpoint_dir.")
    staging = make_temp_file(directory, f".{OWNER_FILENAME}.", ".tmp")
    try:
        write_json(staging, {"format": OWNER_FORMAT, "version": 1, "run_id": run_id})
        os.replace(staging, os.path.join(directory, OWNER_FILENAME))
    except BaseException:
        if os.path.exists(staging):
            os.remove(staging)
        raise
    fsync_dir(directory)


def leftovers(directory: str) -> List[str]:
    """The hidden folders unfinished saves left in ``directory`` (staging and discard folders of any run)."""
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.startswith(".checkpoint-") and name.endswith((".staging", ".discard")))


def next_sequence(directory: Optional[str], run_id: Optional[str], current: int) -> int:
    """One past ``current`` and every sequence of ``run_id`` in ``directory``."""
    entries = list_entries(directory) if directory else []
    return max([current] + [e.sequence for e in entries if e.run_id == run_id and e.sequence is not None]) + 1


def staging_folder(directory: str, sequence: int, run_id: str) -> str:
    os.makedirs(directory, exist_ok=True)
    return make_temp_dir(directory, f".checkpoint-{sequence}.{run_id}.", ".staging")


def publish(staging: str, target: str) -> None:
    """Rename a complete staging folder to ``target`` (which must not exist) and persist the rename."""
    if os.path.lexists(target):
        raise FileExistsError(f"{target} already exists; refusing to overwrite it.")
    os.rename(staging, target)
    fsync_dir(os.path.dirname(os.path.abspath(target)))


def discard(path: str, run_id: str) -> None:
    """Remove a folder by first renaming it out of sight, so a kill never leaves half a checkpoint."""
    parent, name = os.path.split(os.path.abspath(path))
    trash = tempfile.mkdtemp(prefix=f".{name}.{run_id}.", suffix=".discard", dir=parent)
    os.rmdir(trash)
    os.rename(path, trash)
    fsync_dir(parent)
    shutil.rmtree(trash, ignore_errors=True)


def remove_leftovers(directory: str, run_id: str) -> None:
    """Delete this run's hidden staging/discard folders left by a killed process."""
    for name in os.listdir(directory):
        if name.startswith(".checkpoint-") and f".{run_id}." in name and name.endswith((".staging", ".discard")):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def prune(directory: str, run_id: str, limit: Optional[int]) -> List[str]:
    """Keep the newest ``limit`` checkpoints of ``run_id``; never touch anything else. Returns removed paths."""
    if limit is None:
        return []
    owned = sorted((e for e in list_entries(directory) if e.run_id == run_id), key=lambda e: e.sequence)
    removed = []
    for entry in owned[: max(len(owned) - limit, 0)]:
        discard(entry.path, run_id)
        removed.append(entry.path)
    return removed

