"""Per-job cost of the code sandbox: scoring one HumanEval completion, and a batch through ``run_many``.

The jobs are the bundled HumanEval sample's canonical solutions (``comlrl/envs/data/humaneval.json``),
turned into sandbox jobs by the code reward itself (``comlrl.envs.coding.rewards.static_part``), so
the asserts, the pre-evaluation and the timeouts are those of a training run. Only the public
``Sandbox`` API is used (``run``, ``run_many``), so the same script times any version of the sandbox.

    python bench/sandbox_bench.py --isolation bwrap --single 60 --batches 8 --batch-size 64 --workers 2

prints one JSON line: per isolation level, the single-job latencies (median, p95, seconds) and the
batch wall times (median, p95) with the per-job figure (batch time / batch size). Every job must
pass all its asserts (a canonical solution), else the script exits with status 1: a sandbox that is
fast because it stopped running the tests is not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Dict, List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from comlrl.envs.coding.rewards import CodeQuirkFixes, static_part  # noqa: E402
from comlrl.envs.sandbox import Sandbox  # noqa: E402

DATA = os.path.join(ROOT, "comlrl", "envs", "data", "humaneval.json")


def load_jobs() -> List[object]:
    """One sandbox job per bundled HumanEval row (its canonical solution as the entry point)."""
    with open(DATA, encoding="utf-8") as handle:
        data = json.load(handle)
    jobs = []
    for row in data["train"] + data["eval"]:
        completion = row["prompt"] + row["canonical_solution"]
        part = static_part("", completion, row, CodeQuirkFixes(), 10.0, 3)
        if part.job is None:
            raise SystemExit(f"{row['task_id']}: the canonical solution does not reach the tests")
        jobs.append(part.job)
    return jobs


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between order statistics."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def check(reports: Sequence[object]) -> None:
    for report in reports:
        if report.passed != report.total:
            raise SystemExit(f"a canonical solution failed in the sandbox: {report.passed}/{report.total} "
                             f"({[r.status for r in report.results]}, load error {report.load_error!r})")


def measure(isolation: str, jobs: Sequence[object], single: int, batches: int, batch_size: int, workers: int) -> Dict[str, object]:
    sandbox = Sandbox(isolation=isolation, workers=workers)
    check([sandbox.run(job) for job in jobs])  # warm-up (and the probe of the isolation level)
    latencies = []
    for index in range(single):
        job = jobs[index % len(jobs)]
        start = time.perf_counter()
        report = sandbox.run(job)
        latencies.append(time.perf_counter() - start)
        check([report])
    batch_times = []
    batch = [jobs[i % len(jobs)] for i in range(batch_size)]
    for _ in range(batches):
        start = time.perf_counter()
        reports = sandbox.run_many(batch)
        batch_times.append(time.perf_counter() - start)
        check(reports)
    return {
        "isolation": getattr(sandbox, "isolation", isolation),
        "single_median_s": statistics.median(latencies), "single_p95_s": percentile(latencies, 0.95), "single_n": single,
        "batch_median_s": statistics.median(batch_times), "batch_p95_s": percentile(batch_times, 0.95),
        "batch_per_job_median_s": statistics.median(batch_times) / batch_size, "batch_size": batch_size, "batches": batches,
        "workers": sandbox.workers,
    }


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isolation", action="append", help="isolation level(s) to time (repeatable; default bwrap)")
    parser.add_argument("--single", type=int, default=60, help="single jobs timed one after another")
    parser.add_argument("--batches", type=int, default=8, help="run_many batches timed")
    parser.add_argument("--batch-size", type=int, default=64, help="jobs per run_many batch")
    parser.add_argument("--workers", type=int, default=2, help="the sandbox's parallel workers")
    parser.add_argument("--label", default="", help="free text stored in the result (e.g. the commit)")
    args = parser.parse_args(list(argv) or None)
    jobs = load_jobs()
    result = {
        "label": args.label, "python": platform.python_version(), "cpus": os.cpu_count(), "jobs": len(jobs),
        "results": [measure(level, jobs, args.single, args.batches, args.batch_size, args.workers) for level in (args.isolation or ["bwrap"])],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
