"""Which keyword arguments a model's ``forward`` accepts (``position_ids``, ``use_cache``, ...)."""

from __future__ import annotations

import functools
import inspect

import torch.nn as nn


@functools.lru_cache(maxsize=64)
def forward_parameters(module_type: type) -> frozenset:
    """Names of the parameters of ``module_type.forward`` (empty when it cannot be inspected)."""
    try:
        return frozenset(inspect.signature(module_type.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def model_forward_parameters(model: nn.Module) -> frozenset:
    """Names ``model``'s forward accepts; a view over a shared model answers for the model it runs."""
    source = getattr(model, "signature_source", None)
    return forward_parameters(type(source if isinstance(source, nn.Module) else model))
