"""What a checkpoint holds besides files: the component registry, runtime values and RNG streams.

A trainer names its checkpointed parts in a ``CheckpointComponents`` registry (see
``CheckpointOwner.checkpoint_components``): models (written as safetensors), optimizers and
schedulers (their ``state_dict``), and runtime states (objects with ``state_dict`` /
``load_state_dict`` returning plain values). Runtime values are encoded with built-in types and
tensors only, so every torch file loads with ``weights_only=True``; dataclass records (rollout
buffer entries) are allowed only when the state that holds them lists their type.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type

import numpy as np
import torch
import torch.nn as nn

from comlrl.checkpoint.files import CheckpointError
from comlrl.rollout.rows import callable_name

_KIND = "__kind__"


# ----------------------------------------------------------------------------- plain-value encoding
def encode_value(value: Any, records: Sequence[Type[Any]] = (), where: str = "state") -> Any:
    """``value`` as built-ins and CPU tensors (loadable with ``weights_only=True``).

    Handles None/bool/int/float/str/bytes, tensors, numpy arrays and scalars, lists, tuples, dicts
    with built-in keys, and dataclass instances of the types in ``records``. Anything else raises a
    TypeError naming where it was found.
    """
    if isinstance(value, (np.ndarray, np.generic)):  # before the built-ins: np.float64 is a float
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"{where}: numpy arrays of Python objects cannot be checkpointed.")
        kind = "numpy" if isinstance(value, np.ndarray) else "numpy_scalar"
        return {_KIND: kind, "dtype": array.dtype.str, "shape": list(array.shape), "data": array.tobytes()}
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, (list, tuple)):
        items = [encode_value(v, records, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, Mapping):
        for key in value:
            if key is not None and type(key) not in (str, int, float, bool):
                raise TypeError(f"{where}: dict key {key!r} of type {type(key).__name__} cannot be checkpointed.")
        items = {k: encode_value(v, records, f"{where}[{k!r}]") for k, v in value.items()}
        return {_KIND: "dict", "items": list(items.items())} if _KIND in items else items
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value) in tuple(records):
        fields = {f.name: encode_value(getattr(value, f.name), records, f"{where}.{f.name}") for f in dataclasses.fields(value)}
        return {_KIND: "record", "type": type(value).__name__, "fields": fields}
    raise TypeError(
        f"{where}: a {type(value).__name__} cannot be checkpointed (only built-in values, tensors, numpy arrays"
        + (f" and {', '.join(t.__name__ for t in records)} records" if records else "")
        + " are). Return plain values from state_dict()."
    )


def decode_value(value: Any, records: Sequence[Type[Any]] = ()) -> Any:
    """The inverse of ``encode_value``; unknown record types raise ``CheckpointError``."""
    if isinstance(value, list):
        return [decode_value(v, records) for v in value]
    if isinstance(value, tuple):
        return tuple(decode_value(v, records) for v in value)
    if not isinstance(value, dict):
        return value
    kind = value.get(_KIND)
    if kind in ("numpy", "numpy_scalar"):
        array = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
        return array if kind == "numpy" else array[()]
    if kind == "dict":
        return {k: decode_value(v, records) for k, v in value["items"]}
    if kind == "record":
        by_name = {t.__name__: t for t in records}
        cls = by_name.get(value["type"])
        if cls is None:
            raise CheckpointError(f"Unsupported checkpoint record {value['type']!r} (expected one of {sorted(by_name)}).")
        names = {f.name for f in dataclasses.fields(cls)}
        if set(value["fields"]) != names:
            raise CheckpointError(
                f"Checkpoint record {value['type']} has fields {sorted(value['fields'])}, this version of "
                f"{cls.__name__} has {sorted(names)}."
            )
        return cls(**{k: decode_value(v, records) for k, v in value["fields"].items()})
    return {k: decode_value(v, records) for k, v in value.items()}


# ----------------------------------------------------------------------------- RNG streams
def capture_rng_state() -> Dict[str, Any]:
    """Python, NumPy and torch (CPU, every initialised CUDA device, MPS) generator states."""
    state: Dict[str, Any] = {
        "python": random.getstate(),
        "numpy": encode_value(np.random.get_state()),
        "torch": torch.get_rng_state(),
        "cuda": [t.clone() for t in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else None,
        "mps": torch.mps.get_rng_state() if torch.backends.mps.is_available() else None,
    }
    return state


def check_rng_state(state: Any) -> None:
    """Raise ``CheckpointError`` unless every stream would restore (tried on throwaway generators)."""
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        raise CheckpointError("The checkpoint's RNG state is incomplete (python, numpy and torch streams expected).")
    try:
        random.Random().setstate(state["python"])
        np.random.RandomState().set_state(decode_value(state["numpy"]))
        torch.Generator().set_state(state["torch"])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"The checkpoint's RNG state cannot be restored: {exc}") from exc


def restore_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(decode_value(state["numpy"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if len(cuda) != count:
            warnings.warn(
                f"The checkpoint holds CUDA RNG states of {len(cuda)} devices and this machine has {count}; "
                f"the first {min(count, len(cuda))} are restored.",
                stacklevel=3,
            )
        for index, device_state in enumerate(cuda[:count]):
            torch.cuda.set_rng_state(device_state, index)
    if state.get("mps") is not None and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])


# ----------------------------------------------------------------------------- runtime state adapters
class AttributeState:
    """Checkpoints one attribute of an object as it is (e.g. a trainer's ``rollout_buffers``)."""

    def __init__(self, owner: Any, name: str):
        self.owner, self.name = owner, name

    def state_dict(self) -> Any:
        return getattr(self.owner, self.name)

    def load_state_dict(self, state: Any) -> None:
        setattr(self.owner, self.name, state)


class DataclassState:
    """Checkpoints the fields of a dataclass instance, restored in place (e.g. ``TrainingState``)."""

    def __init__(self, instance: Any):
        self.instance = instance

    def state_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self.instance)

    def check(self, state: Any) -> None:
        names = {f.name for f in dataclasses.fields(self.instance)}
        if not isinstance(state, dict) or set(state) != names:
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"{type(self.instance).__name__} in the checkpoint has fields {found}, expected {sorted(names)}.")

    def load_state_dict(self, state: Any) -> None:
        for name, value in state.items():
            setattr(self.instance, name, value)


