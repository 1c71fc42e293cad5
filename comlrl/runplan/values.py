"""Checking config values: types from dataclass annotations or short specs, unknown keys with hints.

``coerce(value, hint, raw)`` accepts what YAML and the command line produce for a field of type
``hint``: an int for a float, a numeric string for a float (PyYAML reads ``5e-6`` as a string), the
override's own text for a string field (``wandb.name=1.5`` -> "1.5").
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from comlrl.runplan.overrides import as_text


def _describe(hint: Any) -> str:
    if hint is typing.Any:
        return "any value"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        names = [_describe(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (tuple, list):
        return f"a list of {len(args)}" if origin is tuple and args and args[-1] is not Ellipsis else "a list"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping"}.get(hint, str(hint))


def coerce(value: Any, hint: Any, raw: Optional[str] = None) -> Tuple[bool, Any]:
    """Whether ``value`` fits the type ``hint`` (after the usual YAML/CLI coercions), and the value."""
    if hint is typing.Any:
        return True, value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        if value is None:
            return type(None) in args, None
        for arg in args:
            ok, out = coerce(value, arg, raw) if arg is not type(None) else (False, None)
            if ok:
                return True, out
        return False, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        if isinstance(value, str):
            try:
                return True, float(value)
            except ValueError:
                return False, value
        return False, value
    if hint is str:
        if isinstance(value, str):
            return True, value
        if raw is not None and not isinstance(value, (list, dict)) and value is not None:
            return True, as_text(value, raw)
        return False, value
    if origin in (tuple, list) or hint in (tuple, list):
        return isinstance(value, (list, tuple)), value
    if hint is dict or origin in (dict, typing.Mapping):
        return isinstance(value, dict), value
    return True, value


SPEC_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "dict": dict, "list": list, "any": typing.Any}


def spec_hint(spec: str) -> Any:
    base = SPEC_TYPES[spec.rstrip("?")]
    return typing.Optional[base] if spec.endswith("?") and base is not typing.Any else base


def check_value(key: str, value: Any, hint: Any, raw: Optional[str] = None) -> Any:
    """``value`` coerced to ``hint``, or a ValueError naming ``key``, the expected type and the value."""
    ok, out = coerce(value, hint, raw)
    if not ok:
        raise ValueError(f"{key} must be {_describe(hint)}, got {value!r} ({type(value).__name__}).")
    return out


def unknown_keys(where: str, keys: Sequence[str], known: Sequence[str]) -> None:
    if not keys:
        return
    hints = []
    for key in keys:
        close = difflib.get_close_matches(key, list(known), n=1)
        hints.append(f"{where}{key}" + (f" (did you mean {where}{close[0]}?)" if close else ""))
    raise ValueError(f"Unknown config key(s): {', '.join(hints)}. Valid here: {', '.join(sorted(known)) or 'none'}.")


def check_section(name: str, values: Any, spec: Mapping[str, str], raws: Mapping[str, str]) -> Dict[str, Any]:
    """A fixed section (``agent_model``, ``output``, ...): a mapping of known keys with typed values."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{name} must be a section (a mapping), got {values!r}.")
    unknown_keys(f"{name}.", [k for k in values if k not in spec], list(spec))
    return {key: check_value(f"{name}.{key}", value, spec_hint(spec[key]), raws.get(f"{name}.{key}")) for key, value in values.items()}


def leaves(prefix: str, values: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(leaves(path, value))
        else:
            out[path] = value
    return out
