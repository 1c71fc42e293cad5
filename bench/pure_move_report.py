#!/usr/bin/env python
"""The table of a ``bench/pure_move.sh`` run: per algorithm, whether every seed generated the same
tokens and rewards on both sides, and the median new/old ratio of CPU time and of train() wall time.

  python bench/pure_move_report.py bench/results/pure-move-<time>/results.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Dict, List

SAME_KEYS = ("generated_tokens", "reward_mean_all", "reward_mean_last_quarter", "joint_responses")


def report(rows: List[dict]) -> str:
    pairs: Dict[str, Dict[int, Dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        pairs[row["algo"]][row["seed"]][row["side"]] = row
    lines = ["| algorithm | seeds | same tokens and rewards | CPU new/old (median) | train wall new/old (median) |",
             "|---|---|---|---|---|"]
    for algo, seeds in pairs.items():
        complete = {seed: sides for seed, sides in seeds.items() if {"old", "new"} <= set(sides)}
        if not complete:  # an interrupted run: no seed of this algorithm ran on both sides
            continue
        same = all(all(s["old"]["result"][k] == s["new"]["result"][k] for k in SAME_KEYS) for s in complete.values())
        cpu = statistics.median(s["new"]["cpu_s"] / s["old"]["cpu_s"] for s in complete.values())
        wall = statistics.median(s["new"]["result"]["train_wall_s"] / s["old"]["result"]["train_wall_s"] for s in complete.values())
        lines.append(f"| {algo} | {','.join(map(str, sorted(complete)))} | {'yes' if same else 'NO'} | {cpu:.3f} | {wall:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as handle:
        print(report([json.loads(line) for line in handle if line.strip()]))
