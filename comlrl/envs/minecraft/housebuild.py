"""HouseBuild: two agents build a 3-D house from y-layer slices with ``/fill``, under resource
limits, while spiders attack.

A task (the original data file's objects: ``task_id``, ``inventory`` letter -> block, ``count``,
``target_spec`` with ``layers`` [{y, rows}] and ``size``, optional ``bbox``) defines the block of
every cell of its box (``A`` = air counts too). Each agent may use, per block, at most
``ceil(count / n) + floor(count / (2 n))`` cells (``limited_resource``); fills beyond are rejected.

Score of the simulated box (agent 1's accepted commands, then agent 2's):

    level_1 = cells whose block equals the target / all cells of the box
    level_2 = -0.1 * min(1, total spider damage / player HP)   unless an agent issued /kill
    reward  = level_1 + level_2          (max 1.0)

Spider attacks: ``num`` values drawn once per run by ``random.Random(seed).randint(low, high)``, as
the original training script draws them. Also reported: ``iou`` of the non-air cells.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from comlrl.envs.minecraft.commands import Box, Position, block_id, is_air


@dataclass(frozen=True)
class HouseTask:
    task_id: str
    box_from: Tuple[int, int, int]
    box_to: Tuple[int, int, int]
    inventory: Tuple[Tuple[str, str], ...]  # (letter, block), in the data's order
    layers: Tuple[Tuple[int, Tuple[str, ...]], ...]  # (y, rows), rows along z, characters along x

    @property
    def box(self) -> Box:
        return Box.of(self.box_from, self.box_to)

    def letter_blocks(self) -> Dict[str, str]:
        return {letter: block_id(block) for letter, block in self.inventory}

    def layer(self, y: int) -> Tuple[str, ...]:
        for layer_y, rows in self.layers:
            if layer_y == y:
                return rows
        raise ValueError(f"{self.task_id}: no layer at y={y}")


def _mapping(value: Any) -> Dict[str, Any]:
    """A dict field of a row, without the None entries a datasets table adds for absent keys."""
    return {str(k): v for k, v in (value or {}).items() if v is not None} if isinstance(value, Mapping) else {}


def _layers_of(row: Mapping[str, Any]) -> Dict[int, List[str]]:
    layers = _mapping(row.get("layers_by_y"))
    if layers:
        return {int(y): [str(r) for r in rows] for y, rows in layers.items()}
    spec = row.get("target_spec") or {}
    entries = spec.get("layers") if isinstance(spec, Mapping) else None
    if isinstance(entries, Mapping):
        return {int(y): [str(r) for r in rows] for y, rows in entries.items() if rows is not None}
    if isinstance(entries, list):
        return {int(e["y"]): [str(r) for r in e["rows"]] for e in entries}
    raise ValueError(f"A HouseBuild row needs layers_by_y or target_spec.layers; got keys {sorted(row)}.")


def task_of(row: Mapping[str, Any]) -> HouseTask:
    """The task of a dataset row, or of a raw task object of the original data file."""
    if not isinstance(row, Mapping):
        raise ValueError(f"A HouseBuild row must be a mapping, got {type(row).__name__}.")
    inventory = _mapping(row.get("inventory"))
    if not inventory:
        raise ValueError(f"HouseBuild task {row.get('task_id')!r} has no inventory.")
    layers = _layers_of(row)
    if row.get("local_bbox_from") is not None and row.get("local_bbox_to") is not None:
        low, high = row["local_bbox_from"], row["local_bbox_to"]
    elif isinstance(row.get("bbox"), Mapping) and row["bbox"].get("from") is not None:
        low, high = row["bbox"]["from"], row["bbox"]["to"]
    else:
        any_rows = next(iter(layers.values()))
        low, high = [0, min(layers), 0], [max(0, len(any_rows[0]) - 1), max(layers), max(0, len(any_rows) - 1)]
    box = Box.of(low, high)
    return HouseTask(
        task_id=str(row.get("task_id") or ""), box_from=box.low, box_to=box.high,
        inventory=tuple((k, str(v).strip()) for k, v in inventory.items()),
        layers=tuple(sorted((y, tuple(rows)) for y, rows in layers.items())),
    )


def make_row(index: int, task: Mapping[str, Any]) -> Dict[str, Any]:
    """A dataset row: the raw task's fields plus its box, ``layers_by_y`` and the prompt key."""
    parsed = task_of(task)
    row = {key: task.get(key) for key in ("task_id", "inventory", "count", "target_spec", "bbox")}
    row.update(
        task_id=parsed.task_id or f"house_build_{index:04d}", dataset_index=index,
        local_bbox_from=list(parsed.box_from), local_bbox_to=list(parsed.box_to),
        layers_by_y={str(y): list(rows) for y, rows in parsed.layers}, prompt=f"house_build:{parsed.task_id}",
    )
    return row


