"""Loading an environment's rows: the bundled sample, or the real dataset with the original slices.

Sources, in the order ``offline=None`` tries them:

1. the real dataset: ``datasets.load_dataset(name, split=slice)`` where ``name`` is the Hugging Face
   id of the task (``trl-lib/tldr``, ...) or, when ``$COMLRL_DATASETS_DIR/<id>`` exists, that local
   folder (any layout ``datasets`` reads: ``train.jsonl``, ``test.jsonl``, parquet, ...), and
   ``slice`` the split expression of the original configs (``train[:1100]``, ``test[33:163]``, ...);
2. the sample bundled in ``comlrl/envs/data/<file>.json`` (``{"train": [...], "eval": [...]}``,
   rows in the real schema), with a one-line notice saying why.

``offline=True`` goes straight to 2, ``offline=False`` only tries 1.
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


def load_rows(
    source: DatasetSource,
    *,
    env: str,
    split: str,
    offline: Optional[bool],
    hf_split: Optional[str] = None,
    name: Optional[str] = None,
    prepare: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
    notice: Callable[[str], None] = lambda message: print(message, file=sys.stderr),
):
    """A ``datasets.Dataset`` of the environment's ``split`` rows (see the module docstring)."""
    from datasets import Dataset

    expression = hf_split or (source.train_split if split == "train" else source.eval_split)
    real_name = name or source.hf_name
    if offline is not True:
        try:
            rows = load_real(real_name, expression)
        except Exception as error:  # the hub is unreachable, the id is unknown, the split is absent ...
            if offline is False:
                raise ValueError(
                    f"Could not load the {env} dataset {real_name!r} split {expression!r}: {type(error).__name__}: "
                    f"{error}. Use offline=True (dataset.offline=true) for the bundled sample, or point "
                    f"${DATASETS_DIR_ENV} at a local copy."
                ) from error
            notice(
                f"comlrl: {env}: using the bundled {split} sample ({real_name} {expression} not loadable: "
                f"{type(error).__name__})."
            )
        else:
            check_fields(rows, source.fields, f"The {env} dataset {real_name!r}")
            return rows.map(prepare) if prepare is not None else rows
    rows = sample_rows(source.sample, split)
    if prepare is not None:
        rows = [prepare(row) for row in rows]
    check_fields(rows, source.fields, f"The bundled {env} sample")
    return Dataset.from_list(rows)


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
