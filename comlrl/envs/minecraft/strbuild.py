"""StrBuild: two agents spell a word as a flat wall of blocks with ``/setblock``.

A task is an uppercase string; each letter is a 5x5 glyph, letters ``spacing`` empty columns apart,
drawn in the plane ``z = local_z`` inside the box (0, 0, z)..(width - 1, 4, z). Rows are given top
row first (``#`` = block, ``.`` = air); row r of the target is at height ``y = 4 - r``.

Score of the simulated wall (agent 1's accepted commands, then agent 2's, which overwrite):

    reward = 2 * coverage - 1.5 * extra_ratio - 1.0 * adjacency - 0.25 * missing_palettes

coverage = target cells that are not air / target cells; extra_ratio = non-air cells off the
target / background cells; adjacency = share of horizontally or vertically adjacent non-air pairs
whose blocks have the same texture family (wood, stone, concrete, obsidian); missing_palettes =
agents whose palette (air excluded) does not all appear in the wall. Max 2.0. Also reported:
``iou = covered / (target cells + extra cells)``. Numbers of OpenMLRL/LLM_Collab_Minecraft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from comlrl.envs.minecraft.commands import Box, Position, block_id, is_air

GLYPH_HEIGHT = GLYPH_WIDTH = 5
# 5x5 glyphs, one string of 25 bits per letter, rows top to bottom
_GLYPHS = {
    "A": "01110 10001 11111 10001 10001", "B": "11110 10001 11110 10001 11110", "C": "01111 10000 10000 10000 01111",
    "D": "11110 10001 10001 10001 11110", "E": "11111 10000 11110 10000 11111", "F": "11111 10000 11110 10000 10000",
    "G": "01111 10000 10111 10001 01110", "H": "10001 10001 11111 10001 10001", "I": "11111 00100 00100 00100 11111",
    "J": "00111 00010 00010 10010 01100", "K": "10001 10010 11100 10010 10001", "L": "10000 10000 10000 10000 11111",
    "M": "10001 11011 10101 10001 10001", "N": "10001 11001 10101 10011 10001", "O": "01110 10001 10001 10001 01110",
    "P": "11110 10001 11110 10000 10000", "Q": "01110 10001 10001 10011 01111", "R": "11110 10001 11110 10010 10001",
    "S": "01111 10000 01110 00001 11110", "T": "11111 00100 00100 00100 00100", "U": "10001 10001 10001 10001 01110",
    "V": "10001 10001 10001 01010 00100", "W": "10001 10001 10101 11011 10001", "X": "10001 01010 00100 01010 10001",
    "Y": "10001 01010 00100 00100 00100", "Z": "11111 00010 00100 01000 11111",
}
GLYPHS: Dict[str, List[str]] = {letter: bits.split() for letter, bits in _GLYPHS.items()}
TEXTURE_FAMILIES = {
    "oak_planks": "wood", "oak_wood": "wood", "stone": "stone", "cobblestone": "stone", "smooth_stone": "stone",
    "stone_bricks": "stone", "white_concrete": "concrete", "obsidian": "obsidian",
}


def target_rows(text: str, spacing: int) -> List[str]:
    """The word's rows, top first: ``#`` for a block; unknown characters are blank glyphs."""
    word = str(text or "").strip().upper()
    if not word:
        return [""] * GLYPH_HEIGHT
    rows = [""] * GLYPH_HEIGHT
    for index, letter in enumerate(word):
        glyph = GLYPHS.get(letter, ["0" * GLYPH_WIDTH] * GLYPH_HEIGHT)
        for r in range(GLYPH_HEIGHT):
            rows[r] += "".join("#" if bit == "1" else "." for bit in glyph[r])
            if index != len(word) - 1:
                rows[r] += "." * int(spacing)
    return rows


@dataclass(frozen=True)
class StrTask:
    task_id: str
    text: str
    difficulty: int
    box_from: Tuple[int, int, int]
    box_to: Tuple[int, int, int]
    rows: Tuple[str, ...]  # target rows, top first

    @property
    def box(self) -> Box:
        return Box.of(self.box_from, self.box_to)


def make_row(index: int, text: str, difficulty: int, *, spacing: int, local_z: int) -> Dict[str, Any]:
    """A dataset row for the ``index``-th (1-based) word of the task file."""
    rows = target_rows(text, spacing)
    width = len(rows[0]) if rows else 0
    task_id = f"str_build_{index:04d}"
    return {
        "task_id": task_id, "csv_row_index": index, "string": text, "difficulty": int(difficulty),
        "local_bbox_from": [0, 0, int(local_z)], "local_bbox_to": [max(0, width - 1), max(0, len(rows) - 1), int(local_z)],
        "target_rows_topdown": rows, "prompt": f"str_build:{task_id}",
    }