def expected_blocks(task: HouseTask) -> Dict[Position, str]:
    letters = task.letter_blocks()
    out: Dict[Position, str] = {}
    for y in range(task.box_from[1], task.box_to[1] + 1):
        for rz, row in enumerate(task.layer(y)):
            for rx, letter in enumerate(row):
                if letter not in letters:
                    raise ValueError(f"{task.task_id}: unknown inventory key {letter!r}")
                out[(task.box_from[0] + rx, y, task.box_from[2] + rz)] = letters[letter]
    return out


def resource_limits(task: HouseTask, num_agents: int) -> Dict[str, int]:
    """Per-agent cell budget of each non-air block: ``ceil(c / n) + floor(c / (2 n))``."""
    n = max(1, int(num_agents))
    counts: Dict[str, int] = {}
    for block in expected_blocks(task).values():
        counts[block] = counts.get(block, 0) + 1
    blocks = set(counts) | set(task.letter_blocks().values())
    return {b: (counts.get(b, 0) + n - 1) // n + counts.get(b, 0) // (2 * n) for b in sorted(blocks) if not is_air(b)}


@dataclass(frozen=True)
class Threat:
    """The spiders of a run: their attack values, and the player's health."""

    player_hp: int
    attacks: Tuple[int, ...]

    @property
    def damage(self) -> float:
        return float(sum(self.attacks))

    @classmethod
    def draw(cls, *, seed: int, player_hp: int, spiders: int, attack_low: int, attack_high: int) -> "Threat":
        low, high = sorted((int(attack_low), int(attack_high)))
        rng = random.Random(int(seed))
        return cls(int(player_hp), tuple(rng.randint(low, high) for _ in range(max(0, int(spiders)))))

    def penalty(self, killed: bool) -> float:
        """0.1 x min(1, damage / HP), unless the spiders were killed."""
        if killed or self.damage <= 0 or self.player_hp <= 0:
            return 0.0
        return min(1.0, self.damage / self.player_hp) * 0.1


def score(task: HouseTask, world: Mapping[Position, str], threat: Optional[Threat], killed: bool) -> Dict[str, float]:
    """The HouseBuild reward and its terms."""
    expected = expected_blocks(task)
    correct = sum(world.get(p, "air") == block for p, block in expected.items())
    target_solid = {p for p, block in expected.items() if not is_air(block)}
    placed_solid = {p for p, block in world.items() if not is_air(block)}
    overlap = len(target_solid & placed_solid)
    union = len(target_solid) + len(placed_solid) - overlap
    match = correct / len(expected) if expected else 0.0
    penalty = threat.penalty(killed) if threat is not None else 0.0
    return {
        "reward": match - penalty, "level_1": match, "level_2": -penalty, "iou": overlap / union if union > 0 else 0.0,
        "matched_cells": float(correct), "cells": float(len(expected)), "spiders_killed": float(killed),
    }


def rectangles(rows: Sequence[str], letters: Mapping[str, str], min_x: int, min_z: int) -> List[Tuple[int, int, int, int, str]]:
    """A layer as rectangles ``(x1, z1, x2, z2, block)``: runs of one letter along x, merged along z
    while a run with the same extent and block continues on the next row."""
    done: List[Tuple[int, int, int, int, str]] = []
    open_rects: Dict[Tuple[int, int, str], List[Any]] = {}
    for z, row in enumerate(rows):
        runs, start = [], 0
        for x in range(1, len(row) + 1):
            if x == len(row) or row[x] != row[start]:
                runs.append((start, x - 1, letters[row[start]]))
                start = x
        still_open: Dict[Tuple[int, int, str], List[Any]] = {}
        for x1, x2, block in runs:
            rect = open_rects.pop((x1, x2, block), None) or [min_x + x1, min_z + z, min_x + x2, None, block]
            rect[3] = min_z + z
            still_open[(x1, x2, block)] = rect
        done.extend(tuple(r) for r in open_rects.values())
        open_rects = still_open
    done.extend(tuple(r) for r in open_rects.values())
    return done


def layers_text(task: HouseTask, include_air: bool = False) -> str:
    """``y=Y: {(x1, Y, z1, x2, Y, z2 block), ...}`` per layer, ascending y."""
    letters = task.letter_blocks()
    lines = []
    for y in range(task.box_from[1], task.box_to[1] + 1):
        rects = rectangles(task.layer(y), letters, task.box_from[0], task.box_from[2])
        if not include_air:
            rects = [r for r in rects if not is_air(r[4])]
        lines.append(f"y={y}: {{" + ", ".join(f"({x1}, {y}, {z1}, {x2}, {y}, {z2} {b})" for x1, z1, x2, z2, b in rects) + "}")
    return "\n".join(lines)
