"""Console progress: one bar per epoch, an estimate after the first step, quiet library bars.

- On a terminal, a tqdm bar over the epoch's training items shows the latest logged reward; when
  the epoch ends its postfix shows the epoch means (``epoch/turn_1/...`` of the epoch's last row),
  the same numbers the demo's summary prints and the plot marks.
- On anything else (a log file, a pipe, a notebook cell captured to text) there is no bar: one line
  per epoch, written when it ends.
- ``StepTimer`` turns the first step's time into an estimate of the remaining time.
- ``library_bars(False)`` silences transformers' and huggingface_hub's own bars ("Loading weights",
  "Writing model shards", downloads) for a quiet run.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Any, Iterator, Mapping, Optional, TextIO

POSTFIX_KEYS = ("turn_1/reward_mean", "turn_1/expected_return")


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

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="item", file=self._stream, dynamic_ncols=True)

    def update(self, count: int, row: Optional[Mapping[str, Any]] = None) -> None:
        self._count += count
        if self._bar is None:
            return
        self._bar.update(count)
        if row:
            postfix = {key.split("/")[1]: f"{row[key]:.3f}" for key in POSTFIX_KEYS if key in row}
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
            print(line + (f"; {means}" if means else ""), file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class StepTimer:
    """Times the first training step of a ``train()`` call and estimates the rest from it."""

    def __init__(self, remaining_steps: Optional[int]):
        self.remaining_steps = remaining_steps  # including the first step; None when unknown
        self._start = time.perf_counter()
        self.done = False

    def estimate(self) -> Optional[str]:
        """After the first step (once): ``first step 3 s; about 1 min 33 s for the 31 remaining steps``."""
        if self.done:
            return None
        self.done = True
        elapsed = time.perf_counter() - self._start
        text = f"first step took {format_duration(elapsed)}"
        if self.remaining_steps is not None and self.remaining_steps > 1:
            left = self.remaining_steps - 1
            text += f"; about {format_duration(left * elapsed)} for the {left} remaining steps (estimate)"
        return text


def remaining_steps(length: Optional[int], items_per_step: int, epoch: int, position: int, epochs: int) -> Optional[int]:
    """Training steps left from ``position`` of ``epoch`` (0-based) to the end of ``epochs``."""
    if length is None or epoch >= epochs:
        return None
    per_epoch = math.ceil(length / items_per_step)
    return math.ceil(max(length - position, 0) / items_per_step) + per_epoch * (epochs - epoch - 1)


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
