"""What the trainers need to know of a dataset: whether it is indexable, and its length if it has one."""

from __future__ import annotations

from typing import Any, Optional


def is_map_dataset(dataset: Any) -> bool:
    """Indexable with a length (a ``datasets.Dataset``, a list), as opposed to an iterable one."""
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def dataset_length(dataset: Any) -> Optional[int]:
    """``len(dataset)``, or None for a dataset without one."""
    try:
        return len(dataset)
    except TypeError:
        return None
