"""Dataset rows as the rollout sees them: what a ``train_dataset`` may be, and how an error names a row.

- ``as_dataset``: a pandas DataFrame (what ``pd.read_csv`` / ``read_json`` give) becomes a
  ``datasets.Dataset`` with the same columns (its index dropped); a string (a dataset's name) or a
  single row is refused with the fix. Anything else indexable or iterable passes unchanged.
- ``labelled_rows``: inside the block, ``describe_row(item)`` names an item of the block by its
  index in its dataset (``train_dataset row 12``); an error raised by a formatter or a reward
  function on it then says which row it was. Outside, an item is named by its content.
"""

from __future__ import annotations

import contextlib
import contextvars
import traceback
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

_LABELS: "contextvars.ContextVar[Optional[Dict[int, str]]]" = contextvars.ContextVar("comlrl_row_labels", default=None)
PREVIEW_CHARS = 100


def as_dataset(dataset: Any, name: str) -> Any:
    """``dataset`` in a form the trainers index row by row (see the module docstring)."""
    if dataset is None:
        return None
    kind = type(dataset)
    if kind.__module__.startswith("pandas") and kind.__name__ == "DataFrame":
        from datasets import Dataset

        return Dataset.from_pandas(dataset, preserve_index=False)
    if isinstance(dataset, (str, bytes)):
        raise ValueError(
            f"{name} is the string {dataset!r}, not a dataset. Load it first, e.g. {name}=datasets.load_dataset({dataset!r}, "
            f"split='train'), or pass a datasets.Dataset, a pandas DataFrame or a list of row dicts."
        )
    if isinstance(dataset, Mapping):
        raise ValueError(
            f"{name} is a dict with keys {sorted(map(str, dataset))[:6]}, not a dataset of rows. For columns use "
            f"datasets.Dataset.from_dict({{'prompt': [...]}}); for a single row pass a list holding it."
        )
    return dataset


@contextlib.contextmanager
def labelled_rows(items: Sequence[Any], first: int, dataset: str = "train_dataset") -> Iterator[None]:
    """Name ``items[i]`` as ``<dataset> row <first + i>`` inside the block."""
    labels = dict(_LABELS.get() or {})
    labels.update({id(item): f"{dataset} row {first + offset}" for offset, item in enumerate(items)})
    token = _LABELS.set(labels)
    try:
        yield
    finally:
        _LABELS.reset(token)


def same_row(copy: Any, original: Any) -> Any:
    """Name ``copy`` (a later turn's edited copy of a row) as ``original`` is named; returns ``copy``."""
    labels = _LABELS.get()
    if labels is not None and id(original) in labels:
        labels[id(copy)] = labels[id(original)]
    return copy


def preview(item: Any) -> str:
    text = repr(dict(item) if isinstance(item, Mapping) else item)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."


def describe_row(item: Any) -> str:
    """``train_dataset row 12 ({'prompt': ...})`` inside ``labelled_rows``, else ``the row {'prompt': ...}``."""
    labels = _LABELS.get()
    label = labels.get(id(item)) if labels else None
    return f"{label} ({preview(item)})" if label else f"the row {preview(item)}"


def describe_rows(items: Optional[Sequence[Any]]) -> str:
    if not items:
        return "no row"
    if len(items) == 1:
        return describe_row(items[0])
    return f"{len(items)} rows, the first {describe_row(items[0])}"


def callable_name(func: Any) -> str:
    """``module.qualname`` of a function (a partial's function; an object's class)."""
    target = getattr(func, "func", func)  # functools.partial
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    module = getattr(target, "__module__", None)
    return f"{module}.{name}" if module and module not in ("builtins", "__main__") else name


def raised_at(error: BaseException) -> str:
    """`` (at file.py:12)``: where the innermost frame of ``error`` was, or "" without a traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f" (at {frame.filename}:{frame.lineno})"
