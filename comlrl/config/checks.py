"""Field checks shared by the configs: each raises ``ValueError`` naming the field, the value and
what is allowed."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Optional

from comlrl.parallel.devices import normalize_parallel_training as parallel_mode

REFERENCE_KL_MODES = ("loss", "reward")


def _not_a_number(name: str, value: Any, kind: str = "a number") -> Optional[str]:
    """The message for a value of the wrong type (a string, a bool, None, a list), or None when it is a
    real number: a numeric field given text is blamed for its type, never for its sign or range."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    message = f"{name} must be {kind}. Got the {type(value).__name__} {value!r}."
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return message
        shown = int(number) if kind.startswith("an integer") and number.is_integer() else number
        return f"{message[:-1]}, which is text: write the number without quotes ({name}={shown!r})."
    if isinstance(value, bool):
        return f"{name} must be {kind}. Got {value!r}, a bool."
    return message


def require_at_least(config: Any, name: str, minimum: float) -> None:
    value = getattr(config, name)
    problem = _not_a_number(name, value)
    if problem:
        raise ValueError(problem)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}. Got {value!r}.")


def require_int_at_least(config: Any, name: str, minimum: int, why: str = "") -> None:
    """``name`` must be an int (not a bool, not a float such as 4.0) of at least ``minimum``."""
    value = getattr(config, name)
    reason = f" ({why})" if why else ""
    problem = _not_a_number(name, value, f"an integer >= {minimum}{reason}")
    if problem:
        raise ValueError(problem)
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{reason}. Got {value!r}.")


def require_in_range(config: Any, name: str, low: float, high: float, *, low_open: bool = False) -> None:
    value = getattr(config, name)
    bracket = "(" if low_open else "["
    problem = _not_a_number(name, value, f"a number in {bracket}{low}, {high}]")
    if problem:
        raise ValueError(problem)
    if not ((value > low if low_open else value >= low) and value <= high):
        raise ValueError(f"{name} must be in {bracket}{low}, {high}]. Got {value!r}.")


def require_optional_positive(config: Any, name: str) -> None:
    value = getattr(config, name)
    if value is None:
        return
    problem = _not_a_number(name, value, "a positive number or None")
    if problem:
        raise ValueError(problem)
    if value <= 0:
        raise ValueError(f"{name} must be a positive number or None. Got {value!r}.")


FALSE_WORDS = ("no", "false", "off", "0", "n", "f", "")


def require_bool_fields(config: Any) -> None:
    """Every field annotated ``bool`` (or ``Optional[bool]``) holds a real bool (or None): ``"no"``,
    ``"false"`` or ``0`` would be read as a truth value (a non-empty string is true), so they are refused
    with the value to write instead."""
    for field in dataclasses.fields(config):
        annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
        if annotation == "Optional[bool]" or field.type is Optional[bool]:
            optional = True
        elif annotation == "bool" or field.type is bool:
            optional = False
        else:
            continue
        value = getattr(config, field.name)
        if isinstance(value, bool) or (optional and value is None):
            continue
        choices = "True, False or None" if optional else "True or False"
        hint = ""
        if isinstance(value, str):
            meant = value.strip().lower() not in FALSE_WORDS
            hint = f" (a non-empty string counts as true in Python); write {field.name}={meant}"
        raise ValueError(f"{field.name} must be {choices}. Got the {type(value).__name__} {value!r}{hint}.")


def require_choice(config: Any, name: str, choices: Iterable[str], aliases: Optional[Mapping[str, str]] = None) -> str:
    """Normalise a string option (case and surrounding spaces ignored) and store the canonical value."""
    value = getattr(config, name)
    canonical = value.strip().lower() if isinstance(value, str) else value
    if aliases and canonical in aliases:
        canonical = aliases[canonical]
    choices = tuple(choices)
    if canonical not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}. Got {value!r}.")
    setattr(config, name, canonical)
    return canonical


def normalize_parallel_training(config: Any, device_fields: Iterable[str]) -> None:
    """Normalise ``config.parallel_training``; "mp" needs explicit devices in ``device_fields``."""
    config.parallel_training = parallel_mode(config.parallel_training)
    if config.parallel_training == "mp":
        for field in device_fields:
            if getattr(config, field) is None:
                raise ValueError(
                    f"parallel_training='mp' needs {field}: give one device per model, "
                    f"e.g. {field}=['cuda:0', 'cuda:1']."
                )


def validate_reference_kl(config: Any) -> None:
    coef = config.reference_kl_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
        raise ValueError(f"reference_kl_coef must be >= 0. Got {coef!r}.")
    if not isinstance(config.reference_kl_enabled, bool):
        raise ValueError(f"reference_kl_enabled must be True or False. Got {config.reference_kl_enabled!r}.")
    require_choice(config, "reference_kl_mode", REFERENCE_KL_MODES)
