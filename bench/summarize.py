#!/usr/bin/env python
"""Markdown tables from the JSON lines of run_compare.sh (or of any --json-out file).

  python bench/summarize.py RESULTS.jsonl [MORE.jsonl ...]

Table 1: one row per label (min / median train time, median throughput, max peak RSS, median
first/last-quarter reward). Table 2: per workload whose labels end in ``:baseline``, ``:ours`` and
``:floor``, the ratios that matter: speed-up over the baseline, time over the floor, and peak RSS
over the baseline and over the floor (medians of time, maxima of RSS). Standard library only.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

ROLES = ("baseline", "ours", "floor")


def load(paths: Sequence[str]) -> "OrderedDict[str, List[dict]]":
    groups: "OrderedDict[str, List[dict]]" = OrderedDict()
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise SystemExit(f"{path}, line {number}: not JSON ({error.msg})")
                groups.setdefault(row.get("label") or row["bench"], []).append(row)
    return groups


def median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(top, bottom) -> Optional[float]:
    return top / bottom if top is not None and bottom else None


def runs_table(groups) -> str:
    lines = ["| label | implementation | n | train s (min / median) | joint samples/s (median) | gen tokens/s (median) "
             "| peak RSS MiB (max) | reward first¼ → last¼ (median) |", "|---|---|---|---|---|---|---|---|"]
    for label, runs in groups.items():
        times = [r["train_wall_s"] for r in runs]
        impl = runs[0].get("implementation") or {}
        lines.append("| {} | {} {} | {} | {} / {} | {} | {} | {} | {} → {} |".format(
            label, impl.get("name", "?"), impl.get("version", ""), len(runs), fmt(min(times)), fmt(median(times)),
            fmt(median(r.get("joint_samples_per_s") for r in runs), 3),
            fmt(median(r.get("generated_tokens_per_s") for r in runs), 1),
            fmt(max(r["peak_rss_mib"] for r in runs), 0),
            fmt(median(r.get("reward_mean_first_quarter") for r in runs), 3),
            fmt(median(r.get("reward_mean_last_quarter") for r in runs), 3)))
    return "\n".join(lines)


def ratios_table(groups) -> Optional[str]:
    workloads: Dict[str, Dict[str, List[dict]]] = OrderedDict()
    for label, runs in groups.items():
        workload, _, role = label.rpartition(":")
        if workload and role in ROLES:
            workloads.setdefault(workload, {})[role] = runs
    if not workloads:
        return None
    lines = ["| workload | baseline s | ours s | floor s | speed-up (baseline / ours) | ours / floor time "
             "| RSS ours / baseline | RSS ours / floor |", "|---|---|---|---|---|---|---|---|"]
    for workload, roles in workloads.items():
        time = {role: median(r["train_wall_s"] for r in roles.get(role, [])) for role in ROLES}
        rss = {role: max((r["peak_rss_mib"] for r in roles.get(role, [])), default=None) for role in ROLES}
        lines.append("| {} | {} | {} | {} | {}x | {} | {} | {} |".format(
            workload, fmt(time["baseline"]), fmt(time["ours"]), fmt(time["floor"]),
            fmt(ratio(time["baseline"], time["ours"])), fmt(ratio(time["ours"], time["floor"])),
            fmt(ratio(rss["ours"], rss["baseline"])), fmt(ratio(rss["ours"], rss["floor"]))))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print(__doc__)
        return 2
    groups = load(paths)
    if not groups:
        raise SystemExit(f"no JSON result lines in {', '.join(paths)}")
    print(runs_table(groups))
    table = ratios_table(groups)
    if table:
        print()
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
