"""Minecraft commands as text: parsing, validation against a task's rules, and the voxel simulation.

No game server: a command list is "executed" on a dictionary ``(x, y, z) -> block`` restricted to
the task's bounding box, where unset cells are air (the rules of OpenMLRL/LLM_Collab_Minecraft).

- ``command_lines``: markdown fences (the first fenced block) and list bullets / numbering are
  stripped; one command per non-empty line.
- ``validate``: keeps, in order and up to ``max_commands``, the commands an agent may issue:
  ``/setblock x y z block`` (StrBuild) or ``/fill x1 y1 z1 x2 y2 z2 block`` without modes plus
  ``/kill`` (HouseBuild), with absolute integer coordinates inside the box and an allowed block
  (``air`` always allowed); a per-block volume budget (``resource_limits``) rejects fills beyond it.
- ``simulate``: applies accepted commands in order; returns the box as ``{(x, y, z): block}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

AIR_BLOCKS = frozenset({"air", "cave_air", "void_air"})
LIST_MARKER = re.compile(r"^\s*(?:[-*]+|\d+[.)])\s*")

Position = Tuple[int, int, int]


def block_id(name: object) -> str:
    """``minecraft:stone`` -> ``stone`` (surrounding spaces dropped)."""
    text = str(name or "").strip()
    return text[len("minecraft:"):] if text.startswith("minecraft:") else text


def is_air(name: Optional[str]) -> bool:
    return name is None or block_id(name) in AIR_BLOCKS


def _strip_fences(text: str) -> str:
    raw = (text or "").strip()
    if "```" not in raw:
        return raw
    parts = raw.split("```")
    if len(parts) < 3:
        return raw
    return re.sub(r"^\s*[a-zA-Z0-9_-]+\s*\n", "", parts[1].strip()).strip()


def command_lines(text: str) -> List[str]:
    lines = []
    for line in _strip_fences(text).splitlines():
        stripped = LIST_MARKER.sub("", line.strip()).strip()
        if stripped:
            lines.append(stripped)
    return lines


def _words(line: str) -> List[str]:
    """The command's words, one leading ``/`` removed."""
    stripped = line.strip()
    if stripped.startswith("/"):
        stripped = stripped[1:].lstrip()
    return stripped.split()


def _coordinate(token: str) -> Optional[int]:
    token = (token or "").strip()
    if not token or token.startswith(("~", "^")):
        return None
    try:
        return int(token)
    except ValueError:
        return None


@dataclass(frozen=True)
class Box:
    """An inclusive bounding box."""

    low: Position
    high: Position

    @classmethod
    def of(cls, a: Sequence[int], b: Sequence[int]) -> "Box":
        return cls(tuple(min(int(p), int(q)) for p, q in zip(a, b)), tuple(max(int(p), int(q)) for p, q in zip(a, b)))

    def contains(self, position: Sequence[int]) -> bool:
        return all(lo <= int(v) <= hi for lo, v, hi in zip(self.low, position, self.high))

    def cells(self) -> Iterable[Position]:
        """y, then x, then z (the original scan order)."""
        for y in range(self.low[1], self.high[1] + 1):
            for x in range(self.low[0], self.high[0] + 1):
                for z in range(self.low[2], self.high[2] + 1):
                    yield (x, y, z)


@dataclass
class Validation:
    accepted: List[str] = field(default_factory=list)
    rejected: List[Tuple[str, str]] = field(default_factory=list)  # (line, reason)


