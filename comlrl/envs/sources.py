"""Loading an environment's rows: the bundled sample, or the real dataset with the original slices.

Sources, in the order ``offline=None`` tries them (``Environment.load_dataset`` passes ``None`` only
when the caller allowed the fallback, ``allow_sample_fallback=True``; otherwise it asks for the real
rows only, so that a run never trains on other rows than it asked for):

1. the real dataset: ``datasets.load_dataset(name, split=slice)`` where ``name`` is the Hugging Face
   id of the task (``trl-lib/tldr``, ...) or, when ``$COMLRL_DATASETS_DIR/<id>`` exists, that local
   folder (any layout ``datasets`` reads: ``train.jsonl``, ``test.jsonl``, parquet, ...), and
   ``slice`` the split expression of the original configs (``train[:1100]``, ``test[33:163]``, ...);
2. the sample bundled in ``comlrl/envs/data/<file>.json`` (``{"train": [...], "eval": [...]}``,
   rows in the real schema), with a one-line notice saying why.

``offline=True`` goes straight to 2, ``offline=False`` only tries 1. A split expression given for
the sample (``hf_split``) other than the original configs' own is applied to the sample's rows
(``train[:2]`` or ``[:2]`` keeps its first two), or refused when it is not a ``[start:stop]`` slice.
Every returned dataset carries ``comlrl_source`` (where its rows came from, which split, how many).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

DATASETS_DIR_ENV = "COMLRL_DATASETS_DIR"


@dataclass(frozen=True)
class DatasetSource:
    """Where an environment's rows come from."""

    hf_name: str
    """Hugging Face dataset id of the real data."""
    train_split: str
    """Split expression of the original configs for training rows."""
    eval_split: str
    """Split expression of the original configs for evaluation rows."""
    sample: str
    """File name of the bundled sample under ``comlrl/envs/data/``."""
    fields: Sequence[str]
    """Fields every row must have (the real dataset's names)."""


def sample_rows(filename: str, split: str) -> List[Dict[str, Any]]:
    """The bundled sample's ``split`` ("train" or "eval") rows."""
    text = resources.files("comlrl.envs").joinpath("data", filename).read_text(encoding="utf-8")
    data = json.loads(text)
    return [dict(row) for row in data[split]]


def local_dataset_dir(hf_name: str) -> Optional[str]:
    """``$COMLRL_DATASETS_DIR/<hf_name>`` when that folder exists."""
    root = os.environ.get(DATASETS_DIR_ENV)
    if not root:
        return None
    path = os.path.join(os.path.expanduser(root), *hf_name.split("/"))
    return path if os.path.isdir(path) else None


def load_real(name: str, split_expression: str):
    """``datasets.load_dataset`` of ``name`` (a hub id, a local folder, or an id found under
    ``$COMLRL_DATASETS_DIR``) and one split expression."""
    import datasets

    path = local_dataset_dir(name) or name
    return datasets.load_dataset(path, split=split_expression)


def check_fields(rows: Any, fields: Sequence[str], where: str) -> None:
    columns = set(getattr(rows, "column_names", None) or (rows[0].keys() if len(rows) else fields))
    missing = [f for f in fields if f not in columns]
    if missing:
        raise ValueError(f"{where} has no field(s) {missing}; the environment needs {list(fields)}.")


SOURCE_ATTRIBUTE = "comlrl_source"
_NOTICES: set = set()


def notice_once(message: str) -> None:
    """Print ``message`` to stderr the first time this process sees it (train and eval fall back together)."""
    if message not in _NOTICES:
        _NOTICES.add(message)
        print(message, file=sys.stderr)


def with_source(dataset: Any, source: Dict[str, Any]) -> Any:
    """``dataset`` with ``comlrl_source`` set (``source`` plus the row count)."""
    setattr(dataset, SOURCE_ATTRIBUTE, {**source, "rows": len(dataset)})
    return dataset


