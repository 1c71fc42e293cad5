"""How ``train()`` ends on SIGTERM (what a cluster scheduler sends) and SIGINT (Ctrl-C).

Both end the run with ``TrainingInterrupted`` (a ``KeyboardInterrupt``), so ``run_summary.json`` says
``status: interrupted`` and names the signal. SIGINT stops at once, as Python's own Ctrl-C does.
SIGTERM with checkpointing on lets the current step finish, writes a checkpoint of that step (the
scheduler's grace period, typically 30 s or more, must cover the rest of a step and the save), and
then stops; a second SIGTERM stops at once. Without checkpointing SIGTERM stops at once too.

Handlers are installed only in the main thread and only for the duration of ``train()``; the
previous handlers come back afterwards.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Dict, Optional


class TrainingInterrupted(KeyboardInterrupt):
    """``train()`` was stopped by a signal (``signal_name``); ``checkpoint`` is the final checkpoint
    written for it, or None."""

    def __init__(self, signal_name: str, checkpoint: Optional[str] = None):
        self.signal_name = signal_name
        self.checkpoint = checkpoint
        where = f"; final checkpoint {checkpoint}" if checkpoint else ""
        super().__init__(f"training stopped by {signal_name}{where}")


def signal_of(error: BaseException) -> Optional[str]:
    """The signal that stopped a run (``"SIGINT"`` for a plain ``KeyboardInterrupt``), else None."""
    if isinstance(error, TrainingInterrupted):
        return error.signal_name
    return "SIGINT" if isinstance(error, KeyboardInterrupt) else None


class Interruptible:
    """Context manager around the training loop (see the module docstring). ``defer_sigterm``:
    checkpointing is on, so SIGTERM is only noted (``pending``) until the step ends."""

    def __init__(self, defer_sigterm: bool):
        self.defer_sigterm = defer_sigterm
        self.pending: Optional[str] = None
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "Interruptible":
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, _frame: Any) -> None:
        name = signal.Signals(number).name
        if number == signal.SIGTERM and self.defer_sigterm and self.pending is None:
            self.pending = name
            return
        raise TrainingInterrupted(name)
