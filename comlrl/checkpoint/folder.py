"""One checkpoint folder: write it (``write_checkpoint``), check every component against a trainer
before anything changes (``LoadPlan``, ``validate_components``), then apply it (``apply_components``).
The folder's layout is in docs/checkpoints.md; ``store.TrainingCheckpointMixin`` drives these."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import torch

from comlrl.checkpoint import layout
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
from comlrl.checkpoint.state import CheckpointComponents, check_rng_state, decode_value, encode_value, pair_up
from comlrl.parallel.fsdp import optimizer_is_sharded, plain_class_name, shard_optimizer_state


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