def task_of(row: Mapping[str, Any]) -> StrTask:
    try:
        return StrTask(
            task_id=str(row.get("task_id") or ""), text=str(row.get("string") or ""), difficulty=int(row.get("difficulty") or 0),
            box_from=tuple(int(v) for v in row["local_bbox_from"]), box_to=tuple(int(v) for v in row["local_bbox_to"]),
            rows=tuple(str(r) for r in row["target_rows_topdown"]),
        )
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            "A StrBuild row needs local_bbox_from, local_bbox_to and target_rows_topdown (see env.load_dataset); "
            f"got keys {sorted(row) if isinstance(row, Mapping) else type(row).__name__}."
        ) from None


def target_positions(task: StrTask) -> List[Position]:
    height = len(task.rows)
    return [
        (task.box_from[0] + x, task.box_from[1] + (height - 1 - r), task.box_from[2])
        for r, row in enumerate(task.rows) for x, cell in enumerate(row) if cell == "#"
    ]


def palette(blocks: Sequence[str]) -> List[str]:
    """An agent's building blocks: normalized, without air."""
    out = [block_id(b) for b in blocks if block_id(b)]
    return [b for b in out if not is_air(b)]


def texture_family(block: str) -> str:
    name = block_id(block).lower()
    if name in TEXTURE_FAMILIES:
        return TEXTURE_FAMILIES[name]
    if name.endswith(("_planks", "_wood")):
        return "wood"
    if name == "stone" or name.endswith(("_stone", "_stone_bricks")):
        return "stone"
    if name.endswith("_concrete"):
        return "concrete"
    return name


def target_assignment(task: StrTask, palettes: Sequence[Sequence[str]]) -> Tuple[Dict[Position, str], Dict[Position, int]]:
    """Who should place which block where (the perfect-feedback plan): cell (lx, ly) belongs to agent
    ``(lx + ly) % n``; its block is the first of that agent's palette, starting at
    ``(lx + ly) % len(palette)``, that differs from the already planned left/right/below/above cells."""
    n = max(1, len(palettes))
    expected: Dict[Position, str] = {}
    owners: Dict[Position, int] = {}
    for position in sorted(target_positions(task), key=lambda p: (p[1], p[0], p[2])):
        lx, ly = position[0] - task.box_from[0], position[1] - task.box_from[1]
        owner = (lx + ly) % n
        blocks = list(palettes[owner])
        start = (lx + ly) % len(blocks)
        x, y, z = position
        taken = {expected[q] for q in ((x - 1, y, z), (x + 1, y, z), (x, y - 1, z), (x, y + 1, z)) if q in expected}
        choice = next((blocks[(start + k) % len(blocks)] for k in range(len(blocks)) if blocks[(start + k) % len(blocks)] not in taken), blocks[start])
        expected[position], owners[position] = block_id(choice), owner
    return expected, owners


def score(task: StrTask, world: Mapping[Position, str], palettes: Sequence[Sequence[str]]) -> Dict[str, float]:
    """The StrBuild reward of a simulated wall and its terms (``level_1``..``level_4`` add up to ``reward``)."""
    targets = set(target_positions(task))
    covered = sum(not is_air(world.get(p, "air")) for p in targets)
    extra = sum(1 for p, block in world.items() if p not in targets and not is_air(block))
    cells = len(task.rows) * (len(task.rows[0]) if task.rows else 0)
    background = max(0, cells - len(targets))
    coverage = covered / len(targets) if targets else 0.0
    extra_ratio = extra / background if background > 0 else 0.0
    families = {p: texture_family(block) for p, block in world.items() if not is_air(block)}
    pairs = same = 0
    for (x, y, z), family in families.items():
        for neighbour in ((x + 1, y, z), (x, y + 1, z)):
            if neighbour in families:
                pairs += 1
                same += families[neighbour] == family
    adjacency = same / pairs if pairs > 0 else 0.0
    placed = {block for block in world.values() if not is_air(block)}
    missing = sum(not set(p).issubset(placed) for p in palettes)
    level_1, penalty_extra, penalty_adjacency, penalty_palette = 2.0 * coverage, 1.5 * extra_ratio, 1.0 * adjacency, 0.25 * float(missing)
    union = len(targets) + extra
    return {
        "reward": level_1 - penalty_extra - penalty_adjacency - penalty_palette,
        "level_1": level_1, "level_2": -penalty_extra, "level_3": -penalty_adjacency, "level_4": -penalty_palette,
        "coverage": coverage, "iou": covered / union if union > 0 else 0.0, "extra_ratio": extra_ratio,
        "adjacency_ratio": adjacency, "covered": float(covered), "target_cells": float(len(targets)),
        "extra_cells": float(extra), "missing_palettes": float(missing),
    }