def load_rows(
    source: DatasetSource,
    *,
    env: str,
    split: str,
    offline: Optional[bool],
    hf_split: Optional[str] = None,
    name: Optional[str] = None,
    prepare: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
    notice: Optional[Callable[[str], None]] = None,
):
    """A ``datasets.Dataset`` of the environment's ``split`` rows (see the module docstring)."""
    from datasets import Dataset

    default = source.train_split if split == "train" else source.eval_split
    expression = hf_split or default
    real_name = name or source.hf_name
    reason = None
    if offline is not True:
        try:
            rows = load_real(real_name, expression)
        except Exception as error:  # the hub is unreachable, the id is unknown, the split is absent ...
            if offline is False:
                raise ValueError(
                    f"Could not load the {env} dataset {real_name!r} split {expression!r}: {type(error).__name__}: "
                    f"{error}. Use offline=True (dataset.offline=true, `comlrl train --offline`) for the bundled "
                    f"sample, allow_sample_fallback=True (dataset.allow_sample_fallback=true) to fall back to it "
                    f"when the real data cannot be loaded, or point ${DATASETS_DIR_ENV} at a local copy."
                ) from error
            reason = f"{real_name} {expression} not loadable: {type(error).__name__}"
            (notice or notice_once)(f"comlrl: {env}: using the bundled sample instead of {real_name} (allow_sample_fallback; "
                                    f"{type(error).__name__}: the real data could not be loaded).")
        else:
            check_fields(rows, source.fields, f"The {env} dataset {real_name!r}")
            rows = rows.map(prepare) if prepare is not None else rows
            where = local_dataset_dir(real_name) or real_name
            return with_source(rows, {"source": where, "split": expression, "sample_fallback": False})
    rows = sample_rows(source.sample, split)
    sample_split = None
    if hf_split is not None and hf_split != default:
        sample_split = sample_slice(hf_split, env=env, split=split, count=len(rows))
        rows = slice_rows(rows, sample_split)
    if prepare is not None:
        rows = [prepare(row) for row in rows]
    check_fields(rows, source.fields, f"The bundled {env} sample")
    record = {"source": f"bundled sample ({source.sample})", "split": sample_split, "sample_fallback": reason is not None}
    if reason is not None:
        record["fallback_reason"] = reason
    return with_source(Dataset.from_list(rows), record)


def sample_slice(expression: str, *, env: str, split: str, count: int) -> str:
    """The ``[start:stop]`` part of a split expression (``train[:2]`` -> ``[:2]``), applied to the
    bundled sample of ``count`` rows; anything else is refused."""
    text = str(expression).strip()
    key = f"dataset.{split}_split"
    bracket = text[text.find("["):] if "[" in text else ""
    if not bracket:
        return ""  # a whole split ("train"): every row of the sample
    if "%" in bracket or bracket.count(":") != 1 or not bracket.endswith("]"):
        raise ValueError(
            f"{key}={expression!r} cannot be applied to the bundled {env} sample ({count} rows): offline, a split must "
            f"be a '[start:stop]' row slice such as '[:2]' (or 'train[:2]'); percentages and several slices are not "
            f"supported there."
        )
    return bracket


def slice_rows(rows: Sequence[Mapping[str, Any]], expression: Optional[str]) -> List[Mapping[str, Any]]:
    """``rows[start:stop]`` for an expression ``"[start:stop]"`` (the Minecraft configs' split
    syntax; either bound may be empty, ``None`` or ``""`` keeps every row)."""
    if expression is None or not str(expression).strip():
        return list(rows)
    text = str(expression).strip()
    if not (text.startswith("[") and text.endswith("]") and text.count(":") == 1):
        raise ValueError(f"Split {expression!r} must look like '[start:stop]' (e.g. '[:8]' or '[8:]').")
    start_text, stop_text = (part.strip() for part in text[1:-1].split(":"))
    try:
        start = int(start_text) if start_text else None
        stop = int(stop_text) if stop_text else None
    except ValueError:
        raise ValueError(f"Split {expression!r} must have integer bounds, e.g. '[:8]'.") from None
    return list(rows)[start:stop]
