"""Per-round reward distributions of the iterative trainers (``log_reward_distribution=True``).

For round N, ``reward_distributions/iteration_NNNN.json`` holds histograms (16 bins over the reward
range) of the raw rewards of the current policy ("target") and of the comparator, for every
candidate of the round ("candidate") and for the pairs the round trained on ("selected")::

    {"iteration": N, "reward_min": lo, "reward_max": hi, "num_bins": 16, "bin_edges": [17],
     "bin_centers": [16], "candidate": {"target": S, "comparator": S}, "selected": {...}}
    S = {"sample_count": n, "mean": m or null, "counts": [16], "raw_rewards": [...]}

Values outside the range are clipped into it; non-finite values are left out. The range is the task
reward's declared ``reward_range``; rounds scored by the learned reward model use the range of
their own scores. ``iteration_NNNN.png`` draws the same histograms (matplotlib), and with W&B the
four series are logged as ``wandb.Histogram``.
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

NUM_BINS = 16
SERIES = (("candidate", "target"), ("candidate", "comparator"), ("selected", "target"), ("selected", "comparator"))


def bin_edges(low: float, high: float, bins: int = NUM_BINS) -> List[float]:
    return torch.linspace(low, high, bins + 1, dtype=torch.float64).tolist()


def series(values: Sequence[float], low: float, high: float, bins: int = NUM_BINS) -> Dict[str, Any]:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    clipped = torch.tensor([min(max(v, low), high) for v in finite], dtype=torch.float64)
    counts = torch.histc(clipped, bins=bins, min=low, max=high).long().tolist() if finite else [0] * bins
    return {"sample_count": len(finite), "mean": sum(finite) / len(finite) if finite else None, "counts": counts, "raw_rewards": finite}


def data_range(values: Sequence[float]) -> Tuple[float, float]:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    return (low - 0.5, high + 0.5) if low == high else (low, high)


def distribution_record(iteration: int, values: Dict[Tuple[str, str], Sequence[float]], reward_range: Optional[Tuple[float, float]]) -> Dict[str, Any]:
    low, high = reward_range if reward_range is not None else data_range([v for vs in values.values() for v in vs])
    edges = bin_edges(low, high)
    record: Dict[str, Any] = {
        "iteration": iteration, "reward_min": low, "reward_max": high, "num_bins": NUM_BINS, "bin_edges": edges,
        "bin_centers": [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])],
    }
    for group, side in SERIES:
        record.setdefault(group, {})[side] = series(values.get((group, side), []), low, high)
    return record


def write_distribution_png(path: str, record: Dict[str, Any]) -> None:
    """Two panels (candidates, selected pairs), target and comparator histograms overlaid."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 3.2), dpi=100)
    width = (record["reward_max"] - record["reward_min"]) / NUM_BINS
    for panel, group in enumerate(("candidate", "selected")):
        axes = figure.add_subplot(1, 2, panel + 1)
        for side, color in (("target", "#e87030"), ("comparator", "#6e6e6e")):
            data = record[group][side]
            axes.bar(record["bin_centers"], data["counts"], width=width * 0.9, alpha=0.6, color=color,
                     label=f"{side} (n={data['sample_count']})")
        axes.set_title(f"round {record['iteration']}: {group} rewards")
        axes.set_xlabel("raw reward")
        axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    directory = os.path.dirname(path)
    handle, staging = tempfile.mkstemp(prefix=".tmp.", suffix=".png", dir=directory)
    os.close(handle)
    try:
        figure.savefig(staging, format="png")
        os.link(staging, path)  # never replaces an existing file
    finally:
        os.remove(staging)


def wandb_histograms(record: Dict[str, Any]) -> Dict[str, Any]:
    """``iter/reward_distribution/<side>`` and ``iter/selected_reward_distribution/<side>`` histograms."""
    import wandb

    out = {}
    for group, side in SERIES:
        key = "reward_distribution" if group == "candidate" else "selected_reward_distribution"
        counts = record[group][side]["counts"]
        out[f"iter/{key}/{side}"] = wandb.Histogram(np_histogram=(counts, record["bin_edges"]))
    return out


def distribution_means(record: Dict[str, Any]) -> Dict[str, float]:
    out = {}
    for group, side in SERIES:
        key = "reward_distribution" if group == "candidate" else "selected_reward_distribution"
        data = record[group][side]
        out[f"iter/{key}/{side}_sample_count"] = float(data["sample_count"])
        if data["mean"] is not None:
            out[f"iter/{key}/{side}_mean"] = float(data["mean"])
    return out
