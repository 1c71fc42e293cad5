"""Curves of a run's ``metrics.jsonl`` (one JSON object per logged row) in one PNG.

Rows carry ``env_step`` and metric keys: training rows ``turn_k/reward_mean`` and
``turn_k/expected_return``, evaluation rows ``eval/turn_k/...``, each epoch's last row the epoch
means ``epoch/turn_k/...`` and per-model rows ``agent_<i>/loss`` (``policy_loss``), ``entropy``,
``completion_length`` and ``critic.../value_loss``.

``build_figure`` draws, against ``env_step`` (integer ticks):

- the reward panel: per run and turn, the training series as faint raw points under a smoothed line
  (a debiased exponential moving average, TensorBoard's; from 10 points on, its weight growing to
  0.6 at 20 points, so short runs are not drawn lagging behind their points), the epoch means as diamonds (the values
  the progress bar and the demo print, placed at the last env_step of their epoch, where the mean is
  complete), evaluation series as dashed lines. Two series with the same points (single-turn
  ``reward_mean`` and ``expected_return``) are drawn once with both names in the label;
- one panel per per-model quantity that is present and tells something (loss, critic loss, entropy,
  completion length, ...), a line per agent or critic. A quantity that is constant over the run (the
  zero-signal fraction of a run where every group had signal) or meaningless for it (the agents'
  credit correlation in cross mode, where it is 0 by construction: ``run_config.json`` beside the
  log says the mode) gets no panel; a line under the figure names what was left out.

Ticks are few and compact (``1.2k``, ``3M``) so the small panels' labels never run together.

A file in which ``env_step`` goes back down holds several runs (appended by older versions, or
concatenated by hand): each run is drawn separately and labelled ``run 2``, ``run 3``, ...
Every line carries a ``gid`` (``raw:``, ``smooth:``, ``epoch:``, ``eval:``, ``agent:`` + key and run)
so tests and tools can read the figure back.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from comlrl.models.saving import make_temp_file

METRICS_FILE = "metrics.jsonl"
DEFAULT_PNG = "reward_curve.png"
CURVE_KEY = re.compile(r"^(eval/)?turn_(\d+)/(reward_mean|expected_return)$")
MODEL_PANELS = (  # (panel title, metric names); keys are "<agent_i|critic_i|critic>/<name>"
    ("loss", ("loss", "policy_loss")),
    ("critic loss", ("value_loss",)),
    ("entropy", ("entropy",)),
    ("completion length (tokens)", ("completion_length",)),
    # multi-agent learning diagnostics (MAGRPO): what explains a flat or a rising curve
    ("grad norm (before clipping)", ("grad_norm",)),
    ("mean |advantage|", ("advantage_abs_mean",)),
    ("zero-signal groups", ("frac_zero_signal_groups",)),
    ("agents' credit correlation", ("credit_correlation",)),
)
MODEL_KEY = re.compile(r"^(agent_\d+|critic_\d+|critic|agents)/(\w+)$")
CONSTANT_TOLERANCE = 1e-6  # a per-model series whose values differ by less (relative) is constant
SMOOTHING = 0.6  # weight of the past in the moving average (TensorBoard's default), reached at 20 points
MIN_SMOOTHED = 10  # fewer training points are drawn as they are: smoothing them would only lag
STYLES = {"reward_mean": "-", "expected_return": ":"}

Row = Mapping[str, Any]
Points = List[Tuple[int, float]]
Series = Dict[str, Points]


# ----------------------------------------------------------------------------- reading


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
    from comlrl.cli.jsonl import json_lines

    rows = []
    for number, row in json_lines(path, path):
        if not isinstance(row, dict) or not isinstance(row.get("env_step"), (int, float)):
            raise ValueError(f"{path}, line {number}: a metrics row must be a JSON object with a numeric 'env_step'.")
        rows.append(row)
    return rows


def run_config(metrics_path: str) -> Optional[Dict[str, Any]]:
    """The trainer config of the run whose log is ``metrics_path`` (``run_config.json`` beside it), if any."""
    path = os.path.join(os.path.dirname(os.path.abspath(metrics_path)), "run_config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle).get("config")
    except (OSError, ValueError, AttributeError):
        return None
    return config if isinstance(config, dict) else None


def split_runs(rows: Sequence[Row]) -> List[List[Row]]:
    """Consecutive rows of one run each: a row whose env_step is below the previous row's starts a new run."""
    runs: List[List[Row]] = []
    previous = None
    for row in rows:
        step = row["env_step"]
        if not runs or (previous is not None and step < previous):
            runs.append([])
        runs[-1].append(row)
        previous = step
    return runs


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def series_of(rows: Sequence[Row], pattern: "re.Pattern[str]") -> Series:
    """``{key: [(env_step, value), ...]}`` for the keys matching ``pattern``, in row order."""
    series: Series = {}
    for row in rows:
        for key, value in row.items():
            if pattern.match(key) and _number(value):
                series.setdefault(key, []).append((int(row["env_step"]), float(value)))
    return series


