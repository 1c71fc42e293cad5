"""Console progress: one bar per epoch, an estimate after the first step, quiet library bars.

- On a terminal, a tqdm bar over the epoch's training items shows the latest logged reward; when
  the epoch ends its postfix shows the epoch means (``epoch/turn_1/...`` of the epoch's last row),
  the same numbers the demo's summary prints and the plot marks.
- On anything else (a log file, a pipe, a notebook cell captured to text) there is no bar: one line
  per epoch, written when it ends.
- ``RunClock`` estimates the remaining time of the run from the steps after the first (the first
  carries warm-up) and the evaluations timed apart; the estimate is printed after the second step
  and shown in the bar (on a terminal) or in each epoch's line (off one). tqdm's own "remaining"
  (of the epoch, from a rate that counts the first step) is not shown.
- ``library_bars(False)`` silences transformers' and huggingface_hub's own bars ("Loading weights",
  "Writing model shards", downloads) for a quiet run.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Any, Callable, Iterator, List, Mapping, Optional, TextIO

POSTFIX_KEYS = ("turn_1/reward_mean", "turn_1/expected_return")
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"  # the run's estimate is in the postfix


def epoch_postfix(row: Optional[Mapping[str, Any]]) -> str:
    """``epoch mean reward_mean=0.412, expected_return=0.398`` from an epoch's last row ("" without)."""
    if not row:
        return ""
    parts = [f"{key.split('/')[1]}={row['epoch/' + key]:.3f}" for key in POSTFIX_KEYS if f"epoch/{key}" in row]
    return "epoch mean " + ", ".join(parts) if parts else ""


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


