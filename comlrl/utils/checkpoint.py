"""Training checkpoints (CoMLRL 1.4.x import path): read a checkpoint's identity before building a
trainer, and the mixin behind every trainer's ``save_checkpoint`` / ``load_checkpoint``.

The machinery lives in ``comlrl.checkpoint.store``; the layout is described in
``docs/checkpoints.md``.
"""

from comlrl.checkpoint.store import CheckpointSchedule, TrainingCheckpointMixin
from comlrl.checkpoint.files import CheckpointCorruptError, CheckpointError
from comlrl.checkpoint.layout import (
    CHECKPOINT_VERSION,
    MANIFEST_FILENAME,
    RNG_FILENAME,
    STATE_FILENAME,
    latest_checkpoint,
    read_checkpoint_metadata,
)
from comlrl.checkpoint.state import CheckpointComponents, capture_rng_state, restore_rng_state

__all__ = [
    "CHECKPOINT_VERSION",
    "MANIFEST_FILENAME",
    "RNG_FILENAME",
    "STATE_FILENAME",
    "CheckpointComponents",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointSchedule",
    "TrainingCheckpointMixin",
    "capture_rng_state",
    "latest_checkpoint",
    "read_checkpoint_metadata",
    "restore_rng_state",
]
