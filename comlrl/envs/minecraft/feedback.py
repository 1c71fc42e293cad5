"""Multi-turn feedback of the Minecraft tasks: the next prompt for each agent.

Every next prompt is plain text (as in the original): the system text, the mode's feedback, then
(``original_prompt``) the agent's first-turn instructions and (``previous_response``) its previous
commands. The world is rebuilt from scratch every turn: a turn's reward scores that turn's
commands alone (the reward sees no history), as in the original.

StrBuild modes: ``position_feedback`` (every letter cell, asks each agent for about half, no
adjacent picks), ``score_feedback`` (the previous reward), ``perfect_feedback`` (the cells each
agent got wrong under the target plan; stray blocks go to the last agent).
HouseBuild modes: ``score_feedback``, ``position_feedback`` (every non-air target cell and its
block), ``perfect_feedback`` (the wrong cells with their blocks, to the agent whose palette alone
has the block, else alternately), ``position_modification`` (the first ``lim`` wrong cells, by
ascending y, as suggestions to both), ``rect_modification`` (each agent's accepted commands and
the target rectangles covering its layers' wrong cells) and ``resource_schedule`` (each agent's
accepted commands, its block budgets and a greedy plan of target rectangles that fit them); the
last two are computed in ``repair.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from comlrl.envs.base import RowIndex
from comlrl.envs.minecraft import housebuild, repair, strbuild
from comlrl.envs.minecraft.commands import block_id, is_air
from comlrl.envs.minecraft.prompts import SYSTEM, block_lines

STRBUILD_MODES = ("position_feedback", "score_feedback", "perfect_feedback")
HOUSEBUILD_MODES = ("score_feedback", "position_feedback", "perfect_feedback", "position_modification", "rect_modification",
                    "resource_schedule")
INSTRUCTIONS_FIRST = ("position_modification", "rect_modification", "resource_schedule")
"""HouseBuild modes whose next prompt puts the first-turn instructions before the feedback."""
MODE_ALIASES = {
    "position-feedback": "position_feedback", "score-feedback": "score_feedback", "score": "score_feedback",
    "perfect-feedback": "perfect_feedback", "feedback": "perfect_feedback", "position-modification": "position_modification",
    "rect-modification": "rect_modification", "resource-schedule": "resource_schedule",
}


def top_down(points: Sequence[Any], position: Callable[[Any], Tuple[int, int, int]] = lambda p: p) -> List[Any]:
    """Top rows first, then left to right (the original listing order)."""
    return sorted(points, key=lambda p: (-position(p)[1], position(p)[0], position(p)[2]))


def first(cell: Tuple[Any, str]) -> Tuple[int, int, int]:
    return cell[0]


def _cells(points: Sequence[Tuple[int, int, int]]) -> str:
    return "\n".join(f"- ({x}, {y}, {z})" for x, y, z in points) if points else "- (none)"


def _cells_with_blocks(points: Sequence[Tuple[Tuple[int, int, int], str]]) -> str:
    return "\n".join(f"- ({x}, {y}, {z}) = {block}" for (x, y, z), block in points) if points else "- (none)"


@dataclass
class Joint:
    """What a transition knows about the previous joint response."""

    row: Dict[str, Any]
    completions: List[str]
    turn: int  # the number of the turn that comes next


@dataclass
class MinecraftTransition:
    """The ``external_transition`` of a Minecraft environment (CoMLRL's interface).

    ``feedback(joint) -> [lines per agent]``; ``base_prompt(row, agent) -> first-turn user text``.
    """

    rows: RowIndex
    feedback: Callable[[Joint], List[List[str]]]
    base_prompt: Callable[[Dict[str, Any], int], str]
    original_prompt: bool = True
    previous_response: bool = False
    instructions_first: bool = False
    """Put the first-turn instructions before the feedback (position_modification) instead of after."""

    def __call__(self, prompt: str, agent_completions: Sequence[str], num_agents: int = 2,
                 prompt_history_per_agent: Optional[List[List[str]]] = None, **_: Any) -> List[str]:
        if num_agents != 2 or len(agent_completions) != 2:
            raise ValueError(f"The Minecraft transition takes the completions of 2 agents, got {len(agent_completions)}.")
        history = prompt_history_per_agent or [[]]
        joint = Joint(self.rows.get(prompt), list(agent_completions), len(history[0] or []) + 1)
        prompts = []
        for agent, lines in enumerate(self.feedback(joint)):
            base = [self.base_prompt(joint.row, agent), ""] if self.original_prompt else []
            parts = [SYSTEM, "", *base, *lines] if self.instructions_first else [SYSTEM, "", *lines, "", *base]
            previous = agent_completions[agent].strip()
            if self.previous_response and previous:
                parts += ["", "Your previous commands:", previous]
            prompts.append("\n".join(parts).strip())
        return prompts


# ----------------------------------------------------------------------------- StrBuild


def strbuild_feedback(mode: str, *, palettes: Sequence[Sequence[str]], blocks: Sequence[Sequence[str]], limits: Sequence[int],
                      world_of: Callable[[Dict[str, Any], List[str]], Any], reward_of: Callable[[Dict[str, Any], List[str]], float]):
    """``feedback(joint)`` of a StrBuild mode; ``world_of(row, completions)`` simulates a joint response."""

    def position(joint: Joint) -> List[List[str]]:
        cells = top_down(strbuild.target_positions(strbuild.task_of(joint.row)))
        half = max(1, len(cells) // 2) if cells else 0
        return [[
            "Position feedback (choose a subset):", f"- Turn: {joint.turn}", "- Coordinates are absolute (x, y, z).",
            "- Output /setblock commands only (no markdown).", f"- Pick about half of the positions (about {half}).",
            "- Avoid picking two positions that share a side.", f"- Max commands allowed: {limits[agent]}", "",
            "All letter positions:", _cells(cells), "", "Blocks you may use (only these):", block_lines(blocks[agent]), "",
            "Format: /setblock <x> <y> <z> <block>",
        ] for agent in range(2)]

    def score(joint: Joint) -> List[List[str]]:
        reward = reward_of(joint.row, joint.completions)
        return [["Score feedback:", f"- Turn: {joint.turn}", f"- Previous reward: {reward:.4f}"] for _ in range(2)]

    def perfect(joint: Joint) -> List[List[str]]:
        task = strbuild.task_of(joint.row)
        world = world_of(joint.row, joint.completions)
        expected, owners = strbuild.target_assignment(task, palettes)
        wrong: Dict[int, List] = {0: [], 1: []}
        for position, block in expected.items():
            if world.get(position, "air") != block:
                wrong[owners.get(position, 0)].append(position)
        extra = [p for p, block in world.items() if p not in expected and not is_air(block)]
        out = []
        for agent in range(2):
            lines = ["Feedback (coordinate edits):", f"- Turn: {joint.turn}", "- Coordinates are absolute (x, y, z).",
                     "- Output /setblock commands only (no markdown).", "- Fix only the listed positions.", "",
                     "Place your correct texture at:", _cells(top_down(wrong[agent]))]
            if agent == 1:
                lines += ["", "Remove the stray blocks (set air) at:", _cells(top_down(extra))]
            out.append(lines)
        return out

    return {"position_feedback": position, "score_feedback": score, "perfect_feedback": perfect}[mode]


# ----------------------------------------------------------------------------- HouseBuild


@dataclass
class HouseBuildSim:
    """What the HouseBuild feedback needs of the environment (functions of a row and a joint response)."""

    blocks_of: Callable[[Dict[str, Any], int], List[str]]
    """An agent's allowed blocks."""
    accepted_of: Callable[[Dict[str, Any], List[str]], List[List[str]]]
    """Each agent's accepted commands."""
    world_of: Callable[[Dict[str, Any], List[str]], Any]
    reward_of: Callable[[Dict[str, Any], List[str]], float]
    limits_text: Callable[[Dict[str, Any]], str]
    """The per-agent resource limits text ("" without limits)."""
    resource_limits: Callable[[Dict[str, Any]], Dict[str, int]]


def _commands(lines: Sequence[str]) -> str:
    return "\n".join(f"- {line}" for line in lines) if lines else "- (none)"


class HouseBuildFeedback:
    """The next prompts of the HouseBuild modes (see the module docstring); one method per mode."""

    QUIET = "- Do not output any text other than commands."

    def __init__(self, *, sim: HouseBuildSim, limits: Sequence[int], lim: Optional[int], original_prompt: bool,
                 full_budget: bool = False):
        self.sim, self.limits, self.lim = sim, limits, lim
        self.original_prompt, self.full_budget = original_prompt, full_budget

    def for_mode(self, mode: str) -> Callable[[Joint], List[List[str]]]:
        return {"score_feedback": self.score, "position_feedback": self.position, "perfect_feedback": self.perfect,
                "position_modification": self.modification, "rect_modification": self.rects,
                "resource_schedule": self.schedule}[mode]

    def head(self, row: Dict[str, Any]) -> List[str]:
        """The limits text, when the first-turn instructions (which carry it) are not repeated."""
        limits_text = self.sim.limits_text(row)
        return [limits_text, ""] if limits_text and not self.original_prompt else []

    def wrong_cells(self, joint: Joint):
        expected = housebuild.expected_blocks(housebuild.task_of(joint.row))
        world = self.sim.world_of(joint.row, joint.completions)
        return [(p, block) for p, block in expected.items() if world.get(p, "air") != block]

    def score(self, joint: Joint) -> List[List[str]]:
        reward = self.sim.reward_of(joint.row, joint.completions)
        return [["Score feedback:", f"- Turn: {joint.turn}", f"- Previous reward: {reward:.4f}", self.QUIET] for _ in range(2)]

    def position(self, joint: Joint) -> List[List[str]]:
        expected = housebuild.expected_blocks(housebuild.task_of(joint.row))
        cells = top_down([(p, b) for p, b in expected.items() if not is_air(b)], first)
        half = max(1, len(cells) // 2) if cells else 0
        return [[
            "Position feedback (choose a subset):", f"- Turn: {joint.turn}", "- Coordinates are absolute (x, y, z).",
            "- Output /fill commands only (no markdown).", self.QUIET, f"- Pick about half of the positions (about {half}).",
            "- Use: /fill x y z x y z block", f"- Max commands allowed: {self.limits[agent]}", "", "All target positions:",
            _cells_with_blocks(cells), "", "Blocks you may use (only these):", block_lines(self.sim.blocks_of(joint.row, agent)), "",
            "Format: /fill <x> <y> <z> <x> <y> <z> <block>",
        ] for agent in range(2)]

    def perfect(self, joint: Joint) -> List[List[str]]:
        wrong = top_down(self.wrong_cells(joint), first)
        allowed = [set(self.sim.blocks_of(joint.row, agent)) for agent in range(2)]
        mine: Dict[int, List] = {0: [], 1: []}
        for index, (position, block) in enumerate(wrong):
            only = [agent for agent in range(2) if block in allowed[agent] and block not in allowed[1 - agent]]
            mine[only[0] if only else index % 2].append((position, block))
        out = []
        for agent in range(2):
            lines = self.head(joint.row) + [
                "Feedback (coordinate edits):", f"- Turn: {joint.turn}", "- Coordinates are absolute (x, y, z).",
                "- Output /fill commands only (no markdown).", self.QUIET, "- Fix only the listed positions.",
                "- Use: /fill x y z x y z block", "", "Set these blocks:", _cells_with_blocks(mine[agent])]
            if agent == 1:
                lines += ["", "Remove the stray blocks (set air) at:", "- (none)"]
            out.append(lines)
        return out

    def modification(self, joint: Joint) -> List[List[str]]:
        wrong = sorted(self.wrong_cells(joint), key=lambda c: (c[0][1], c[0][0], c[0][2]))
        if self.lim is not None and self.lim > 0:
            wrong = wrong[: int(self.lim)]
        text = "\n".join(f"({x} {y} {z} {block})" for (x, y, z), block in wrong) if wrong else "(none)"
        lines = self.head(joint.row) + ["Do not output any text other than commands.", "", "Suggested fixes (use them to correct errors):", text]
        return [list(lines) for _ in range(2)]

    def rects(self, joint: Joint) -> List[List[str]]:
        accepted = self.sim.accepted_of(joint.row, joint.completions)
        wrong = repair.mismatch_rects(housebuild.task_of(joint.row), self.sim.world_of(joint.row, joint.completions))
        return [self.head(joint.row) + [
            "Do not output any text other than commands.", "", "Each turn starts again from an empty world (all air).",
            "Your accepted commands of the previous turn:", _commands(accepted[agent]), "",
            "Target rectangles to rebuild where the house was wrong (y: x1, z1, x2, z2 block):",
            repair.rect_lines(repair.rects_for_agent(wrong, agent, self.lim)),
        ] for agent in range(2)]

    def schedule(self, joint: Joint) -> List[List[str]]:
        task = housebuild.task_of(joint.row)
        accepted = self.sim.accepted_of(joint.row, joint.completions)
        budgets = self.sim.resource_limits(joint.row)
        out = []
        for agent in range(2):
            plan = repair.schedule(task, accepted[agent], self.sim.blocks_of(joint.row, agent), budgets, self.full_budget)
            left = [f"- {block}: {max(0, plan.remaining.get(block, 0))}" for block in (block_id(b) for _, b in task.inventory)
                    if not is_air(block) and block in budgets]
            out.append(self.head(joint.row) + [
                "Do not output any text other than commands.", "", "Your accepted commands of the previous turn:",
                _commands(accepted[agent]), "",
                "Blocks left after " + ("" if self.full_budget else "the previous turn's commands and ")
                + "the full rectangles below (air unlimited):", "\n".join(left) or "(none)", "",
                "Target rectangles to build next, largest first (y: x1, z1, x2, z2 block):", repair.rect_lines(plan.rects),
            ])
        return out


def housebuild_feedback(mode: str, *, sim: HouseBuildSim, limits: Sequence[int], lim: Optional[int], original_prompt: bool,
                        full_budget: bool = False) -> Callable[[Joint], List[List[str]]]:
    """``feedback(joint)`` of a HouseBuild mode (see the module docstring)."""
    return HouseBuildFeedback(sim=sim, limits=limits, lim=lim, original_prompt=original_prompt, full_budget=full_budget).for_mode(mode)
