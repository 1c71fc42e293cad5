"""Reward / return curves from a run's ``metrics.jsonl`` (one JSON object per logged row).

Rows carry ``env_step`` and metric keys; training rows hold ``turn_k/reward_mean`` and
``turn_k/expected_return``, evaluation rows ``eval/turn_k/reward_mean`` and
``eval/turn_k/expected_return``. ``plot_reward_curve`` draws every such series against ``env_step``
(training solid, evaluation dashed, returns dotted) into one PNG with matplotlib's Agg backend.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Dict, List, Mapping, Optional, Tuple

from comlrl.models.saving import make_temp_file

METRICS_FILE = "metrics.jsonl"
DEFAULT_PNG = "reward_curve.png"
CURVE_KEY = re.compile(r"^(eval/)?turn_(\d+)/(reward_mean|expected_return)$")

# (evaluation row?, return rather than reward?) -> line style; returns stay visible on top of
# equal single-turn rewards.
LINE_STYLES = {(False, False): "-", (False, True): ":", (True, False): "--", (True, True): "-."}

Series = Dict[str, List[Tuple[int, float]]]


def resolve_metrics_path(source: str) -> str:
    """``source`` itself when it is a file, ``source/metrics.jsonl`` when it is a run directory."""
    path = os.path.join(source, METRICS_FILE) if os.path.isdir(source) else source
    if not os.path.isfile(path):
        where = f"run directory {source!r} has no {METRICS_FILE}" if os.path.isdir(source) else f"{source!r} does not exist"
        raise FileNotFoundError(
            f"No metrics to plot: {where}. Give a run's output directory (a trainer run with "
            f"output_dir=... writes {METRICS_FILE} there) or the path of a metrics JSONL file."
        )
    return path


def read_metrics(path: str) -> List[Dict[str, object]]:
    """Every row of a metrics JSONL file; a malformed line raises a ValueError naming it."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}).") from None
            if not isinstance(row, dict) or not isinstance(row.get("env_step"), (int, float)):
                raise ValueError(f"{path}, line {number}: a metrics row must be a JSON object with a numeric 'env_step'.")
            rows.append(row)
    return rows


def curve_series(rows: List[Mapping[str, object]]) -> Series:
    """``{metric key: [(env_step, value), ...]}`` for the reward/return keys, in file order."""
    series: Series = {}
    for row in rows:
        for key, value in row.items():
            if not CURVE_KEY.match(key) or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                series.setdefault(key, []).append((int(row["env_step"]), float(value)))
    return series


def plot_reward_curve(source: str, out: Optional[str] = None, *, title: Optional[str] = None, overwrite: bool = False) -> str:
    """Draw the reward/return curves of ``source`` (a run directory or a metrics JSONL) into a PNG.

    ``out`` defaults to ``reward_curve.png`` beside the metrics file. An existing ``out`` is refused
    unless ``overwrite``. Returns the PNG path.
    """
    path = resolve_metrics_path(source)
    out = out or os.path.join(os.path.dirname(os.path.abspath(path)), DEFAULT_PNG)
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out} already exists; refusing to overwrite it. Choose another --out, or pass --overwrite.")
    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path} is empty: the run logged no rows yet, so there is nothing to plot.")
    series = curve_series(rows)
    if not series:
        raise ValueError(
            f"{path} has {len(rows)} rows but none with a reward or return (keys like 'turn_1/reward_mean' or "
            f"'eval/turn_1/reward_mean'); nothing to plot."
        )
    _draw(series, out, title or os.path.basename(os.path.dirname(os.path.abspath(path))))
    return out


def _draw(series: Series, out: str, title: str) -> None:
    # A bare Figure renders PNG through Agg without pyplot, so the caller's backend is left alone.
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 4.5), dpi=110)
    axes = figure.add_subplot(1, 1, 1)
    for key in sorted(series, key=_series_order):
        steps, values = zip(*series[key])
        style = LINE_STYLES[(key.startswith("eval/"), key.endswith("expected_return"))]
        axes.plot(steps, values, style, marker="o" if len(steps) < 40 else None, markersize=3, label=key)
    axes.set_xlabel("env_step (joint responses scored)")
    axes.set_ylabel("reward / return")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    staging = make_temp_file(directory, ".reward_curve.", ".png")
    try:
        figure.savefig(staging, format="png")
        os.replace(staging, out)
    except BaseException:
        if os.path.exists(staging):
            os.remove(staging)
        raise


def _series_order(key: str) -> Tuple[int, int, int]:
    """Turn, then training before evaluation, then reward before return (drawn on top)."""
    match = CURVE_KEY.match(key)
    return (int(match.group(2)), 1 if match.group(1) else 0, 1 if match.group(3) == "expected_return" else 0)
