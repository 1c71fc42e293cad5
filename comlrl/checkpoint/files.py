"""Files of a training checkpoint: durable writes, sharded safetensors per model, integrity records.

Everything here is about bytes on disk; what goes into a checkpoint is decided in
``checkpoint.py``. Model weights are written as safetensors shards with an ``index.json``;
optimizer, RNG and runtime state as torch files that load with ``weights_only=True``. Every file's
size and SHA-256 go into the manifest, so a truncated or corrupted file is named when it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn

from comlrl.models.saving import apply_umask
from comlrl.parallel.fsdp import is_sharded, load_full_model_state, plain_class_name

# Largest safetensors shard of one model (bytes of tensor data). Shards keep host memory bounded
# while a GPU model is written and keep single files at a size file systems and tools handle well.
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3
MODEL_INDEX_FILENAME = "index.json"


class CheckpointError(ValueError):
    """A checkpoint cannot be used by this trainer (the message says what differs)."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is missing, truncated or does not match its recorded SHA-256."""


# ----------------------------------------------------------------------------- durability
def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Persist a directory's entries (renames, new files); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """fsync every file and directory under ``root`` (directories after their contents)."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_file(os.path.join(directory, name))
        fsync_dir(directory)


def write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=1, sort_keys=True, allow_nan=False)
        handle.write("\n")


def read_json(path: str, what: str) -> Any:
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return json.load(handle)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointCorruptError(f"{what} {path} is truncated or corrupted (not valid JSON: {exc}).") from exc


def save_torch(path: str, value: Any) -> None:
    # through a Python file object, so a full disk is an OSError (ENOSPC), not torch's "unexpected pos"
    with open(path, "wb") as handle:
        torch.save(value, handle)


def load_torch(path: str, what: str) -> Any:
    """``torch.load(weights_only=True)`` onto the CPU, naming the file when it cannot be read."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{what} {path} is missing.") from None
    except Exception as exc:  # torch raises RuntimeError/UnpicklingError/EOFError for damaged files
        raise CheckpointCorruptError(f"{what} {path} is truncated or corrupted and cannot be loaded: {exc}") from exc


# ----------------------------------------------------------------------------- integrity
def file_record(path: str) -> Dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return {"size": os.path.getsize(path), "sha256": digest.hexdigest()}


def _hash_all(paths: List[str]) -> List[Dict[str, Any]]:
    """``file_record`` of every path, several files at once (hashlib releases the GIL)."""
    workers = max(1, min(len(paths), os.cpu_count() or 1, 8))
    if workers == 1:
        return [file_record(path) for path in paths]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(file_record, paths))


def record_files(root: str) -> Dict[str, Dict[str, Any]]:
    """``{relative path: {size, sha256}}`` of every file under ``root``."""
    paths = sorted(os.path.join(directory, name) for directory, _, files in os.walk(root) for name in files)
    relative = [os.path.relpath(path, root).replace(os.sep, "/") for path in paths]
    return dict(zip(relative, _hash_all(paths)))


def verify_files(root: str, records: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise ``CheckpointCorruptError`` naming the first missing, truncated or altered file."""
    paths = {relative: os.path.join(root, *relative.split("/")) for relative in sorted(records)}
    for relative, path in paths.items():
        expected = records[relative]["size"]
        if not os.path.isfile(path):
            raise CheckpointCorruptError(f"Checkpoint file {path} is missing; the checkpoint at {root} is incomplete.")
        size = os.path.getsize(path)
        if size != expected:
            kind = "truncated" if size < expected else "corrupted (larger than written)"
            raise CheckpointCorruptError(
                f"Checkpoint file {path} is {kind}: {size} bytes on disk, {expected} written. Resume from an earlier checkpoint."
            )
    for (relative, path), actual in zip(paths.items(), _hash_all(list(paths.values()))):
        if actual["sha256"] != records[relative]["sha256"]:
            raise CheckpointCorruptError(
                f"Checkpoint file {path} is corrupted: its SHA-256 differs from the one recorded when it was "
                f"written. Resume from an earlier checkpoint."
            )


# ----------------------------------------------------------------------------- model weights
def _storage_key(tensor: torch.Tensor) -> Tuple[Any, ...]:
    return (tensor.device.type, tensor.device.index, tensor.untyped_storage().data_ptr())


