"""Field checks shared by the configs: each raises ``ValueError`` naming the field, the value and
what is allowed."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from comlrl.parallel.devices import normalize_parallel_training as parallel_mode

REFERENCE_KL_MODES = ("loss", "reward")


def require_at_least(config: Any, name: str, minimum: float) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum}. Got {value!r}.")


def require_int_at_least(config: Any, name: str, minimum: int, why: str = "") -> None:
    """``name`` must be an int (not a bool, not a float such as 4.0) of at least ``minimum``."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be an integer >= {minimum}{reason}. Got {value!r}.")


def require_in_range(config: Any, name: str, low: float, high: float, *, low_open: bool = False) -> None:
    value = getattr(config, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be in {bracket}{low}, {high}]. Got {value!r}.")


def require_optional_positive(config: Any, name: str) -> None:
    value = getattr(config, name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number or None. Got {value!r}.")


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


def require_bool(config: Any, name: str) -> None:
    """``name`` must be True or False (not a string such as "no", not 0 or 1)."""
    value = getattr(config, name)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False. Got {value!r}.")


def require_optional_bool(config: Any, name: str) -> None:
    """``name`` must be True, False or None."""
    value = getattr(config, name)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None. Got {value!r}.")
