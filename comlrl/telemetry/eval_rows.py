"""Evaluation rows with an environment's reward breakdown, one JSON line per item and turn.

``EvalRows(path, details)`` offers the hooks both trainer families call during ``evaluate()``:
``eval_logger`` / ``eval_aggregator`` (MAGRPO family) and ``metrics_callback`` (IAC, MAAC; it
ignores training rollouts, whose samples carry critic values). Each row holds the env_step, the
item's position in the evaluation and its ``task_id`` when it has one, the turn, every agent's
completion and ``details(completions_1, ..., batch_items=[item])[0]``; the hooks return the
breakdown of each item's last turn, which the trainers average into ``eval/<key>`` metrics.
"""

from __future__ import annotations

import json
import os
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

ROWS_FILE = "eval_rows.jsonl"


class EvalRows:
    def __init__(self, path: Optional[str], details: Callable[..., List[Dict[str, float]]]):
        self.path = path
        self.details = details
        self._step: Callable[[], int] = lambda: 0
        self._evaluation = (-1, 0)  # (env_step of the evaluation in progress, items seen in it)

    def bind(self, trainer: Any) -> None:
        """Stamp rows with ``trainer.env_step``. The trainer holds these hooks, so they hold it weakly:
        no cycle keeps a dropped trainer's models alive (docs/design.md, "Lifetime")."""
        ref = weakref.ref(trainer)
        self._step = lambda: int(ref().env_step)

    # ------------------------------------------------------------------ MAGRPO family
    def eval_logger(self, *, agent_completions_turns: Sequence[Sequence[Sequence[str]]], batch_items: Sequence[Any], **_: Any) -> List[Dict[str, float]]:
        """``agent_completions_turns[agent][item][turn]`` -> the last turn's breakdown per item."""
        out = []
        for index, item in enumerate(batch_items):
            turns = min(len(agent[index]) for agent in agent_completions_turns)
            last: Dict[str, float] = {}
            for turn in range(turns):
                joint = [agent[index][turn] for agent in agent_completions_turns]
                last = self._record(index, item, turn, joint)
            out.append(last)
        return out

    def eval_aggregator(self, per_item: Sequence[Mapping[str, float]], num_turns: int = 1) -> Dict[str, float]:
        return mean_numbers(per_item)

    # ------------------------------------------------------------------ actor-critic family
    def metrics_callback(self, samples: Sequence[Any]) -> Dict[str, float]:
        """One item's samples from ``evaluate()`` -> its last turn's breakdown (training samples: {})."""
        if not samples or any(getattr(s, "old_value", None) is not None for s in samples):
            return {}
        by_turn: Dict[int, Dict[int, str]] = {}
        item = samples[0].metadata.get("batch_item")
        for sample in samples:
            by_turn.setdefault(sample.turn_idx, {})[sample.agent_idx] = sample.completion
        step, seen = self._evaluation
        index = seen if step == self._step() else 0  # items are numbered within one evaluation
        self._evaluation = (self._step(), index + 1)
        last: Dict[str, float] = {}
        for turn in sorted(by_turn):
            agents = by_turn[turn]
            last = self._record(index, item, turn, [agents[a] for a in sorted(agents)])
        return last

    # ------------------------------------------------------------------ rows
    def _record(self, index: int, item: Any, turn: int, joint: List[str]) -> Dict[str, float]:
        details = self.details(*[[text] for text in joint], batch_items=[item])[0]
        if self.path:
            append_rows(self.path, [eval_row(self._step(), index, item, turn, joint, details)])
        return details


def eval_row(env_step: int, index: int, item: Any, turn: int, completions: Sequence[str], details: Any,
             sample: Optional[int] = None) -> Dict[str, Any]:
    """One row: ``turn`` is 0-based here and 1-based in the row; ``sample`` (the episode's number
    among an item's samples) only when an evaluation samples several."""
    row: Dict[str, Any] = {"env_step": env_step, "item": index}
    if sample is not None:
        row["sample"] = sample
    row.update(turn=turn + 1, completions=list(completions), details=details)
    if isinstance(item, Mapping) and item.get("task_id") is not None:
        row["task_id"] = item["task_id"]
    return row


def append_rows(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append ``rows`` to the JSON-lines file ``path`` (its folder made when missing)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def mean_numbers(rows: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """The mean of every numeric key over ``rows`` (keys missing from a row are skipped there)."""
    sums: Dict[str, float] = {}
    counts: Dict[str, int] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}
