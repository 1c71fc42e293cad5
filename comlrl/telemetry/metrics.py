"""Metrics: accumulate between logged rows, then write each row to every sink.

Trainers call ``record(metrics)`` after every rollout and update, and ``flush(step)`` after every
training step; a row is emitted when ``step - last_logged >= logging_steps`` (or for the first
row), holding the mean of each metric over everything recorded since the previous row. Nothing is
dropped by the gate. Sinks (W&B, JSONL, TensorBoard, memory) sit behind ``MetricsSink``.

Epoch means: the reward and return keys (``turn_k/reward_mean``, ``turn_k/expected_return``) are
also averaged over the whole epoch (every recorded value counts once, i.e. the mean over the
epoch's training steps). ``epoch_summary`` returns them as ``epoch/turn_k/...`` plus ``epoch`` (the
1-based number of the epoch that ended); the trainer puts them into the epoch's last row, where the
progress bar, the demo's summary and the plot read them.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import weakref
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Optional, Protocol


EPOCH_KEYS = re.compile(r"^turn_\d+/(reward_mean|expected_return)$")


class MetricsSink(Protocol):
    def write(self, row: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class MemorySink:
    """Keeps every row (``trainer.log_history``)."""

    def __init__(self) -> None:
        self.rows: List[Dict[str, Any]] = []

    def write(self, row: Mapping[str, float], step: int) -> None:
        self.rows.append({"env_step": step, **row})

    def close(self) -> None:
        pass


def logged_rows(path: str) -> int:
    """Non-blank lines of a metrics file (0 when it does not exist)."""
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        return sum(1 for line in handle if line.strip())


class JsonlSink:
    """One JSON object per logged row, appended and flushed, so a crashed run keeps its log.

    The file is claimed before the first row: one that already holds another run's rows is refused
    (``FileExistsError`` naming the fixes) unless ``overwrite`` (it is then started afresh), so two
    runs never share a log. A run that resumes from a checkpoint claims it through ``rewind``.
    """

    def __init__(self, path: str, overwrite: bool = False):
        self.path = path
        self.overwrite = overwrite
        self._file = None
        self._closer: Optional[weakref.finalize] = None  # closes the open file once: at close(), or when the sink is freed
        self._claimed = False

    def claim(self) -> None:
        """Take the file for this run (idempotent); see the class docstring."""
        if self._claimed:
            return
        rows = logged_rows(self.path)
        if rows and not self.overwrite:
            directory = os.path.dirname(os.path.abspath(self.path))
            raise FileExistsError(
                f"output_dir {directory} already holds {os.path.basename(self.path)} of another run ({rows} rows); "
                f"refusing to mix this run into it. Choose a new output_dir, set overwrite_output_dir=True in the "
                f"config to start that log afresh, or continue that run with train(resume_from_checkpoint=...)."
            )
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._open("w" if rows else "a")
        self._claimed = True

    def _open(self, mode: str) -> None:
        """Open the log; a sink freed without ``close()`` (a trainer dropped unclosed) closes it then."""
        self._file = open(self.path, mode, encoding="utf-8")
        self._closer = weakref.finalize(self, self._file.close)

    def write(self, row: Mapping[str, float], step: int) -> None:
        self.claim()
        record = {"env_step": step, "time": round(time.time(), 3), **row}
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._closer is not None:
            self._closer()  # a finalizer runs once: closing again does nothing

    def rewind(self, history: List[Dict[str, Any]], step: int) -> None:
        """Cut the file after the row that matches the last row of ``history`` (the log of the checkpoint
        a run resumes from): later rows belong to the abandoned continuation. Rewritten atomically; a
        file that does not contain that row is left as it is. Claims the file for the resumed run."""
        self.close()
        self._claimed = True
        if not history or not os.path.isfile(self.path):
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._open("a")
            return
        with open(self.path, encoding="utf-8") as handle:
            lines = handle.readlines()
        last = history[-1]
        cut = None
        for index in range(len(lines) - 1, -1, -1):
            try:
                row = json.loads(lines[index])
            except ValueError:
                continue
            row.pop("time", None)
            if row == last:
                cut = index + 1
                break
        if cut is not None and cut < len(lines):
            staging = f"{self.path}.rewind"
            with open(staging, "w", encoding="utf-8") as handle:
                handle.writelines(lines[:cut])
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(staging, self.path)
        self._open("a")


class MetricsLogger:
    """Gated, averaging metrics front-end over a list of sinks."""

    def __init__(self, sinks: List[Any], logging_steps: int = 1, merge: Optional[Any] = None):
        self.sinks = list(sinks)
        self.logging_steps = logging_steps
        # (sums, counts) -> the same added up over data-parallel ranks; None: a single process
        self.merge = merge
        self.last_logged_step: Optional[int] = None
        self._sums: Dict[str, float] = defaultdict(float)
        self._counts: Dict[str, int] = defaultdict(int)
        self._epoch_sums: Dict[str, float] = defaultdict(float)
        self._epoch_counts: Dict[str, int] = defaultdict(int)

    def record(self, metrics: Mapping[str, Any]) -> None:
        for key, value in metrics.items():
            if value is None:
                continue
            value = float(value)
            if math.isnan(value):
                continue
            self._sums[key] += value
            self._counts[key] += 1
            if EPOCH_KEYS.match(key):
                self._epoch_sums[key] += value
                self._epoch_counts[key] += 1

    def epoch_summary(self, epoch: int) -> Dict[str, float]:
        """``{"epoch": epoch, "epoch/<key>": mean over the epoch}`` for the reward/return keys; resets them."""
        summary: Dict[str, float] = {"epoch": float(epoch)}
        if self.merge is not None:  # data parallelism: the epoch of every rank
            sums, counts = self.merge(dict(self._epoch_sums), dict(self._epoch_counts))
            self._epoch_sums, self._epoch_counts = defaultdict(float, sums), defaultdict(int, counts)
        for key in sorted(self._epoch_counts):
            summary[f"epoch/{key}"] = self._epoch_sums[key] / self._epoch_counts[key]
        self._epoch_sums.clear()
        self._epoch_counts.clear()
        return summary

    def pending(self) -> bool:
        return bool(self._counts)

    def due(self, step: int) -> bool:
        return self.last_logged_step is None or step - self.last_logged_step >= self.logging_steps

    def flush(self, step: int, force: bool = False) -> Optional[Dict[str, float]]:
        """Emit the averaged row at ``step`` if the gate is open (or ``force``); return it. Under
        data parallelism every rank calls it at the same points and the row averages all ranks'."""
        if not (force or self.due(step)):
            return None
        if self.merge is not None:
            sums, counts = self.merge(dict(self._sums), dict(self._counts))
            self._sums, self._counts = defaultdict(float, sums), defaultdict(int, counts)
        if not self._counts:
            return None
        row = {key: self._sums[key] / self._counts[key] for key in sorted(self._counts)}
        self._sums.clear()
        self._counts.clear()
        self.write(row, step)
        self.last_logged_step = step
        return row

    def write(self, row: Mapping[str, float], step: int) -> None:
        """Write a row immediately to every sink (evaluation rows are not gated)."""
        for sink in self.sinks:
            sink.write(dict(row), step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def claim(self) -> None:
        """Let every sink that writes files claim them for this run (``JsonlSink.claim``)."""
        for sink in self.sinks:
            if hasattr(sink, "claim"):
                sink.claim()

    def rewind(self, history: List[Dict[str, Any]], step: int) -> None:
        """Drop rows logged after a checkpoint (whose log is ``history``, last logged at ``step``)
        from the sinks that can (JSONL, TensorBoard)."""
        for sink in self.sinks:
            if hasattr(sink, "rewind"):
                sink.rewind(history, step)

    def state_dict(self) -> Dict[str, Any]:
        return {
            "last_logged_step": self.last_logged_step, "sums": dict(self._sums), "counts": dict(self._counts),
            "epoch_sums": dict(self._epoch_sums), "epoch_counts": dict(self._epoch_counts),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_logged_step = state["last_logged_step"]
        self._sums = defaultdict(float, state["sums"])
        self._counts = defaultdict(int, state["counts"])
        self._epoch_sums = defaultdict(float, state.get("epoch_sums", {}))  # absent in older checkpoints
        self._epoch_counts = defaultdict(int, state.get("epoch_counts", {}))
