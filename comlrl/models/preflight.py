"""What can be known of a model source before it loads: whether its weight files are whole, and how
long a sequence it takes.

``check_weight_files(source, label)`` reads only file headers (a safetensors header, a zip's
central directory), so a truncated or corrupted download or copy is one ``WeightFileError`` naming
the file, the entity and the cause instead of a library's "incomplete metadata" after other
models have loaded. ``context_length`` reads a model's config (no weights).
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any, List, Optional, Sequence

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
REFETCH = ("Copy or download the model again (an interrupted download or copy, or a full disk while it was saved, leaves "
           "such a file), or give another folder.")


class WeightFileError(ValueError):
    """A model's weight file is truncated, corrupted or missing."""


def weight_files(folder: str) -> List[str]:
    """The weight files a ``from_pretrained`` of ``folder`` reads: the shards its index lists, else the
    single ``model.safetensors`` / ``pytorch_model.bin``."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index_path = os.path.join(folder, index_name)
        if os.path.isfile(index_path):
            try:
                with open(index_path, encoding="utf-8") as handle:
                    shards = sorted(set(json.load(handle)["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
                raise WeightFileError(f"the weight index {index_path} cannot be read ({error}). {REFETCH}") from None
            return [os.path.join(folder, shard) for shard in shards]
    return [os.path.join(folder, name) for name in ("model.safetensors", "pytorch_model.bin")
            if os.path.isfile(os.path.join(folder, name))]


def check_weight_file(path: str) -> None:
    """Raise ``WeightFileError`` (path and cause) when ``path`` cannot be a whole weight file."""
    if not os.path.isfile(path):
        raise WeightFileError(f"the weight file {path} is missing (its index lists it). {REFETCH}")
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        try:
            with safe_open(path, framework="pt") as handle:
                handle.keys()
        except Exception as error:  # noqa: BLE001 - safetensors raises its own SafetensorError
            size = os.path.getsize(path)
            raise WeightFileError(f"the weight file {path} ({size} bytes) is truncated or corrupted: safetensors cannot read "
                                  f"it ({error}). {REFETCH}") from None
    elif path.endswith(".bin") and not zipfile.is_zipfile(path):
        size = os.path.getsize(path)
        raise WeightFileError(f"the weight file {path} ({size} bytes) is truncated or corrupted: it is not a whole torch "
                              f"zip archive. {REFETCH}")


def check_weight_files(sources: Sequence[Any], kind: str) -> None:
    """``check_weight_file`` for every local folder among ``sources``, naming ``kind[i]``."""
    checked = set()
    for index, source in enumerate(sources):
        if not isinstance(source, str) or not os.path.isdir(os.path.expanduser(source)):
            continue
        folder = os.path.realpath(os.path.expanduser(source))
        if folder in checked:
            continue
        checked.add(folder)
        try:
            for path in weight_files(folder):
                check_weight_file(path)
        except WeightFileError as error:
            raise WeightFileError(f"Cannot load {kind}[{index}] from {source!r}: {error}") from None


def check_sources_loadable(sources: Sequence[Any], kind: str) -> None:
    """Local paths exist (``check_sources_exist``) and their weight files are whole, before anything loads."""
    from comlrl.models.sources import check_sources_exist

    check_sources_exist(sources, kind)
    check_weight_files(sources, kind)


def context_length(config: Any) -> Optional[int]:
    """The most positions a model with this config (an object or a dict) takes, or None when it names none."""
    for candidate in (config, getattr(config, "text_config", None)):
        if candidate is None:
            continue
        for key in CONTEXT_KEYS:
            value = candidate.get(key) if isinstance(candidate, dict) else getattr(candidate, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def source_context_length(source: Any) -> Optional[int]:
    """``context_length`` of a model object, or of a local folder's ``config.json`` (hub ids and adapter
    folders: None, the check then happens when prompts are encoded)."""
    if not isinstance(source, str):
        return context_length(getattr(source, "config", None))
    path = os.path.join(os.path.expanduser(source), "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return context_length(json.load(handle))
    except (OSError, ValueError):
        return None
