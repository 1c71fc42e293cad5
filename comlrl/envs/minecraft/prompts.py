"""First-turn prompts of the Minecraft tasks (comlrl's wording of the original instructions).

Each prompt is a system text and a user text. With a chat template (``use_chat_template`` and a
tokenizer that has one) they become the tokenizer's chat prompt; otherwise ``system + "\\n\\n" +
user``, as the original does without a template.
"""

from __future__ import annotations

import json
from typing import Any, List, Mapping, Optional, Sequence

SYSTEM = (
    "You are a Minecraft building agent.\n"
    "Reply with Minecraft commands only: no markdown, no code fences, no other text.\n"
    "Any text that is not a command is invalid."
)


def block_lines(blocks: Sequence[str]) -> str:
    return "\n".join(f"- {block}" for block in blocks)


def compact(values: Sequence[int]) -> str:
    """``[0,0,0]``: a list without spaces, as the original writes coordinates."""
    return json.dumps([int(v) for v in values], separators=(",", ":"))


def _team_intro(agent: int) -> List[str]:
    lines = [f"You are agent {agent + 1} of a two-agent Minecraft building team; you place some of the blocks of the final build."]
    if agent == 1:
        lines.append("You write after agent 1, so your commands overwrite agent 1's results.")
    return lines


def strbuild_user(agent: int, *, rows: Sequence[str], box_from, box_to, blocks: Sequence[str], provide_graph: bool) -> str:
    """Agent ``agent``'s StrBuild instructions; without ``provide_graph`` nothing says where the
    letters are (the coordinates come with the later turns' feedback), as in the original."""
    lines = _team_intro(agent)
    if provide_graph:
        lines += ["", "The target is a grid of '#' (block) and '.' (air) matching the bounding box.",
                  "Write /setblock commands for some of the '#' positions.", "", "Target grid (rows from the top):", *rows]
    lines += [
        "", "World bounding box (inclusive):", f"- from: {compact(box_from)}", f"- to:   {compact(box_to)}", "",
        "Coordinates (absolute):", "- (min_x, min_y, min_z) is bbox.from and (max_x, max_y, max_z) is bbox.to.",
        "- x grows from min_x to max_x, left to right.", "- y grows from min_y to max_y, bottom to top.",
        "- z is constant (min_z == max_z).", "", "Blocks you may use (only these):", block_lines(blocks), "",
        "Rules:", "- Output only Minecraft commands, one per line.", "- The only command is /setblock.",
        "- Absolute integer coordinates only (no ~).",
    ]
    if provide_graph:
        lines.append("- Place blocks only at '#' positions; leave '.' positions as air.")
    lines += ["- Blocks that share a side must not have the same texture.", "- Every coordinate must lie inside the bounding box.",
              "Format: /setblock <x> <y> <z> <block>"]
    return "\n".join(lines)


def housebuild_user(agent: int, *, layers: str, box_from, box_to, blocks: Sequence[str], threat: Any, limits_text: str) -> str:
    """Agent ``agent``'s HouseBuild instructions: the layers as rectangles, the box, the threat."""
    attacks = "[" + ", ".join(str(a) for a in threat.attacks) + "]" if threat is not None and threat.attacks else "[]"
    spiders = len(threat.attacks) if threat is not None else 0
    hp = threat.player_hp if threat is not None else 0
    damage = threat.damage if threat is not None else 0
    lines = _team_intro(agent) + [
        "", "Task: build the 3-D structure given as horizontal slices along the y axis.", "",
        "Blocks you may use (only these):", block_lines(blocks), "",
        "Layers (ascending world y), each a set of rectangles in world (x, z) coordinates:",
        "- Format: y=Y: {(x1, Y, z1, x2, Y, z2 block_id), ...}", layers, "",
        "World bounding box (inclusive):", f"- from: {compact(box_from)}", f"- to:   {compact(box_to)}", "",
        f"Threat check: {spiders} spiders are nearby and you have {hp} HP. Spider attacks: {attacks}, total damage "
        f"dmg={damage}. To kill them, output exactly one line: /kill. Every other line must be a building command.", "",
        "Rules:", "- Output only Minecraft commands, one per line.", "- Allowed commands: /fill and /kill.",
        "- Fill format: /fill x1 y1 z1 x2 y2 z2 block", "- Absolute integer coordinates only (no ~).",
        "- Use only the listed blocks.", "- Every coordinate must lie inside the bounding box.",
    ]
    text = "\n".join(lines)
    return text + "\n\n" + limits_text if limits_text else text


def render(user: str, tokenizer: Optional[Any], use_chat_template: bool) -> str:
    """The prompt string of a system + user text (see the module docstring)."""
    if use_chat_template and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return SYSTEM + "\n\n" + user


def per_agent(tokenizer: Any, count: int) -> List[Optional[Any]]:
    """One tokenizer per agent from None, one tokenizer, or a list of them."""
    if tokenizer is None or not isinstance(tokenizer, (list, tuple)):
        return [tokenizer] * count
    if len(tokenizer) != count:
        raise ValueError(f"tokenizer: give one tokenizer or a list of {count}, got a list of {len(tokenizer)}.")
    return list(tokenizer)


def limits_text(limits: Mapping[str, int], inventory_blocks: Sequence[str]) -> str:
    """The per-agent resource limits, in inventory order (air is unlimited)."""
    lines = [f"- {block}: {limits[block]}" for block in inventory_blocks if block in limits]
    return "Resource limits per agent (air unlimited):\n" + "\n".join(lines) if lines else ""