class ProgressBar:
    """An epoch's progress on ``stream`` (default stderr): a bar on a terminal, one line elsewhere."""

    def __init__(self, total: Optional[int], initial: int, enabled: bool, desc: str, stream: Optional[TextIO] = None):
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._desc = desc
        self._count = initial
        self._total = total
        self._start = time.perf_counter()
        self._bar = None
        isatty = getattr(self._stream, "isatty", None)
        if enabled and callable(isatty) and isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="item", file=self._stream, dynamic_ncols=True,
                             bar_format=BAR_FORMAT)
        self._left = ""

    def estimate(self, left: str) -> None:
        """The run's remaining time (``about 3 min left``), shown from the next update on."""
        self._left = left

    def update(self, count: int, row: Optional[Mapping[str, Any]] = None) -> None:
        self._count += count
        if self._bar is None:
            return
        self._bar.update(count)
        postfix = {key.split("/")[1]: f"{row[key]:.3f}" for key in POSTFIX_KEYS if key in row} if row else {}
        if self._left:
            postfix["run"] = self._left
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)

    def note(self, message: str) -> None:
        """A line of text above the bar (or on its own line without one)."""
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.write(message, file=self._stream)
        else:
            print(message, file=self._stream, flush=True)

    def finish(self, row: Optional[Mapping[str, Any]]) -> None:
        """End of the epoch: show its means (the bar's final postfix, or the epoch's one line)."""
        means = epoch_postfix(row)
        if self._bar is not None:
            if means:
                self._bar.set_postfix_str(means, refresh=False)
            return
        if self._enabled:
            of = f"/{self._total}" if self._total is not None else ""
            line = f"{self._desc}: {self._count}{of} items in {format_duration(time.perf_counter() - self._start)}"
            print(line + (f"; {means}" if means else "") + (f"; {self._left}" if self._left else ""), file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class RunClock:
    """The remaining time of a ``train()`` call, estimated from the recent steps after the first.

    The first step carries one-off costs (the first forward and backward allocate their buffers,
    lazy imports and caches fill: 18 s against 13 s for later steps of ``comlrl demo`` on idle
    cores), and in ``comlrl train`` runs the evaluation due at item 0 came on top of it; it is
    reported, not extrapolated. On a shared machine the speed of a run also changes with the load
    (steps of one demo took 160-245 s while two cores were shared and 12-15 s once they were not),
    so the estimate follows the recent steps: from the second step on it is ``remaining steps x
    mean time of the last WINDOW steps after the first`` plus ``remaining evaluations x mean time
    of the recent evaluations``, evaluations being timed apart (``evaluating()``) since they come
    every ``eval_interval`` items, not every step. ``clock`` is injectable (tests use a fake one).
    """

    WINDOW = 3

    def __init__(self, remaining_steps: Optional[int], remaining_evaluations: int = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.remaining_steps = remaining_steps  # including the coming step; None when unknown
        self.remaining_evaluations = remaining_evaluations
        self._clock = clock
        self._last = clock()
        self._in_step_evaluation = 0.0
        self.steps: List[float] = []  # each step's time without its evaluation
        self.evaluations: List[float] = []

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Time an evaluation apart from the step it comes before."""
        start = self._clock()
        try:
            yield
        finally:
            took = self._clock() - start
            self.evaluations.append(took)
            self._in_step_evaluation += took
            self.remaining_evaluations = max(self.remaining_evaluations - 1, 0)

    def step_done(self) -> Optional[str]:
        """Record a finished step; returns the line to print after the first and the second step."""
        now = self._clock()
        self.steps.append(now - self._last - self._in_step_evaluation)
        self._last, self._in_step_evaluation = now, 0.0
        if self.remaining_steps is not None:
            self.remaining_steps = max(self.remaining_steps - 1, 0)
        if len(self.steps) == 1 and self.remaining_steps:
            return (f"first step took {format_duration(self.steps[0] + sum(self.evaluations))} (warm-up included); the "
                    f"estimate of the remaining time follows the second step")
        if len(self.steps) == 2 and self.remaining_steps:
            return f"{self.left()} for the {self.remaining_steps} remaining steps (estimate)"
        return None

    def remaining_seconds(self) -> Optional[float]:
        """The estimate (None before the second step or when the number of steps is unknown)."""
        if self.remaining_steps is None or len(self.steps) < 2:
            return None
        recent = self.steps[1:][-self.WINDOW:]
        per_step = sum(recent) / len(recent)
        if len(self.evaluations) > 1:
            evaluations = self.evaluations[1:][-self.WINDOW:]
            per_evaluation = sum(evaluations) / len(evaluations)
        elif self.evaluations:  # only the first, warm-up included: scaled as the first step was to the later ones
            per_evaluation = self.evaluations[0] * min(1.0, per_step / max(self.steps[0], 1e-9))
        else:
            per_evaluation = 0.0
        return self.remaining_steps * per_step + self.remaining_evaluations * per_evaluation

    def left(self) -> str:
        """``about 3 min 10 s left`` ("" without an estimate)."""
        seconds = self.remaining_seconds()
        return "" if seconds is None or not self.remaining_steps else f"about {format_duration(seconds)} left"


def remaining_steps(length: Optional[int], items_per_step: int, epoch: int, position: int, epochs: int) -> Optional[int]:
    """Training steps left from ``position`` of ``epoch`` (0-based) to the end of ``epochs``."""
    if length is None or epoch >= epochs:
        return None
    per_epoch = math.ceil(length / items_per_step)
    return math.ceil(max(length - position, 0) / items_per_step) + per_epoch * (epochs - epoch - 1)


def remaining_evaluations(length: Optional[int], items_per_step: int, epoch: int, position: int, epochs: int,
                          interval: int) -> int:
    """Evaluations still due: one before every step whose items cover a multiple of ``interval`` (0: none)."""
    if length is None or interval <= 0 or epoch >= epochs:
        return 0

    def due(first: int) -> int:
        return sum(1 for start in range(first, length, items_per_step)
                   if any((start + offset) % interval == 0 for offset in range(min(items_per_step, length - start))))

    return due(position) + due(0) * (epochs - epoch - 1)


@contextlib.contextmanager
def library_bars(enabled: bool) -> Iterator[None]:
    """With ``enabled=False``, transformers' and huggingface_hub's progress bars are off inside the block
    (and restored after it)."""
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
