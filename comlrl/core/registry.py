"""Registries of advantage estimators and policy losses, by name.

A config names its estimator (``advantage_mode``) and its loss (``loss_type``); the trainer looks the
entry up here. A user's own joins the same tables:

    from comlrl.core import register_advantage

    @register_advantage("median")
    def median_baseline(returns):            # [G, K] -> [G, K]
        return returns - returns.median(dim=-1, keepdim=True).values

    MAGRPOConfig(advantage_mode="median")    # accepted: configs validate against the registry

An estimator is a function; a policy loss is a ``PolicyLoss`` record (a surrogate and a normaliser,
registered with ``comlrl.core.policy_loss.register_policy_loss``). The contracts (shapes, arguments)
are in ``comlrl.core.advantages`` and ``comlrl.core.policy_loss``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

F = TypeVar("F")


class Registry:
    """One name -> entry table; a name is registered once (``replace=True`` overrides)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._table: Dict[str, Any] = {}

    def register(self, name: str, *, replace: bool = False) -> Callable[[F], F]:
        if not isinstance(name, str) or not name.strip() or name != name.strip().lower():
            raise ValueError(f"a {self.kind} name must be a non-empty lower-case string without surrounding spaces, got {name!r}.")

        def decorate(entry: F) -> F:
            if not callable(entry) and not hasattr(entry, "surrogate"):
                raise TypeError(f"only a callable can be registered as {self.kind} {name!r}, got {type(entry).__name__}.")
            if name in self._table and not replace and self._table[name] is not entry:
                raise ValueError(f"{self.kind} {name!r} is already registered; pass replace=True to override it.")
            self._table[name] = entry
            return entry

        return decorate

    def find(self, name: str) -> Optional[Any]:
        return self._table.get(name)

    def get(self, name: str) -> Any:
        try:
            return self._table[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}.") from None

    def names(self) -> Tuple[str, ...]:
        return tuple(self._table)


ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")


def register_advantage(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator: register ``fn(returns: [G, K]) -> [G, K]`` as advantage estimator ``name``."""
    return ADVANTAGES.register(name, replace=replace)


def get_advantage(name: str) -> Callable:
    """The estimator registered as ``name`` (ValueError listing the registered names otherwise)."""
    return ADVANTAGES.get(name)


def get_policy_loss(name: str) -> Any:
    """The ``PolicyLoss`` registered as ``name`` (ValueError listing the registered names otherwise)."""
    return POLICY_LOSSES.get(name)


def advantage_names() -> Tuple[str, ...]:
    """Registered advantage estimators, in registration order."""
    return ADVANTAGES.names()


def policy_loss_names() -> Tuple[str, ...]:
    """Registered policy losses, in registration order."""
    return POLICY_LOSSES.names()
