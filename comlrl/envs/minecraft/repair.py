"""HouseBuild's rectangle feedback: ``rect_modification`` and ``resource_schedule``, as the original
(OpenMLRL/LLM_Collab_Minecraft ``house_build/external``) computes them. Pure functions of a task,
the simulated box and the agents' accepted commands; ``feedback.py`` turns them into prompt lines.

``rect_modification``: every cell whose block differs from the target (air included) is covered by
the one rectangle of its layer (``housebuild.rectangles``, air rectangles too) that has the target
block and contains the cell; those rectangles, sorted by (y, x1, z1, x2, z2, block), go to agent 1
when ``y <= 2`` and to agent 2 when ``y >= 2`` (absolute world y, as in the original: a layer at
``y = 2`` goes to both), the first ``lim`` of each (``lim`` None or 0: all).

``resource_schedule`` (needs per-agent block budgets): per agent, the budget left is
``limit(block) - cells of block filled by the agent's accepted /fill commands of the previous turn``
(``full_budget``: the whole limit, since each turn starts from an empty world). The candidates are
the target's non-air rectangles of a block the agent may use and still has budget for, largest area
first (ties by y, x1, z1, x2, z2, block). Greedily, every candidate whose whole area fits the
remaining budget is scheduled and its area deducted; then the best partial rectangle: of the
candidates not scheduled whose block still has budget ``r``, the sub-rectangle anchored at its
(x1, z1) corner of the largest area ``w * min(depth, r // w) <= r`` over widths ``w`` from the full
width down (the first candidate with the largest such area wins); it is appended without being
deducted. The budgets reported are those after the full rectangles' deductions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from comlrl.envs.minecraft.commands import Position, block_id, is_air
from comlrl.envs.minecraft.housebuild import HouseTask, expected_blocks, rectangles

Rect = Tuple[int, int, int, int, int, str]  # (y, x1, z1, x2, z2, block)
SHARED_LAYER = 2
"""Agent 1 fixes layers y <= 2, agent 2 layers y >= 2 (the original's split, in world y)."""


def _layer_rects(task: HouseTask, y: int) -> List[Tuple[int, int, int, int, str]]:
    return rectangles(task.layer(y), task.letter_blocks(), task.box_from[0], task.box_from[2])


def mismatch_rects(task: HouseTask, world: Mapping[Position, str]) -> List[Rect]:
    """The rectangles covering every wrong cell (see the module docstring), sorted."""
    by_y = {y: _layer_rects(task, y) for y in range(task.box_from[1], task.box_to[1] + 1)}
    found = set()
    for (x, y, z), block in expected_blocks(task).items():
        if world.get((x, y, z), "air") == block:
            continue
        for x1, z1, x2, z2, rect_block in by_y[y]:
            if rect_block == block and x1 <= x <= x2 and z1 <= z <= z2:
                found.add((y, x1, z1, x2, z2, block))
                break
    return sorted(found)


def rects_for_agent(rects: Sequence[Rect], agent: int, lim: Optional[int]) -> List[Rect]:
    """Agent 1 (index 0) gets the layers ``y <= 2``, agent 2 those ``y >= 2``; at most ``lim``."""
    mine = [r for r in rects if (r[0] <= SHARED_LAYER if agent == 0 else r[0] >= SHARED_LAYER)]
    return mine[: int(lim)] if lim is not None and lim > 0 else mine


def filled_cells(commands: Sequence[str]) -> Dict[str, int]:
    """Cells per block that the ``/fill`` commands cover (overlaps counted twice; ``/kill`` skipped)."""
    counts: Dict[str, int] = {}
    for command in commands:
        parts = command.strip().lstrip("/").split()
        if len(parts) < 8 or parts[0].lower() != "fill":
            continue
        try:
            coords = [int(v) for v in parts[1:7]]
        except ValueError:
            continue
        volume = 1
        for a, b in zip(coords[:3], coords[3:]):
            volume *= abs(b - a) + 1
        block = block_id(parts[7])
        counts[block] = counts.get(block, 0) + volume
    return counts


def best_subrect(x1: int, z1: int, x2: int, z2: int, budget: int) -> Tuple[int, int, int, int, int]:
    """``(x1, z1, x1 + w - 1, z1 + d - 1, w * d)``: the largest corner sub-rectangle with ``w * d <= budget``,
    trying widths from the full width down, ``d = min(depth, budget // w)``; area 0 when none fits."""
    width, depth = x2 - x1 + 1, z2 - z1 + 1
    best = (0, 0, 0)
    for w in range(width, 0, -1):
        d = min(depth, budget // w)
        if w * d > best[0]:
            best = (w * d, w, d)
        if best[0] == budget:
            break
    area, w, d = best
    return (x1, z1, x1, z1, 0) if area <= 0 else (x1, z1, x1 + w - 1, z1 + d - 1, area)


@dataclass
class Schedule:
    """One agent's ``resource_schedule`` feedback."""

    remaining: Dict[str, int]
    """Budget per limited block after the previous turn's fills and the scheduled full rectangles."""
    rects: List[Rect]
    """The full rectangles in schedule order, then the partial one (if any)."""


def target_rects(task: HouseTask) -> List[Tuple[Rect, int]]:
    """Every non-air rectangle of the target with its area."""
    out = []
    for y in range(task.box_from[1], task.box_to[1] + 1):
        for x1, z1, x2, z2, block in _layer_rects(task, y):
            if not is_air(block):
                out.append(((y, x1, z1, x2, z2, block), (x2 - x1 + 1) * (z2 - z1 + 1)))
    return out


def schedule(task: HouseTask, accepted: Sequence[str], allowed: Sequence[str], limits: Mapping[str, int],
             full_budget: bool = False) -> Schedule:
    """One agent's schedule (see the module docstring)."""
    used = {} if full_budget else filled_cells(accepted)
    remaining = {block: int(limit) - int(used.get(block, 0)) for block, limit in limits.items()}
    usable = {block_id(b) for b in allowed}
    candidates = [(rect, area) for rect, area in target_rects(task) if rect[5] in usable and remaining.get(rect[5], 0) > 0]
    candidates.sort(key=lambda c: (-c[1], *c[0]))
    chosen: List[Rect] = []
    for rect, area in candidates:
        if remaining.get(rect[5], 0) >= area:
            chosen.append(rect)
            remaining[rect[5]] -= area
    partial, partial_area = None, 0
    for rect, area in candidates:
        budget = remaining.get(rect[5], 0)
        if rect in chosen or budget <= 0 or area <= 0:
            continue
        x1, z1, x2, z2, sub_area = best_subrect(rect[1], rect[2], rect[3], rect[4], budget)
        if sub_area > partial_area:
            partial, partial_area = (rect[0], x1, z1, x2, z2, rect[5]), sub_area
    return Schedule(remaining, chosen + ([partial] if partial is not None else []))


def rect_lines(rects: Sequence[Rect]) -> str:
    """``y=Y: (x1, z1, x2, z2 block)`` per rectangle, or ``(none)``."""
    return "\n".join(f"y={y}: ({x1}, {z1}, {x2}, {z2} {block})" for y, x1, z1, x2, z2, block in rects) if rects else "(none)"
