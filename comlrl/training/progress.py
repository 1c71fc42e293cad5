"""Console progress: a tqdm bar over training items with the live reward in its postfix."""

from __future__ import annotations

import sys
from typing import Any, Mapping, Optional


class ProgressBar:
    def __init__(self, total: Optional[int], initial: int, enabled: bool, desc: str):
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="item", file=sys.stderr, dynamic_ncols=True)

    def update(self, count: int, row: Optional[Mapping[str, Any]] = None) -> None:
        if self._bar is None:
            return
        self._bar.update(count)
        if row:
            postfix = {}
            for key in ("turn_1/reward_mean", "turn_1/expected_return"):
                if key in row:
                    postfix[key.split("/")[1]] = f"{row[key]:.3f}"
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
