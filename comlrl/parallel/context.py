"""Process context of the CoMLRL 1.4.x public API (``comlrl.utils``): a single process, the main one.

The data-parallel view of ranks that the trainers use is ``comlrl.parallel.data_parallel.DataParallel``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class DistributedContext:
    is_main: bool
    device: torch.device


def local_context(device: Optional[torch.device] = None) -> DistributedContext:
    return DistributedContext(is_main=True, device=torch.device(device) if device is not None else torch.device("cpu"))


def unwrap_model(model: Any) -> Any:
    """The module inside a DistributedDataParallel / DataParallel wrapper (or the model itself)."""
    while hasattr(model, "module") and isinstance(model, torch.nn.Module) and type(model).__name__ in (
        "DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"
    ):
        model = model.module
    return model
