"""Reading JSON-lines files given on the command line (metrics logs, evaluation datasets)."""

from __future__ import annotations

import json
from typing import Any, Iterator, Tuple


def json_lines(path: str, where: str) -> Iterator[Tuple[int, Any]]:
    """``(line number, value)`` of every non-empty line of ``path``; a line that is not JSON is a
    ValueError naming ``where`` and the line."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}, line {number}: not valid JSON ({error.msg}).") from None
