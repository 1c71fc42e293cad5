"""Resolving training entities (agents, critics, reward models) from what the user passed.

Every rule here runs before anything is loaded, so a conflict costs nothing. A *source* is either a
string (a hub id or a local directory, loaded later with ``from_pretrained``) or a model object.

Rules (the "training entities" contract):
- ``model`` alone (a string): ``count`` independent copies of that model.
- ``models`` alone: a non-string sequence with one source per entity.
- both: ``models`` must have ``count`` entries and every entry must name ``model``.
- the same model object twice would make two entities share (and double-step) one set of
  parameters, so it is refused unless the caller explicitly allows shared objects.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence

import torch.nn as nn


def is_model_object(source: Any) -> bool:
    return isinstance(source, nn.Module)


def infer_model_name(source: Any) -> Optional[str]:
    """The loadable name of a source: the string itself, or a model object's ``config._name_or_path``.

    Returns None when an object carries no path. (CoMLRL 1.4.3 fell back to ``config.model_type``
    such as "llama", which is not a loadable name; we never do.)
    """
    if isinstance(source, str):
        return source
    for candidate in (source, getattr(source, "model", None), getattr(source, "base_model", None)):
        config = getattr(candidate, "config", None)
        name = getattr(config, "_name_or_path", None) if config is not None else None
        if isinstance(name, str) and name.strip():
            return name
    return None


class SourceNotFoundError(FileNotFoundError, ValueError):
    """A model or tokenizer source names a local path that does not exist."""


def looks_like_path(name: str) -> bool:
    """True when ``name`` can only mean a local path, never a Hugging Face hub id.

    Hub ids are ``name`` or ``namespace/name``: at most one "/", no backslash, never absolute and
    never starting with "." or "~". So a string is a path when it is absolute, starts with "./",
    "../" or "~", contains a backslash, more than one "/" or a trailing "/", or when its parent
    folder exists here (``runs/agent_0`` inside an existing ``runs/``). Anything else that is not an
    existing folder (``gpt2``, ``org/model``) is taken as a hub id.
    """
    if os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\", "..\\")) or name in (".", ".."):
        return True
    if "\\" in name or name.count("/") > 1 or name.endswith("/"):
        return True
    parent = os.path.dirname(name)
    return bool(parent) and os.path.isdir(os.path.expanduser(parent))


def check_source_exists(name: Any, label: str) -> None:
    """Raise ``SourceNotFoundError`` when the string ``name`` is a local path (``looks_like_path``)
    that does not exist. Hub ids and model objects pass; nothing is loaded or downloaded."""
    if not isinstance(name, str) or os.path.exists(os.path.expanduser(name)) or not looks_like_path(name):
        return
    raise SourceNotFoundError(
        f"{label} {name!r} does not exist: no such local folder. Give the folder of a saved model (config.json "
        f"and weights, e.g. one written by save_model) or a Hugging Face hub id such as 'org/name'."
    )


EMBEDDED_MODEL_HINT = (
    "the embedded SmolLM2-135M-Instruct needs no network: 'default' in comlrl train (agent_model.name=default), "
    "comlrl.models.default_model.default_model_dir() in Python"
)


def load_failure_fix(name: Any, what: str = "a saved model (config.json and weights)") -> str:
    """The fix of a source that failed to load: a folder, a reachable hub id, or the embedded model."""
    fix = f"Give a local folder that holds {what} or a hub id this machine can reach"
    if isinstance(name, str) and not looks_like_path(name):
        fix += f" (check the spelling; {EMBEDDED_MODEL_HINT})"
    return fix + "."


def check_sources_exist(sources: Sequence[Any], kind: str) -> None:
    """``check_source_exists`` for every entry (``kind[i]`` in the message)."""
    for index, source in enumerate(sources):
        check_source_exists(source, f"{kind}[{index}]")


def describe_source(source: Any) -> str:
    if isinstance(source, str):
        return repr(source)
    name = infer_model_name(source)
    suffix = f" loaded from {name!r}" if name else ""
    return f"a {type(source).__name__} object{suffix}"


def _same_name(a: str, b: str) -> bool:
    if a == b:
        return True
    # A local directory may be spelled differently ("./m" vs "m/"); compare resolved paths.
    if os.path.isdir(a) and os.path.isdir(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return False


def resolve_model_sources(
    *,
    kind: str,
    model: Any,
    models: Optional[Sequence[Any]],
    expected_count: int,
    expected_label: Optional[str] = None,
    model_label: str = "model",
    allow_shared_objects: bool = False,
) -> tuple[List[Any], Optional[str]]:
    """Return ``(sources, name of the first source)`` with one source per entity.

    Raises ValueError naming the argument, the value and the fix for every conflict.
    """
    label = expected_label or f"{expected_count} {kind}"
    if isinstance(expected_count, bool) or not isinstance(expected_count, int) or expected_count < 1:
        raise ValueError(f"The number of {kind} must be >= 1. Got {expected_count!r}.")
    if model is None and models is None:
        raise ValueError(f"Either {model_label} or {kind} must be provided.")
    if models is not None:
        if isinstance(models, (str, bytes)) or not isinstance(models, Sequence):
            raise ValueError(
                f"{kind} must be a list with one model id, directory or model object per entity, "
                f"got {type(models).__name__} {models!r}. For identical copies of one model use "
                f"{model_label}={models!r} instead."
            )
        models = list(models)
        if len(models) != expected_count:
            raise ValueError(f"{kind} length ({len(models)}) must match {label}.")
        for index, source in enumerate(models):
            if source is None:
                raise ValueError(f"{kind}[{index}] is None; give a model id, a local directory or a model object.")
            if not isinstance(source, str) and not is_model_object(source):
                raise ValueError(
                    f"{kind}[{index}] must be a model id, a local directory or a torch.nn.Module, "
                    f"got {type(source).__name__}."
                )
        if model is not None:
            _check_consistent(kind, model, models, model_label)
        if not allow_shared_objects:
            _check_distinct_objects(kind, models)
        return models, infer_model_name(models[0])
    if not isinstance(model, str) and not is_model_object(model):
        raise ValueError(
            f"{model_label} must be a model id, a local directory or a torch.nn.Module, got {type(model).__name__}."
        )
    return [model] * expected_count, infer_model_name(model)


def _check_consistent(kind: str, model: Any, models: List[Any], model_label: str) -> None:
    model_name = infer_model_name(model)
    if model_name is None:
        raise ValueError(
            f"{model_label} and {kind} conflict: {model_label} is {describe_source(model)} without a name "
            f"to compare with {kind}. Give only {kind}."
        )
    for index, source in enumerate(models):
        name = infer_model_name(source)
        if name is None or not _same_name(name, model_name):
            raise ValueError(
                f"{model_label} and {kind} conflict: {model_label}={model_name!r} but {kind}[{index}] is "
                f"{describe_source(source)}. When both are given every entry of {kind} must be {model_label}; "
                f"for different models give only {kind} (and set {model_label}=None)."
            )


def _check_distinct_objects(kind: str, models: List[Any]) -> None:
    seen: dict[int, int] = {}
    for index, source in enumerate(models):
        if isinstance(source, str):
            continue
        first = seen.setdefault(id(source), index)
        if first != index:
            raise ValueError(
                f"{kind}[{first}] and {kind}[{index}] are the same model object, so they would share and "
                f"double-update one set of parameters. Pass independent copies (copy.deepcopy) or a model id."
            )