def has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


@dataclass
class StateEntry:
    """A runtime state: ``obj.state_dict()`` is encoded with ``records`` allowed as dataclass types;
    ``check(decoded)`` (optional) raises before anything is restored."""

    obj: Any
    records: Tuple[Type[Any], ...] = ()
    check: Optional[Callable[[Any], None]] = None


@dataclass
class CheckpointComponents:
    """The named parts of a trainer a checkpoint holds. Lists register as ``"<name>.<index>"``.

    ``models``: modules written as safetensors (one folder per distinct module; a module registered
    under two names, e.g. a shared reference, is written once). ``optimizers``: objects with
    ``state_dict``/``load_state_dict`` (torch files); ``schedulers`` likewise, a table of the
    checkpoint format that no trainer fills today.
    ``states``: runtime state (see ``add_state``).
    """

    models: Dict[str, nn.Module] = field(default_factory=dict)
    optimizers: Dict[str, Any] = field(default_factory=dict)
    schedulers: Dict[str, Any] = field(default_factory=dict)
    states: Dict[str, StateEntry] = field(default_factory=dict)

    @staticmethod
    def _add(table: Dict[str, Any], prefix: str, values: Any, wrap: Callable[[Any], Any] = lambda v: v) -> None:
        if values is None:
            return
        if isinstance(values, (list, tuple)):
            for index, value in enumerate(values):
                CheckpointComponents._add(table, f"{prefix}.{index}", value, wrap)
            return
        if prefix in table:
            raise ValueError(f"checkpoint component {prefix!r} is registered twice.")
        table[prefix] = wrap(values)

    def add_models(self, name: str, modules: Any) -> "CheckpointComponents":
        """One module or a list of them (None entries are skipped)."""
        self._add(self.models, name, modules)
        return self

    def add_optimizers(self, name: str, optimizers: Any) -> "CheckpointComponents":
        self._add(self.optimizers, name, optimizers)
        return self

    def add_state(
        self, name: str, obj: Any, records: Sequence[Type[Any]] = (), check: Optional[Callable[[Any], None]] = None
    ) -> "CheckpointComponents":
        """A runtime state: any object with ``state_dict()``/``load_state_dict(state)`` whose state is
        built-in values, tensors and numpy arrays, plus dataclass instances of the ``records`` types."""
        if not has_state(obj):
            raise TypeError(f"checkpoint state {name!r} needs state_dict() and load_state_dict(); got {type(obj).__name__}.")
        self._add(self.states, name, StateEntry(obj, tuple(records), check))
        return self

    def add_callbacks(self, objects: Mapping[str, Any]) -> "CheckpointComponents":
        """Register each user object (dataset, reward function, formatter, ...) that offers
        ``state_dict``/``load_state_dict`` as the state ``callbacks.<name>``; others are skipped."""
        for name, obj in objects.items():
            if has_state(obj):
                self.add_state(f"callbacks.{name}", obj)
        return self


# ----------------------------------------------------------------------------- identities
def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> Dict[str, str]:
    """Class and a SHA-256 over everything that decides how the tokenizer maps text to ids."""
    described: Dict[str, Any] = {}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None)  # per-call settings, not identity
        spec.pop("padding", None)
        described["backend"] = spec
    elif callable(getattr(tokenizer, "get_vocab", None)):
        described["vocab"] = sorted(tokenizer.get_vocab().items())
    for name in ("special_tokens_map", "chat_template", "padding_side", "truncation_side", "model_max_length"):
        value = getattr(tokenizer, name, None)
        described[name] = value if isinstance(value, (str, int, float, dict, list, type(None))) else repr(value)
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, Mapping):
        described["added_tokens"] = sorted((int(k), str(v)) for k, v in decoder.items())
    return {"class": type(tokenizer).__name__, "sha256": _sha256_json(described)}