def curve_series(rows: Sequence[Row]) -> Series:
    """The reward/return series of all rows (every run together), in file order."""
    return series_of(rows, CURVE_KEY)


def epoch_markers(rows: Sequence[Row], key: str) -> Points:
    """``(x, epoch mean)`` of ``key`` (``turn_1/reward_mean``) for every epoch of one run; x is the epoch's
    last env_step (the row that carries its means), where the mean of the whole epoch is known."""
    return [(int(row["env_step"]), float(row[f"epoch/{key}"])) for row in rows if _number(row.get(f"epoch/{key}"))]


def smoothing_weight(count: int) -> float:
    """0 below ``MIN_SMOOTHED`` points, then rising to ``SMOOTHING`` at 20 points: ``min(0.6, 1 - 8/n)``."""
    return 0.0 if count < MIN_SMOOTHED else min(SMOOTHING, 1.0 - 8.0 / count)


def smooth(values: Sequence[float], weight: float = SMOOTHING) -> List[float]:
    """Debiased exponential moving average: ``m_t = w m_{t-1} + (1 - w) x_t``, reported as
    ``m_t / (1 - w^t)`` so the first values are not pulled towards 0."""
    out, mean = [], 0.0
    for t, value in enumerate(values, start=1):
        mean = weight * mean + (1.0 - weight) * value
        out.append(mean / (1.0 - weight**t))
    return out


def curve_groups(series: Series) -> List[Tuple[List[str], Points]]:
    """The reward/return series grouped so that identical ones are drawn once: ``[(keys, points)]``,
    ordered by turn, training before evaluation, reward before return."""
    groups: List[Tuple[List[str], Points]] = []
    for key in sorted(series, key=_series_order):
        for keys, points in groups:
            if points == series[key] and CURVE_KEY.match(keys[0]).group(1, 2) == CURVE_KEY.match(key).group(1, 2):
                keys.append(key)
                break
        else:
            groups.append(([key], series[key]))
    return groups


def _series_order(key: str) -> Tuple[int, int, int]:
    match = CURVE_KEY.match(key)
    return (int(match.group(2)), 1 if match.group(1) else 0, 1 if match.group(3) == "expected_return" else 0)


def group_label(keys: Sequence[str]) -> str:
    """``turn_1/reward_mean`` or ``turn_1/reward_mean = expected_return`` for identical series."""
    first = keys[0]
    rest = [key.rsplit("/", 1)[1] for key in keys[1:]]
    return " = ".join([first] + rest)


# ----------------------------------------------------------------------------- drawing


