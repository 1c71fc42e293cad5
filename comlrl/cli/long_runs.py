"""``comlrl train`` for runs that last days on a shared cluster: ``--resume auto`` (does the run continue
from a checkpoint, and which, before any model loads), an earlier start with nothing to resume, and
``--time-limit`` counted from the command's start. See docs/checkpoints.md, "Preemption and requeue",
and examples/slurm/."""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

AUTO = "auto"  # --resume auto (comlrl.checkpoint.schedule.AUTO)
RUN_FILES = ("config.yaml", "resolved_config.yaml", "metrics.jsonl", "eval_rows.jsonl", "reward_curve.png")
TENSORBOARD_DIR = "tensorboard"
RECORD_FILES = ("run_config.json", "run_summary.json")  # the trainer's run record (comlrl.telemetry.run_record)


def resuming(plan) -> bool:
    """Whether this run continues from a checkpoint: ``--resume`` given, and for ``--resume auto`` a
    checkpoint_dir that holds checkpoints."""
    from comlrl.checkpoint import layout

    resume, directory = plan.checkpoint["resume"], plan.checkpoint["dir"]
    if resume == AUTO:
        return directory is not None and bool(layout.list_entries(directory))
    return resume is not None


def set_aside_earlier_start(run_dir: str, log: Callable[[str], None] = print) -> Optional[str]:
    """``--resume auto`` with nothing to resume: the files of an earlier start of the run directory that
    never checkpointed (a job killed before its first checkpoint, then requeued) move into
    ``earlier-start-<UTC time>/`` there, so that the new start neither mixes into nor deletes them."""
    names = [name for name in (*RUN_FILES, TENSORBOARD_DIR, *RECORD_FILES) if os.path.exists(os.path.join(run_dir, name))]
    if not names:
        return None
    target = os.path.join(run_dir, time.strftime("earlier-start-%Y%m%dT%H%M%SZ", time.gmtime()))
    suffix, candidate = 1, target
    while os.path.lexists(candidate):
        suffix += 1
        candidate = f"{target}.{suffix}"
    os.makedirs(candidate)
    for name in names:
        os.rename(os.path.join(run_dir, name), os.path.join(candidate, name))
    log(f"comlrl train: --resume auto found no checkpoint to resume; the files of an earlier start ({', '.join(names)}) "
        f"moved to {candidate}")
    return candidate


def auto_candidate(directory: str, trainer: str) -> Optional[str]:
    """For ``--resume auto``, before any model loads: None when ``directory`` holds no checkpoint (a new
    run), else the newest readable checkpoint of this trainer class, or the newest at all when none is
    (which ``check_checkpoint_settings`` then refuses, naming its class). The full choice, with every
    check, is the trainer's (``resume_from_checkpoint="auto"``)."""
    from comlrl.checkpoint import layout

    readable = [e for e in layout.list_entries(directory) if e.run_id is not None]
    if not readable:
        return None
    for entry in reversed(readable):
        try:
            if layout.read_checkpoint_metadata(entry.path)["trainer_class"].rsplit(".", 1)[-1] == trainer:
                return entry.path
        except (OSError, ValueError):
            continue
    return readable[-1].path


def stop_after(time_limit: Optional[float], started: Optional[float], log: Callable[[str], None]) -> Optional[float]:
    """``train(stop_after_s=...)`` for a ``--time-limit`` counted from the command's start (``started``)."""
    if time_limit is None:
        return None
    left = time_limit - (time.monotonic() - started) if started is not None else time_limit
    if left <= 0:
        log(f"comlrl train: --time-limit ({time_limit:.0f} s) was spent before training started; stopping after the first step.")
    return max(left, 1e-3)