def validate(
    lines: Sequence[str], *, command: str, allowed_blocks: Iterable[str], box: Box, max_commands: int,
    resource_limits: Optional[Mapping[str, int]] = None,
) -> Validation:
    """Accepted (normalized) and rejected commands of one agent; ``command`` is "setblock" or "fill"."""
    allowed = {block_id(b) for b in allowed_blocks} | {"air"}
    budget = {block_id(k): int(v) for k, v in (resource_limits or {}).items() if int(v) >= 0}
    used: Dict[str, int] = {}
    out = Validation()
    for line in lines:
        if len(out.accepted) >= int(max_commands):
            out.rejected.append((line, f"exceeds max_commands={max_commands}"))
            continue
        parts = _words(line)
        if not parts:
            continue
        name = parts[0].lower()
        if command == "fill" and name == "kill":
            out.accepted.append(" ".join(["/kill", *parts[1:]]))
            continue
        if name != command:
            out.rejected.append((line, f"unsupported command: {name}"))
            continue
        result = _setblock(parts, allowed, box) if command == "setblock" else _fill(parts, allowed, box, budget, used)
        if result.startswith("/"):
            out.accepted.append(result)
        else:
            out.rejected.append((line, result))
    return out


def _setblock(parts: List[str], allowed: set, box: Box) -> str:
    if len(parts) < 5:
        return "setblock needs: /setblock x y z block"
    coords = [_coordinate(t) for t in parts[1:4]]
    if None in coords:
        return "setblock coords must be absolute integers (no ~)"
    block = block_id(parts[4])
    if block not in allowed:
        return f"block not allowed: {block}"
    if not box.contains(coords):
        return "setblock coord out of bbox"
    return f"/setblock {coords[0]} {coords[1]} {coords[2]} {block}"


def _fill(parts: List[str], allowed: set, box: Box, budget: Dict[str, int], used: Dict[str, int]) -> str:
    if len(parts) < 8:
        return "fill needs: /fill x1 y1 z1 x2 y2 z2 block"
    coords = [_coordinate(t) for t in parts[1:7]]
    if None in coords:
        return "fill coords must be absolute integers (no ~)"
    block = block_id(parts[7])
    if block not in allowed:
        return f"block not allowed: {block}"
    if not (box.contains(coords[:3]) and box.contains(coords[3:])):
        return "fill coord out of bbox"
    if len(parts) > 8:
        return "fill modes (replace/keep/...) not allowed"
    if budget and block not in AIR_BLOCKS and block in budget:
        volume = 1
        for a, b in zip(coords[:3], coords[3:]):
            volume *= abs(b - a) + 1
        if used.get(block, 0) + volume > budget[block]:
            return f"exceeds resource limit for {block}: {used.get(block, 0) + volume}>{budget[block]}"
        used[block] = used.get(block, 0) + volume
    return "/fill " + " ".join(str(c) for c in coords) + f" {block}"


def simulate(commands: Sequence[str], box: Box) -> Dict[Position, str]:
    """The box after the accepted ``commands`` (every cell present; unset cells are air)."""
    state: Dict[Position, str] = {}
    for text in commands:
        parts = _words(text)
        if not parts:
            continue
        name = parts[0].lower()
        if name == "setblock" and len(parts) >= 5:
            state[(int(parts[1]), int(parts[2]), int(parts[3]))] = block_id(parts[4])
        elif name == "fill" and len(parts) >= 8:
            low = [min(int(parts[i]), int(parts[i + 3])) for i in (1, 2, 3)]
            high = [max(int(parts[i]), int(parts[i + 3])) for i in (1, 2, 3)]
            for y in range(low[1], high[1] + 1):
                for x in range(low[0], high[0] + 1):
                    for z in range(low[2], high[2] + 1):
                        state[(x, y, z)] = block_id(parts[7])
    return {position: state.get(position, "air") for position in box.cells()}


def split_command_budget(total: int, num_agents: int) -> List[int]:
    """Per-agent ``max_commands``: ``max(1, total // n)`` each, the remainder to agent 1."""
    n = max(1, int(num_agents))
    per = max(1, int(total) // n)
    limits = [per] * n
    limits[0] += int(total) % n
    return limits


def has_kill(commands: Sequence[str]) -> bool:
    return any(" ".join(_words(c)).lower().startswith("kill") for c in commands)