def model_panels(rows: Sequence[Row], config: Optional[Mapping[str, Any]] = None) -> Tuple[List[Tuple[str, Tuple[str, ...]]], List[str]]:
    """``(panels to draw, what was left out and why)``: a panel needs a series that is present, not
    constant over the run and meaningful for it (see the module docstring)."""
    panels, left_out = [], []
    for name, keys in MODEL_PANELS:
        series = _model_series(rows, keys)
        if not series:
            continue
        values = [value for points in series.values() for _, value in points]
        if "credit_correlation" in keys and (config or {}).get("joint_mode") == "cross":
            left_out.append(f"{name} (0 by construction in cross mode)")
        elif len(values) > 1 and max(values) - min(values) <= CONSTANT_TOLERANCE * max(1.0, abs(max(values))):
            left_out.append(f"{name} (= {_compact(values[0])} throughout)")
        else:
            panels.append((name, keys))
    return panels, left_out


def build_figure(rows: Sequence[Row], title: str, config: Optional[Mapping[str, Any]] = None):
    """The matplotlib ``Figure`` of ``rows`` (see the module docstring; ``config``: the run's trainer config,
    ``run_config.json``'s ``config``); no file is written."""
    from matplotlib.figure import Figure

    runs = split_runs(rows)
    panels, left_out = model_panels(rows, config)
    figure = Figure(figsize=(max(10.0, 2.6 * len(panels)), 4.8 + (3.0 if panels else 0.0)), dpi=110)
    grid = figure.add_gridspec(2 if panels else 1, max(len(panels), 1), height_ratios=[5, 3] if panels else None)
    reward = figure.add_subplot(grid[0, :])
    colours = _ColourCycle()
    for number, run in enumerate(runs, start=1):
        suffix = f" (run {number})" if len(runs) > 1 else ""
        _draw_rewards(reward, run, suffix, number, colours)
    _finish_axes(reward, "reward / return", title)
    for column, (name, keys) in enumerate(panels):
        axes = figure.add_subplot(grid[1, column])
        for number, run in enumerate(runs, start=1):
            suffix = f" (run {number})" if len(runs) > 1 else ""
            for key, points in sorted(_model_series(run, keys).items()):
                steps, values = zip(*points)
                axes.plot(steps, values, linewidth=1.2, marker="." if len(points) < 40 else None,
                          label=key.split("/")[0] + suffix, gid=f"agent:{key}:{number}")
        _finish_axes(axes, name, None, small=True)
    if left_out:
        figure.text(0.01, 0.005, "not drawn: " + "; ".join(left_out), fontsize="small", color="0.35", gid="left-out")
    figure.tight_layout(rect=(0, 0.03 if left_out else 0, 1, 1))
    return figure


def _model_series(rows: Sequence[Row], names: Sequence[str]) -> Series:
    series = series_of(rows, MODEL_KEY)
    return {key: points for key, points in series.items() if MODEL_KEY.match(key).group(2) in names}


class _ColourCycle:
    """One colour per (run, turn), from matplotlib's default cycle."""

    def __init__(self) -> None:
        self._given: Dict[Tuple[int, int], str] = {}

    def __call__(self, run: int, turn: int) -> str:
        if (run, turn) not in self._given:
            self._given[(run, turn)] = f"C{len(self._given) % 10}"
        return self._given[(run, turn)]


def _draw_rewards(axes: Any, run: Sequence[Row], suffix: str, number: int, colours: _ColourCycle) -> None:
    for keys, points in curve_groups(curve_series(run)):
        match = CURVE_KEY.match(keys[0])
        colour = colours(number, int(match.group(2)))
        steps, values = zip(*points)
        label = group_label(keys) + suffix
        gid = f"{'|'.join(keys)}:{number}"
        if match.group(1):  # evaluation: few points, drawn as they are
            axes.plot(steps, values, "--" if match.group(3) == "reward_mean" else "-.", color=colour, marker="s",
                      markersize=3, label=label, gid=f"eval:{gid}")
            continue
        style = STYLES[match.group(3)]
        weight = smoothing_weight(len(points))
        if weight > 0:
            axes.plot(steps, values, style, color=colour, alpha=0.3, linewidth=0.8, marker="o", markersize=2.5,
                      label=f"_raw {label}", gid=f"raw:{gid}")
            axes.plot(steps, smooth(values, weight), style, color=colour, linewidth=2.0, label=f"{label} (smoothed)",
                      gid=f"smooth:{gid}")
        else:
            axes.plot(steps, values, style, color=colour, marker="o", markersize=3, label=label, gid=f"raw:{gid}")
        markers = epoch_markers(run, keys[0])
        if markers:
            xs, ys = zip(*markers)
            axes.plot(xs, ys, linestyle="none", marker="D", markersize=6, color=colour, markeredgecolor="black",
                      label=f"{label} epoch mean", gid=f"epoch:{gid}")


