"""When a run checkpoints and when it stops by itself: ``train()``'s checkpoint arguments, validated
before training starts (``CheckpointSchedule``), and the durations ``comlrl train --time-limit``
accepts (``parse_duration``)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

AUTO = "auto"  # resume_from_checkpoint="auto": this run's newest usable checkpoint, or a fresh start
DEFAULT_REQUEUE_EXIT_CODE = 85  # the exit code of a preempted run (CoMLRL's long-run mode uses 85 too)
# 0 is success, 1 a failure, 2 a usage error, 126/127 the shell's "cannot run"/"not found", above 128 a death by signal
REQUEUE_EXIT_CODES = range(3, 126)


def _positive_int_or_none(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None. Got {value!r}.")


def _positive_seconds_or_none(name: str, value: Any, what: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds ({what}) or None. Got {value!r}.")
    return float(value)


def check_requeue_exit_code(value: Any, name: str = "requeue_exit_code") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in REQUEUE_EXIT_CODES:
        raise ValueError(
            f"{name} must be an integer from {REQUEUE_EXIT_CODES.start} to {REQUEUE_EXIT_CODES.stop - 1} (0, 1 and 2 mean "
            f"success, failure and a usage error; 126, 127 and codes above 128 are the shell's and signals'). Got {value!r}; "
            f"the default is {DEFAULT_REQUEUE_EXIT_CODE}."
        )
    return value


@dataclass(frozen=True)
class CheckpointSchedule:
    """When ``train()`` writes checkpoints into ``directory`` (None: never), and when it stops by itself.

    ``every_s``: also at the first step boundary ``every_s`` seconds after the last save (or the start);
    ``stop_after_s``: the soft deadline, in seconds from the start of ``train()`` (see ``CheckpointStore``);
    ``requeue_exit_code``: the exit code a preempted run leaves the process with (``TrainingPreempted``).
    """

    directory: Optional[str]
    interval: int = 1  # epochs
    steps: Optional[int] = None  # training steps
    total_limit: Optional[int] = None
    every_s: Optional[float] = None
    stop_after_s: Optional[float] = None
    requeue_exit_code: int = DEFAULT_REQUEUE_EXIT_CODE

    @classmethod
    def from_train_args(cls, *, checkpoint_dir: Any, checkpoint_interval: Any, checkpoint_total_limit: Any, checkpoint_steps: Any,
                        resume_from_checkpoint: Any, checkpoint_every_s: Any = None, stop_after_s: Any = None,
                        requeue_exit_code: Any = DEFAULT_REQUEUE_EXIT_CODE) -> "CheckpointSchedule":
        if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int) or checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be an integer >= 1 (epochs between checkpoints). Got {checkpoint_interval!r}.")
        _positive_int_or_none("checkpoint_total_limit", checkpoint_total_limit)
        _positive_int_or_none("checkpoint_steps", checkpoint_steps)
        every_s = _positive_seconds_or_none("checkpoint_every_s", checkpoint_every_s, "between time-based checkpoints")
        stop_s = _positive_seconds_or_none("stop_after_s", stop_after_s, "from the start of train() to the soft deadline")
        check_requeue_exit_code(requeue_exit_code)
        if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise ValueError(f"checkpoint_dir must be a path or None. Got {checkpoint_dir!r}.")
        if resume_from_checkpoint is not None and resume_from_checkpoint is not True and not isinstance(resume_from_checkpoint, (str, os.PathLike)):
            raise ValueError(
                f"resume_from_checkpoint must be a checkpoint path, a checkpoint_dir, True (the latest checkpoint in "
                f"checkpoint_dir), 'auto' (this run's newest usable checkpoint in checkpoint_dir, or a fresh start) or None. "
                f"Got {resume_from_checkpoint!r}."
            )
        for given, name, what in ((resume_from_checkpoint is True, "resume_from_checkpoint=True", "resumes the latest checkpoint of"),
                                  (resume_from_checkpoint == AUTO, "resume_from_checkpoint='auto'", "looks for this run's checkpoints in"),
                                  (every_s is not None, "checkpoint_every_s", "saves into"),
                                  (stop_s is not None, "stop_after_s", "checkpoints the run it stops into")):
            if given and checkpoint_dir is None:
                raise ValueError(f"{name} {what} checkpoint_dir; give checkpoint_dir=... too.")
        directory = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        return cls(directory, checkpoint_interval, checkpoint_steps, checkpoint_total_limit, every_s, stop_s, requeue_exit_code)

    def due_after_step(self, global_step: int) -> bool:
        return self.directory is not None and self.steps is not None and global_step % self.steps == 0

    def due_after_epoch(self, epoch: int, final: bool) -> bool:
        return self.directory is not None and (final or epoch % self.interval == 0)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SLURM = re.compile(r"^(?:(?P<days>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


def parse_duration(text: Any, name: str = "--time-limit") -> float:
    """Seconds of a duration written as ``sbatch --time`` writes one (``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM``, ``D-HH:MM:SS``) or a number with a unit (``90s``, ``45m``, ``2.5h``, ``2d``). Bare digits
    are refused as ambiguous (sbatch reads them as minutes). A number (not text: a YAML value, which
    reads an unquoted 47:30:00 as 171000) is seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _positive_seconds_or_none(name, text, "the soft deadline")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{name} must be a duration such as 47:30:00, 2-00:00:00, 90m or 3600s. Got {text!r}.")
    value = text.strip()
    unit = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", value)
    match = _SLURM.match(value)
    if value.isdigit():
        raise ValueError(f"{name} {text!r} is ambiguous (sbatch reads bare digits as minutes): write {value}m or {value}s, "
                         f"or HH:MM:SS.")
    if unit:
        seconds = float(unit.group(1)) * _UNITS[unit.group(2)]
    elif match:
        parts = [int(p) for p in match.group("rest").split(":")]
        if match.group("days") is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
            parts = parts + [0] * (3 - len(parts))
            seconds = int(match.group("days")) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
        else:  # MM:SS, HH:MM:SS
            scale = {2: (60, 1), 3: (3600, 60, 1)}[len(parts)]
            seconds = sum(p * s for p, s in zip(parts, scale))
    else:
        raise ValueError(f"{name} {text!r} is not a duration: write it as sbatch --time does (47:30:00, 2-00:00:00) or "
                         f"with a unit (3600s, 45m, 2h, 1d).")
    if seconds <= 0:
        raise ValueError(f"{name} {text!r} is zero; give a positive duration.")
    return float(seconds)
