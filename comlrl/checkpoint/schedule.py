"""When a run checkpoints: ``train()``'s checkpoint arguments, validated before training starts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

def _positive_int_or_none(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None. Got {value!r}.")


@dataclass(frozen=True)
class CheckpointSchedule:
    """When ``train()`` writes checkpoints into ``directory`` (None: never)."""

    directory: Optional[str]
    interval: int = 1  # epochs
    steps: Optional[int] = None  # training steps
    total_limit: Optional[int] = None

    @classmethod
    def from_train_args(cls, *, checkpoint_dir: Any, checkpoint_interval: Any, checkpoint_total_limit: Any, checkpoint_steps: Any, resume_from_checkpoint: Any) -> "CheckpointSchedule":
        if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int) or checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be an integer >= 1 (epochs between checkpoints). Got {checkpoint_interval!r}.")
        _positive_int_or_none("checkpoint_total_limit", checkpoint_total_limit)
        _positive_int_or_none("checkpoint_steps", checkpoint_steps)
        if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise ValueError(f"checkpoint_dir must be a path or None. Got {checkpoint_dir!r}.")
        if resume_from_checkpoint is not None and resume_from_checkpoint is not True and not isinstance(resume_from_checkpoint, (str, os.PathLike)):
            raise ValueError(
                f"resume_from_checkpoint must be a checkpoint path, a checkpoint_dir, True (the latest checkpoint in "
                f"checkpoint_dir) or None. Got {resume_from_checkpoint!r}."
            )
        if resume_from_checkpoint is True and checkpoint_dir is None:
            raise ValueError("resume_from_checkpoint=True resumes the latest checkpoint of checkpoint_dir; give checkpoint_dir=... too.")
        directory = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        return cls(directory, checkpoint_interval, checkpoint_steps, checkpoint_total_limit)

    def due_after_step(self, global_step: int) -> bool:
        return self.directory is not None and self.steps is not None and global_step % self.steps == 0

    def due_after_epoch(self, epoch: int, final: bool) -> bool:
        return self.directory is not None and (final or epoch % self.interval == 0)


# ----------------------------------------------------------------------------- the mixin