def _compact(value: float) -> str:
    """``950``, ``1.2k``, ``12k``, ``3.4M``: a tick label that stays short."""
    magnitude = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:.3g}"


def _finish_axes(axes: Any, ylabel: str, title: Optional[str], small: bool = False) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(nbins=4 if small else 10, integer=True, min_n_ticks=2))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: _compact(value)))
    axes.set_xlabel("env_step" if small else "env_step (joint responses scored)")
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize="x-small" if small else "small")


# ----------------------------------------------------------------------------- the PNG


def free_png_name(path: str) -> str:
    """``path`` when it does not exist, else ``name-2.png``, ``name-3.png``, ... (the first free one)."""
    if not os.path.exists(path):
        return path
    stem, extension = os.path.splitext(path)
    number = 2
    while os.path.exists(f"{stem}-{number}{extension}"):
        number += 1
    return f"{stem}-{number}{extension}"


def plot_reward_curve(source: str, out: Optional[str] = None, *, title: Optional[str] = None, overwrite: bool = False) -> str:
    """Draw the curves of ``source`` (a run directory or a metrics JSONL) into a PNG; returns its path.

    Without ``out`` the PNG is ``reward_curve.png`` beside the metrics file; when that exists it is
    replaced with ``overwrite``, otherwise the plot goes to the first free ``reward_curve-N.png``. An
    ``out`` that exists is refused unless ``overwrite``.
    """
    path = resolve_metrics_path(source)
    image_format = output_format(out) if out is not None else "png"
    if out is None:
        default = os.path.join(os.path.dirname(os.path.abspath(path)), DEFAULT_PNG)
        out = default if overwrite else free_png_name(default)
    elif os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out} already exists; refusing to overwrite it. Choose another --out, or pass --overwrite.")
    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path} is empty: the run logged no rows yet, so there is nothing to plot.")
    if not curve_series(rows):
        raise ValueError(
            f"{path} has {len(rows)} rows but none with a reward or return (keys like 'turn_1/reward_mean' or "
            f"'eval/turn_1/reward_mean'); nothing to plot."
        )
    figure = build_figure(rows, title or os.path.basename(os.path.dirname(os.path.abspath(path))), run_config(path))
    _save(figure, out, image_format)
    return out


def output_format(out: str) -> str:
    """The image format of ``out`` from its extension (``.png``, ``.pdf``, ``.svg``, ...); an extension
    matplotlib does not write, or none, is refused with the ones it does."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    extension = os.path.splitext(out)[1].lstrip(".").lower()
    if extension not in formats:
        shown = "no extension" if not extension else f"the extension .{extension}"
        raise ValueError(f"--out {out!r} has {shown}, which is not an image format; end it with one of "
                         f"{', '.join('.' + name for name in sorted(formats))} (e.g. reward_curve.png).")
    return extension


def _save(figure: Any, out: str, image_format: str = "png") -> None:
    # A bare Figure renders through Agg (or the format's own backend) without pyplot, so the caller's
    # backend is left alone.
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    staging = make_temp_file(directory, ".reward_curve.", "." + image_format)
    try:
        figure.savefig(staging, format=image_format)
        os.replace(staging, out)
    except BaseException:
        if os.path.exists(staging):
            os.remove(staging)
        raise
