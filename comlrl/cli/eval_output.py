"""What ``comlrl eval`` writes into its output directory, never over an earlier evaluation unless
``--overwrite``:

- ``eval.json``: every metric, the settings, the data and the models (sources, file sizes and
  SHA-256), library versions and timing;
- ``eval.md``: the settings and one markdown table per metric (a row per turn and, for what is
  measured over whole episodes, an ``episode`` row; a column per agent where the metric is per agent);
- ``eval_rows.jsonl``: one row per item, episode and turn with every agent's completion and the
  environment's breakdown, as training's ``eval_rows.jsonl`` (plus ``sample`` when sampled).

Each file is written beside its target and renamed into place once the evaluation has finished, so
an evaluation that fails leaves the earlier files as they were.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from comlrl.telemetry.eval_rows import ROWS_FILE, append_rows, eval_row

JSON_FILE = "eval.json"
MARKDOWN_FILE = "eval.md"
OUTPUT_FILES = (JSON_FILE, MARKDOWN_FILE, ROWS_FILE)
_TURN_KEY = re.compile(r"^turn_(\d+)/(?:agent_(\d+)/)?(.+)$")


def check_output_dir(path: str, overwrite: bool) -> None:
    """Refuse a file in the way, or an earlier evaluation's files without ``overwrite``."""
    from comlrl.models.saving import check_folder_path

    check_folder_path(path, "--output-dir")
    found = [name for name in OUTPUT_FILES if os.path.exists(os.path.join(path, name))]
    if found and not overwrite:
        raise FileExistsError(f"--output-dir {path!r} already holds an evaluation ({', '.join(found)}); refusing to overwrite it. "
                              f"Choose another --output-dir, or pass --overwrite to replace those files.")


def write_outputs(path: str, record: Mapping[str, Any], episodes: Sequence[Any], sampled: bool) -> List[str]:
    """Write the three files (see the module docstring); return their paths."""
    from comlrl.telemetry.run_record import write_json_atomically

    os.makedirs(path, exist_ok=True)
    rows = [eval_row(0, e.index, e.item, turn.turn, turn.completions, turn.details if turn.details is not None else {},
                     sample=e.sample if sampled else None) for e in episodes for turn in e.turns]
    _publish(os.path.join(path, ROWS_FILE), lambda staging: append_rows(staging, rows))
    text = markdown_report(record)
    _publish(os.path.join(path, MARKDOWN_FILE), lambda staging: _write_text(staging, text))
    write_json_atomically(os.path.join(path, JSON_FILE), record)
    return [os.path.join(path, name) for name in OUTPUT_FILES]


def _publish(target: str, write: Callable[[str], None]) -> None:
    """``write(staging)`` into a new file beside ``target``, then renamed over it."""
    from comlrl.models.saving import make_temp_file

    staging = make_temp_file(os.path.dirname(os.path.abspath(target)), f".{os.path.basename(target)}.", ".tmp")
    try:
        write(staging)
        os.replace(staging, target)
    except BaseException:
        if os.path.exists(staging):
            os.remove(staging)
        raise


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


# ----------------------------------------------------------------------------- markdown


def metric_tables(metrics: Mapping[str, float]) -> Dict[str, Dict[Tuple[str, str], float]]:
    """``{metric: {(row, column): value}}``: rows are turns (``k``) or ``episode``, columns ``value`` or
    ``agent_i``, from ``eval/turn_k/[agent_i/]<metric>`` and ``eval/<metric>`` keys."""
    tables: Dict[str, Dict[Tuple[str, str], float]] = {}
    for key, value in metrics.items():
        name = key[len("eval/"):] if key.startswith("eval/") else key
        match = _TURN_KEY.match(name)
        if match:
            row, column, name = match.group(1), f"agent_{match.group(2)}" if match.group(2) else "value", match.group(3)
        else:
            row, column = "episode", "value"
        tables.setdefault(name, {})[(row, column)] = value
    return tables


def markdown_table(cells: Mapping[Tuple[str, str], float]) -> str:
    rows = sorted({row for row, _ in cells}, key=lambda r: (r == "episode", int(r) if r != "episode" else 0))
    columns = sorted({column for _, column in cells}, key=lambda c: (c != "value", int(c.split("_")[1]) if c != "value" else 0))
    lines = ["| turn | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in rows:
        values = [_number(cells.get((row, column))) for column in columns]
        lines.append(f"| {row} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def _number(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.4f}"


def markdown_report(record: Mapping[str, Any]) -> str:
    settings = record["settings"]
    lines = [f"# comlrl eval: {settings['environment']} ({settings['data']})", ""]
    for key in ("algorithm", "evaluation", "items", "decoding", "samples_per_item", "num_turns", "max_new_tokens", "temperature",
                "top_p", "top_k", "seed"):
        if settings.get(key) is not None:
            lines.append(f"- {key}: {settings[key]}")
    for model in record["models"]:
        lines.append(f"- agent {model['agent']}: {model['source']}" + (f" (checkpoint {model['checkpoint']})" if model.get("checkpoint") else ""))
    lines.append("")
    for name, cells in metric_tables(record["metrics"]).items():
        lines += [f"## {name}", "", markdown_table(cells), ""]
    return "\n".join(lines)