def _view_key(tensor: torch.Tensor) -> Tuple[Any, ...]:
    return _storage_key(tensor) + (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def dedup_state(state: Mapping[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Split a state dict into tensors to write and aliases (tied weights: ``{alias: written name}``).

    Identical views are written once; a tensor that overlaps another's storage differently is
    copied, since safetensors refuses shared memory.
    """
    unique: Dict[str, torch.Tensor] = {}
    aliases: Dict[str, str] = {}
    by_view: Dict[Tuple[Any, ...], str] = {}
    storages = set()
    for name, tensor in state.items():
        view = _view_key(tensor)
        if view in by_view:
            aliases[name] = by_view[view]
            continue
        storage = _storage_key(tensor)
        if storage in storages or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone() if storage in storages else tensor.contiguous()
        storages.add(storage)
        by_view[view] = name
        unique[name] = tensor
    return unique, aliases


def _shards(tensors: Mapping[str, torch.Tensor], max_bytes: int) -> List[List[str]]:
    shards: List[List[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_table(state: Mapping[str, torch.Tensor]) -> Dict[str, Dict[str, Any]]:
    return {name: {"shape": list(t.shape), "dtype": _dtype_name(t.dtype)} for name, t in state.items()}


def training_flags(module: nn.Module) -> Dict[str, Any]:
    """The module's train/eval flag and the submodules that differ from it."""
    root = module.training
    return {"training": root, "training_exceptions": [n for n, m in module.named_modules() if n and m.training != root]}


def save_module(
    folder: str, module: nn.Module, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, state: Optional[Mapping[str, torch.Tensor]] = None,
) -> Dict[str, Any]:
    """Write ``module.state_dict()`` (or ``state``: the full tensors of a sharded module) as
    safetensors shards plus ``index.json``; return the index."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    state = module.state_dict() if state is None else state
    unique, aliases = dedup_state(state)
    shards = _shards(unique, max_shard_bytes)
    weight_map = {}
    for number, names in enumerate(shards, start=1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: unique[name].detach().cpu() for name in names}, os.path.join(folder, filename))
        apply_umask(os.path.join(folder, filename))  # safetensors creates its files 0600
        weight_map.update({name: filename for name in names})
    index = {
        "class": plain_class_name(module),
        "weight_map": weight_map,
        "aliases": aliases,
        "tensors": tensor_table(state),
        **training_flags(module),
    }
    write_json(os.path.join(folder, MODEL_INDEX_FILENAME), index)
    return index


def module_differences(index: Mapping[str, Any], module: nn.Module, limit: int = 5) -> List[str]:
    """Human-readable differences between a saved index and ``module`` (empty when compatible)."""
    saved = index["tensors"]
    current = tensor_table(module.state_dict())
    diffs = []
    if index["class"] != plain_class_name(module):
        diffs.append(f"class {index['class']} in the checkpoint, {plain_class_name(module)} here")
    missing = sorted(set(saved) - set(current))
    extra = sorted(set(current) - set(saved))
    if missing:
        diffs.append(f"tensors only in the checkpoint: {missing[:limit]}" + (" ..." if len(missing) > limit else ""))
    if extra:
        diffs.append(f"tensors only in this model: {extra[:limit]}" + (" ..." if len(extra) > limit else ""))
    changed = [n for n in sorted(set(saved) & set(current)) if saved[n] != current[n]]
    for name in changed[:limit]:
        diffs.append(
            f"{name}: {saved[name]['dtype']}{saved[name]['shape']} in the checkpoint, "
            f"{current[name]['dtype']}{current[name]['shape']} here"
        )
    if len(changed) > limit:
        diffs.append(f"... and {len(changed) - limit} more tensors differ")
    return diffs


def check_shard_headers(folder: str, index: Mapping[str, Any]) -> None:
    """Open every shard's header and check it lists the tensors the index promises."""
    from safetensors import safe_open

    by_file: Dict[str, List[str]] = {}
    for name, filename in index["weight_map"].items():
        by_file.setdefault(filename, []).append(name)
    for filename, names in by_file.items():
        path = os.path.join(folder, filename)
        try:
            with safe_open(path, framework="pt") as handle:
                keys = set(handle.keys())
        except Exception as exc:
            raise CheckpointCorruptError(f"Model shard {path} is truncated or corrupted: {exc}") from exc
        if not set(names) <= keys:
            raise CheckpointCorruptError(f"Model shard {path} lacks tensors its index lists: {sorted(set(names) - keys)[:5]}.")


def load_module(folder: str, index: Mapping[str, Any], module: nn.Module) -> None:
    """Copy the saved tensors into ``module`` in place and restore its train/eval flags. A module
    with sharded (FSDP) parameters takes the full tensors on every rank together (collective)."""
    from safetensors import safe_open

    targets = module.state_dict(keep_vars=True)
    sharded = is_sharded(module)
    full: Dict[str, torch.Tensor] = {}
    by_file: Dict[str, List[str]] = {}
    for name, filename in index["weight_map"].items():
        by_file.setdefault(filename, []).append(name)
    sources: Dict[str, List[str]] = {}
    for name in targets:
        sources.setdefault(index["aliases"].get(name, name), []).append(name)
    with torch.no_grad():
        for filename, names in by_file.items():
            with safe_open(os.path.join(folder, filename), framework="pt") as handle:
                for name in names:
                    value = handle.get_tensor(name)
                    for target_name in sources.get(name, []):
                        if sharded:
                            full[target_name] = value
                        else:
                            targets[target_name].copy_(value)
    if sharded:
        load_full_model_state(module, full)
    module.train(index["training"])
    exceptions = set(index["training_exceptions"])
    for name, sub in module.named_modules():
        if name in exceptions:
            sub.training = not index["training"]