def reward_fingerprint(reward_func: Any) -> Optional[Dict[str, Optional[str]]]:
    """``{"name": module.qualname, "source_sha256": ...}`` of a reward function (a partial's function, what
    a wrapper names as ``__wrapped__`` (``functools.wraps``), a callable object's class); the hash is None
    where Python has no source for it (a builtin)."""
    if reward_func is None:
        return None
    reward_func = inspect.unwrap(getattr(reward_func, "func", reward_func))  # functools.partial, then wrappers
    target = reward_func
    if not (inspect.isfunction(target) or inspect.ismethod(target) or inspect.isclass(target)):
        target = type(target)
    try:
        source: Optional[str] = inspect.getsource(target)
    except (OSError, TypeError):
        source = None
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest() if source is not None else None
    return {"name": callable_name(reward_func), "source_sha256": digest}


REWARD_CHANGE_ENV = "COMLRL_ALLOW_REWARD_CHANGE"


def check_reward_fingerprint(saved: Optional[Mapping[str, Any]], now: Optional[Mapping[str, Any]]) -> None:
    """A resumed run scores with the checkpoint's reward function: another function is refused (unless
    ``$COMLRL_ALLOW_REWARD_CHANGE=1``, then warned about); the same function with edited source is
    warned about. Checkpoints written before the fingerprint existed are not compared."""
    if not saved or not now or dict(saved) == dict(now):
        return
    import os

    if saved["name"] != now["name"]:
        message = (f"The reward function differs from the checkpoint's: the checkpoint was trained with {saved['name']}, this "
                   f"run scores with {now['name']}. Resume with the reward function that wrote the checkpoint, or start a new "
                   f"run; to continue with this one on purpose, set the environment variable {REWARD_CHANGE_ENV}=1.")
        if os.environ.get(REWARD_CHANGE_ENV) != "1":
            raise CheckpointError(message)
        warnings.warn(message.split(" Resume with")[0] + f" (continuing: {REWARD_CHANGE_ENV}=1).", stacklevel=5)
        return
    warnings.warn(f"The source of the reward function {now['name']} changed since the checkpoint was written (sha256 "
                  f"{str(saved['source_sha256'])[:12]}... then, {str(now['source_sha256'])[:12]}... now); the resumed run "
                  f"scores with the edited function.", stacklevel=5)


def dataset_info(dataset: Any) -> Optional[Dict[str, Any]]:
    if dataset is None:
        return None
    try:
        length: Optional[int] = len(dataset)
    except TypeError:
        length = None
    fingerprint = getattr(dataset, "_fingerprint", None)
    return {"class": type(dataset).__name__, "length": length, "fingerprint": fingerprint if isinstance(fingerprint, str) else None}


def jsonable(value: Any) -> Any:
    """A JSON-compatible copy (tuples become lists, devices and dtypes strings, other objects their repr)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    return repr(value) if not isinstance(value, (torch.device, torch.dtype)) else str(value)


def config_record(config: Any) -> Dict[str, Any]:
    """``{"class", "fields": {field: JSON value}, "resumable": [...]}`` of a trainer config dataclass."""
    secret = getattr(config, "secret_fields", frozenset())  # credentials never reach a checkpoint
    fields = {f.name: jsonable(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init and f.name not in secret}
    return {"class": type(config).__name__, "fields": fields, "resumable": sorted(config.resumable_fields)}


def config_defaults(config: Any) -> Dict[str, Any]:
    """``{field: JSON value of its default}`` of a trainer config dataclass (fields with a default)."""
    out = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            out[f.name] = jsonable(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = jsonable(f.default_factory())  # type: ignore[misc]
    return out


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any], defaults: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Fields that differ between two ``config_record``s, except the current config's resumable ones.

    A field the checkpoint does not record (written by an older comlrl, before the field existed) is
    no difference while the current value is the field's default in ``defaults``: that is the
    behaviour the older version had."""
    allowed = set(current["resumable"])
    defaults = defaults or {}
    diffs = []
    if saved["class"] != current["class"]:
        diffs.append(f"config class (checkpoint {saved['class']}, this run {current['class']})")
    for name in sorted(set(saved["fields"]) | set(current["fields"])):
        if name in allowed:
            continue
        old, new = saved["fields"].get(name, "<absent>"), current["fields"].get(name, "<absent>")
        if name not in saved["fields"] and name in defaults and new == defaults[name]:
            continue
        if old != new:
            diffs.append(f"{name} (checkpoint {old!r}, this run {new!r})")
    return diffs


def pair_up(names: Iterable[str], saved: Iterable[str]) -> Tuple[List[str], List[str]]:
    """Names only in the trainer and names only in the checkpoint."""
    names, saved = set(names), set(saved)
    return sorted(names - saved), sorted(saved - names)


def per_agent_lists(count: int, name: str) -> Callable[[Any], None]:
    """A ``StateEntry.check`` for buffers kept as one list per agent."""

    def check(value: Any) -> None:
        if not isinstance(value, list) or len(value) != count or not all(isinstance(v, list) for v in value):
            shape = f"{len(value)} entries" if isinstance(value, list) else type(value).__name__
            raise CheckpointError(f"{name} in the checkpoint must be {count} lists (one per agent); found {shape}.")

    return check
