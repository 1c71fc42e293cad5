"""TensorBoard as an optional metrics sink (``pip install tensorboard``)."""

from __future__ import annotations

from typing import Mapping


class TensorBoardSink:
    """Writes every logged row as scalars against ``env_step`` into ``log_dir``."""

    def __init__(self, log_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard itself is missing
            raise ImportError(
                "tensorboard=True needs the tensorboard package: pip install 'comlrl[tensorboard]'."
            ) from exc
        self.writer = SummaryWriter(log_dir=log_dir)

    def write(self, row: Mapping[str, float], step: int) -> None:
        for key, value in row.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
