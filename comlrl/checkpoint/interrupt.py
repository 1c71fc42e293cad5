"""How ``train()`` ends on a scheduler's signal, a soft deadline or Ctrl-C.

- **SIGUSR1** (what ``sbatch --signal=USR1@120`` sends ahead of the time limit) and **SIGTERM** (what a
  scheduler sends before SIGKILL, on preemption or at the limit) *preempt* a run that checkpoints: the
  signal is only noted, the current step finishes, a checkpoint of it is written, and ``train()`` raises
  ``TrainingPreempted``: a ``SystemExit`` whose code is the requeue exit code (85 by default), so a
  script that does not catch it leaves the process with that code and a job script can requeue on it.
  ``run_summary.json`` says ``status: preempted``. The same signal again changes nothing (torchrun and
  Slurm may both deliver it; the step still finishes). Under torchrun every rank stops at the same step
  (``CheckpointStore`` agrees on it).
- The soft deadline (``train(stop_after_s=...)``, ``comlrl train --time-limit``) preempts the run the
  same way, without a signal.
- **SIGINT** (Ctrl-C) stops at once with ``TrainingInterrupted`` (a ``KeyboardInterrupt``), as Python's
  own Ctrl-C does, and so do SIGUSR1 and SIGTERM when the run has no ``checkpoint_dir`` (a requeued run
  would have nothing to continue from): ``status: interrupted``.

Handlers are installed only in the main thread and only for the duration of ``train()``; the
previous handlers come back afterwards.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Dict, Optional

# (Windows has no SIGUSR1)
PREEMPTING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGUSR1", "SIGTERM") if hasattr(signal, name))


class TrainingInterrupted(KeyboardInterrupt):
    """``train()`` was stopped at once by a signal (``signal_name``); ``checkpoint`` is None (kept for
    callers of earlier comlrl versions, whose SIGTERM stop could name one)."""

    def __init__(self, signal_name: str, checkpoint: Optional[str] = None):
        self.signal_name = signal_name
        self.checkpoint = checkpoint
        where = f"; final checkpoint {checkpoint}" if checkpoint else ""
        super().__init__(f"training stopped by {signal_name}{where}")


class TrainingPreempted(SystemExit):
    """``train()`` stopped at a step boundary for ``reason`` (``"SIGUSR1"``, ``"SIGTERM"`` or
    ``"time limit"``) after writing ``checkpoint``; ``exit_code`` (also ``code``, so an uncaught one
    exits with it) is the requeue exit code. ``signal_name`` is the signal, or None for the deadline."""

    def __init__(self, reason: str, checkpoint: Optional[str], exit_code: int, where: str = ""):
        super().__init__(exit_code)
        self.reason = reason
        self.signal_name = reason if reason.startswith("SIG") else None
        self.checkpoint = checkpoint
        self.exit_code = exit_code
        self.where = where  # "global step 12 (epoch 2, item 8)"

    def __str__(self) -> str:
        at = f" after {self.where}" if self.where else ""
        return f"training preempted by {self.reason}{at}; checkpoint {self.checkpoint}; exit code {self.exit_code}"


def signal_of(error: BaseException) -> Optional[str]:
    """The signal that stopped a run (``"SIGINT"`` for a plain ``KeyboardInterrupt``), else None."""
    if isinstance(error, (TrainingInterrupted, TrainingPreempted)):
        return error.signal_name
    return "SIGINT" if isinstance(error, KeyboardInterrupt) else None


class Interruptible:
    """Context manager around the training loop (see the module docstring). ``defer``: the run
    checkpoints, so SIGUSR1 and SIGTERM are only noted (``pending``: the first one's name) until the
    run reaches a step boundary; ``notice``: what to tell the job log when one is noted."""

    def __init__(self, defer: bool, notice: str = ""):
        self.defer = defer
        self.notice = notice
        self.pending: Optional[str] = None
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "Interruptible":
        if threading.current_thread() is threading.main_thread():
            for number in (*PREEMPTING_SIGNALS, signal.SIGINT):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, _frame: Any) -> None:
        name = signal.Signals(number).name
        if number == signal.SIGINT or not self.defer:
            raise TrainingInterrupted(name)
        if self.pending is None:
            self.pending = name
            # os.write: a print could be interrupted inside another print of the main thread
            os.write(2, f"comlrl: {name} received: {self.notice}\n".encode())
