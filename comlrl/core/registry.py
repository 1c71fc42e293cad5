"""Registries of advantage estimators and policy losses, by name.

A config names its estimator (``advantage_mode``) and its loss (``loss_type``); the trainer looks the
function up here. A user's own function joins the same tables:

    from comlrl.core import register_advantage

    @register_advantage("median")
    def median_baseline(returns):            # [G, K] -> [G, K]
        return returns - returns.median(dim=-1, keepdim=True).values

    MAGRPOConfig(advantage_mode="median")    # accepted: configs validate against the registry

The contracts (shapes, arguments) are in ``comlrl.core.advantages`` and ``comlrl.core.policy_losses``.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple, TypeVar

F = TypeVar("F", bound=Callable)


class Registry:
    """One name -> function table; a name is registered once (``replace=True`` overrides)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._table: Dict[str, Callable] = {}

    def register(self, name: str, *, replace: bool = False) -> Callable[[F], F]:
        if not isinstance(name, str) or not name.strip() or name != name.strip().lower():
            raise ValueError(f"a {self.kind} name must be a non-empty lower-case string without surrounding spaces, got {name!r}.")

        def decorate(fn: F) -> F:
            if not callable(fn):
                raise TypeError(f"only a callable can be registered as {self.kind} {name!r}, got {type(fn).__name__}.")
            if name in self._table and not replace and self._table[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered; pass replace=True to override it.")
            self._table[name] = fn
            return fn

        return decorate

    def get(self, name: str) -> Callable:
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


def register_policy_loss(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator: register ``fn(inputs: PolicyLossInputs) -> PolicyLossOutput`` as policy loss ``name``."""
    return POLICY_LOSSES.register(name, replace=replace)


def get_advantage(name: str) -> Callable:
    """The estimator registered as ``name`` (ValueError listing the registered names otherwise)."""
    return ADVANTAGES.get(name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as ``name`` (ValueError listing the registered names otherwise)."""
    return POLICY_LOSSES.get(name)


def advantage_names() -> Tuple[str, ...]:
    """Registered advantage estimators, in registration order."""
    return ADVANTAGES.names()


def policy_loss_names() -> Tuple[str, ...]:
    """Registered policy losses, in registration order."""
    return POLICY_LOSSES.names()
