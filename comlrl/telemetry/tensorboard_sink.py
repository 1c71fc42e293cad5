"""TensorBoard as an optional metrics sink (``pip install tensorboard``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping


class TensorBoardSink:
    """Writes every logged row as scalars against ``env_step`` into ``log_dir``."""

    def __init__(self, log_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard itself is missing
            raise ImportError(
                "tensorboard=True needs the tensorboard package: pip install 'comlrl[tensorboard]'."
            ) from exc
        self._writer_cls = SummaryWriter
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=log_dir)

    def write(self, row: Mapping[str, float], step: int) -> None:
        for key, value in row.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def rewind(self, history: List[Dict[str, Any]], step: int) -> None:
        """When a run resumes from a checkpoint taken at ``step`` whose log is ``history``: discard
        every event from ``step`` on (``purge_step``) and write the checkpoint's own rows at ``step``
        again. Purging from ``step + 1`` would keep rows the abandoned continuation logged at the
        checkpoint's step (an evaluation at the start of the next epoch), and they would be logged twice."""
        self.writer.close()
        self.writer = self._writer_cls(log_dir=self.log_dir, purge_step=step)
        for row in history:
            if row.get("env_step") == step:
                self.write({key: value for key, value in row.items() if key != "env_step"}, step)
