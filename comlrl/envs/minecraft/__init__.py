"""Minecraft building tasks of OpenMLRL/LLM_Collab_Minecraft: StrBuild and HouseBuild.

No game server: the agents' commands run on a voxel simulation (``commands.py``). Two agents,
four turns by default; agent 2's commands are applied after agent 1's. The task data ship with
comlrl (``data/minecraft``, MIT, see its NOTICE); ``load_dataset`` slices them with the original
configs' ``[:8]`` / ``[8:]``. Rewards return one value per joint response (the original scored only
the first joint response of a batch).
"""

from __future__ import annotations

import csv
import io
import json
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Dict, List, Optional

from comlrl.envs.base import DetailCache, Environment, EnvironmentSpec, RowIndex, batch_scorer, check_options, option, reward_from_details
from comlrl.envs.minecraft import commands, housebuild, strbuild
from comlrl.envs.minecraft.feedback import (
    HOUSEBUILD_MODES, INSTRUCTIONS_FIRST, MODE_ALIASES, STRBUILD_MODES, HouseBuildSim, MinecraftTransition, housebuild_feedback,
    strbuild_feedback,
)
from comlrl.envs.minecraft.prompts import housebuild_user, limits_text, per_agent, render, strbuild_user
from comlrl.envs.sources import slice_rows

__all__ = ["STRBUILD", "HOUSEBUILD", "StrBuildOptions", "HouseBuildOptions"]


def _check_common(options: Any, modes: tuple) -> None:
    check_options(options, modes=modes, aliases=MODE_ALIASES,
                  flags=("original_prompt", "previous_response", "use_chat_template", "chat_template_all_turns"))
    for name in ("block_agent1", "block_agent2"):
        value = getattr(options, name)
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(b, str) for b in value):
            raise ValueError(f"{name} (task.{name}) must be a list of block ids, got {value!r}.")
    if isinstance(options.max_commands, bool) or not isinstance(options.max_commands, int) or options.max_commands < 1:
        raise ValueError(f"max_commands (task.max_commands) must be an integer >= 1, got {options.max_commands!r}.")


HOUSE_BLOCKS = ["white_concrete", "obsidian", "stone_stairs", "stone_bricks", "planks", "air"]


@dataclass
class StrBuildOptions:
    """Options of StrBuild (``get_environment("strbuild", **options)``); defaults are the original config's."""

    num_turns: int = option(4, None, "Turns per episode (the run config's trainer section).")
    external_mode: str = option("position_feedback", "external.mode", "position_feedback, score_feedback or perfect_feedback.")
    original_prompt: bool = option(True, "external.original_prompt", "Repeat the first-turn instructions in later turns.")
    previous_response: bool = option(False, "external.previous_response", "Show each agent its previous commands.")
    block_agent1: List[str] = option(["oak_planks", "stone", "air"], "task.block_agent1", "Agent 1's blocks.")
    block_agent2: List[str] = option(["white_concrete", "obsidian", "air"], "task.block_agent2", "Agent 2's blocks.")
    max_commands: int = option(300, "task.max_commands", "Commands of both agents together (split evenly).")
    spacing: int = option(2, "dataset.spacing", "Empty columns between letters.")
    local_z: int = option(0, "dataset.local_z", "The wall's z.")
    provide_graph: bool = option(False, "prompt.provide_graph", "Show the target grid in the first prompt.")
    use_chat_template: bool = option(True, "prompt.use_chat_template", "Render first-turn prompts with each agent's chat template.")
    chat_template_all_turns: bool = option(False, "prompt.chat_template_all_turns", "Also render later turns' prompts with it (original: plain text).")
    tokenizer: Any = option(None, None, "One tokenizer or one per agent, for the chat template.")
    csv_path: Optional[str] = option(None, "dataset.csv_path", "A task file (columns string,difficulty) instead of the bundled one.")

    def __post_init__(self) -> None:
        _check_common(self, STRBUILD_MODES)
        for name in ("block_agent1", "block_agent2"):
            if not strbuild.palette(getattr(self, name)):
                raise ValueError(f"{name} (task.{name}) needs at least one block other than air.")


@dataclass
class HouseBuildOptions:
    """Options of HouseBuild (``get_environment("housebuild", seed=N, **options)``); defaults are the
    original config's."""

    num_turns: int = option(4, None, "Turns per episode (the run config's trainer section).")
    external_mode: str = option("score_feedback", "external.mode", "score_feedback, position_feedback, perfect_feedback, position_modification, rect_modification or resource_schedule.")
    original_prompt: bool = option(True, "external.original_prompt", "Repeat the first-turn instructions in later turns.")
    previous_response: bool = option(False, "external.previous_response", "Show each agent its previous commands.")
    lim: Optional[int] = option(20, "external.lim", "position_modification / rect_modification: at most this many suggestions per agent (None/0: all).")
    schedule_full_budget: bool = option(
        False, "external.schedule_full_budget",
        "resource_schedule: plan with each agent's whole budget (original: the budget minus the previous turn's fills, "
        "although every turn starts from an empty world).",
    )
    block_agent1: List[str] = option(HOUSE_BLOCKS, "task.block_agent1", "Agent 1's blocks (empty: the task's inventory).")
    block_agent2: List[str] = option(HOUSE_BLOCKS, "task.block_agent2", "Agent 2's blocks (empty: the task's inventory).")
    max_commands: int = option(600, "task.max_commands", "Commands of both agents together (split evenly).")
    limited_resource: bool = option(True, "task.limited_resource", "Per-agent block budgets.")
    player_hp: int = option(5, "task.player.hp", "The player's health.")
    spider_num: int = option(3, "task.spider.num", "Spiders per run.")
    spider_atk_low: int = option(1, "task.spider.atk_low", "Lowest spider attack.")
    spider_atk_high: int = option(3, "task.spider.atk_high", "Highest spider attack.")
    seed: Optional[int] = option(None, "seed", "Seed of the spider attacks (None: a random one, kept in env.seed).")
    include_air_rects: bool = option(False, "prompt.include_air_rects", "List air rectangles in the layers.")
    use_chat_template: bool = option(True, "prompt.use_chat_template", "Render first-turn prompts with each agent's chat template.")
    chat_template_all_turns: bool = option(False, "prompt.chat_template_all_turns", "Also render later turns' prompts with it (original: plain text).")
    tokenizer: Any = option(None, None, "One tokenizer or one per agent, for the chat template.")
    json_path: Optional[str] = option(None, "dataset.json_path", "A task file (the original JSON layout) instead of the bundled one.")

    def __post_init__(self) -> None:
        _check_common(self, HOUSEBUILD_MODES)
        for name in ("limited_resource", "schedule_full_budget"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        if self.external_mode == "resource_schedule" and not self.limited_resource:
            raise ValueError("external.mode=resource_schedule plans with the per-agent block budgets: set task.limited_resource=true, "
                             "or choose another external.mode.")
        for name in ("player_hp", "spider_num", "spider_atk_low", "spider_atk_high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
        if self.seed is None:
            self.seed = secrets.randbits(32)
        elif isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}.")

    def threat(self) -> housebuild.Threat:
        return housebuild.Threat.draw(seed=self.seed, player_hp=self.player_hp, spiders=self.spider_num,
                                      attack_low=self.spider_atk_low, attack_high=self.spider_atk_high)


# ----------------------------------------------------------------------------- task files


def _read(path: Optional[str], bundled: str) -> str:
    if path:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    return resources.files("comlrl.envs").joinpath("data", "minecraft", bundled).read_text(encoding="utf-8")


def strbuild_rows(options: StrBuildOptions) -> List[Dict[str, Any]]:
    rows = []
    for index, entry in enumerate(csv.DictReader(io.StringIO(_read(options.csv_path, "strbuild_tasks.csv"))), start=1):
        text = str(entry.get("string") or "").strip()
        if text:
            difficulty = str(entry.get("difficulty") or "").strip()
            rows.append(strbuild.make_row(index, text, int(difficulty) if difficulty.isdigit() else 0,
                                          spacing=options.spacing, local_z=options.local_z))
    return rows


def housebuild_rows(options: HouseBuildOptions) -> List[Dict[str, Any]]:
    data = json.loads(_read(options.json_path, "housebuild_tasks.json"))
    return [housebuild.make_row(index, task) for index, task in enumerate(data if isinstance(data, list) else [data], start=1)]


def _loader(name: str, all_rows: Callable[[], List[Dict[str, Any]]], rows: RowIndex):
    def load(*, split: str, offline: Optional[bool], hf_split: Optional[str], source: Optional[str]):
        from datasets import Dataset

        selected = slice_rows(all_rows(), hf_split or ("[:8]" if split == "train" else "[8:]"))
        rows.add(selected)
        return Dataset.from_list(selected)

    return load


def _formatters(user: Callable[[Dict[str, Any], int], str], options: Any) -> List[Callable[..., str]]:
    tokenizers = per_agent(options.tokenizer, 2)

    def make(agent: int) -> Callable[..., str]:
        def format_prompt(row: Dict[str, Any], external_prompts: Optional[str] = None) -> str:
            if external_prompts is not None:
                if not options.chat_template_all_turns:
                    return external_prompts
                return render(external_prompts, tokenizers[agent], True)
            return render(user(row, agent), tokenizers[agent], options.use_chat_template)

        format_prompt.__name__ = f"agent_{agent + 1}_formatter"
        return format_prompt

    return [make(0), make(1)]


def _environment(name: str, options: Any, rows: RowIndex, loader, formatters, score_one, transition) -> Environment:
    def score_many(joints: List[tuple], batch_rows: List[Any]) -> List[Dict[str, float]]:
        rows.add(batch_rows)
        return [score_one(row, list(joint)) for joint, row in zip(joints, batch_rows)]

    def row_key(row: Any) -> str:
        return json.dumps(row, sort_keys=True, default=str)

    details = batch_scorer(env=name, num_agents=2, score_many=score_many, row_key=row_key, cache=DetailCache())
    return Environment(
        name=name, num_agents=2, num_turns=options.num_turns, formatters=formatters, reward_func=reward_from_details(details),
        reward_details=details, external_transition=transition if options.num_turns > 1 else None, options=options, loader=loader,
        rows=rows,
    )


# ----------------------------------------------------------------------------- StrBuild


def build_strbuild(options: StrBuildOptions) -> Environment:
    rows = RowIndex("strbuild")
    blocks = [list(options.block_agent1), list(options.block_agent2)]
    palettes = [strbuild.palette(b) for b in blocks]
    budget = commands.split_command_budget(options.max_commands, 2)

    def world_of(row: Dict[str, Any], completions: List[str]):
        task = strbuild.task_of(row)
        accepted = []
        for agent, text in enumerate(completions):
            accepted += commands.validate(commands.command_lines(text), command="setblock", allowed_blocks=blocks[agent],
                                          box=task.box, max_commands=budget[agent]).accepted
        return commands.simulate(accepted, task.box)

    def score_one(row: Dict[str, Any], completions: List[str]) -> Dict[str, float]:
        return strbuild.score(strbuild.task_of(row), world_of(row, completions), palettes)

    def user(row: Dict[str, Any], agent: int) -> str:
        task = strbuild.task_of(row)
        return strbuild_user(agent, rows=task.rows, box_from=task.box_from, box_to=task.box_to, blocks=blocks[agent],
                             provide_graph=options.provide_graph)

    feedback = strbuild_feedback(options.external_mode, palettes=palettes, blocks=blocks, limits=budget, world_of=world_of,
                                 reward_of=lambda row, c: score_one(row, c)["reward"])
    transition = MinecraftTransition(rows, feedback, user, options.original_prompt, options.previous_response)
    return _environment("strbuild", options, rows, _loader("strbuild", lambda: strbuild_rows(options), rows),
                        _formatters(user, options), score_one, transition)


# ----------------------------------------------------------------------------- HouseBuild


def build_housebuild(options: HouseBuildOptions) -> Environment:
    rows = RowIndex("housebuild")
    threat = options.threat()
    budget = commands.split_command_budget(options.max_commands, 2)
    overrides = [list(options.block_agent1), list(options.block_agent2)]

    def blocks_of(row: Dict[str, Any], agent: int) -> List[str]:
        chosen = overrides[agent] or [block for _, block in housebuild.task_of(row).inventory]
        return list(dict.fromkeys(b.strip() for b in chosen if b.strip()))

    def accepted_by_agent(row: Dict[str, Any], completions: List[str]) -> List[List[str]]:
        task = housebuild.task_of(row)
        limits = housebuild.resource_limits(task, 2) if options.limited_resource else None
        return [commands.validate(commands.command_lines(text), command="fill", allowed_blocks=blocks_of(row, agent), box=task.box,
                                  max_commands=budget[agent], resource_limits=limits).accepted for agent, text in enumerate(completions)]

    def world_of(row: Dict[str, Any], completions: List[str]):
        return commands.simulate([c for cs in accepted_by_agent(row, completions) for c in cs], housebuild.task_of(row).box)

    def score_one(row: Dict[str, Any], completions: List[str]) -> Dict[str, float]:
        task = housebuild.task_of(row)
        accepted = accepted_by_agent(row, completions)
        world = commands.simulate([c for cs in accepted for c in cs], task.box)
        return housebuild.score(task, world, threat, killed=any(commands.has_kill(cs) for cs in accepted))

    def budgets_of(row: Dict[str, Any]) -> Dict[str, int]:
        return housebuild.resource_limits(housebuild.task_of(row), 2) if options.limited_resource else {}

    def limits_of(row: Dict[str, Any]) -> str:
        if not options.limited_resource:
            return ""
        return limits_text(budgets_of(row), [commands.block_id(b) for _, b in housebuild.task_of(row).inventory])

    def user(row: Dict[str, Any], agent: int) -> str:
        task = housebuild.task_of(row)
        return housebuild_user(agent, layers=housebuild.layers_text(task, options.include_air_rects), box_from=task.box_from,
                               box_to=task.box_to, blocks=blocks_of(row, agent), threat=threat, limits_text=limits_of(row))

    sim = HouseBuildSim(blocks_of=blocks_of, accepted_of=accepted_by_agent, world_of=world_of,
                        reward_of=lambda row, c: score_one(row, c)["reward"], limits_text=limits_of, resource_limits=budgets_of)
    feedback = housebuild_feedback(options.external_mode, sim=sim, limits=budget, lim=options.lim, original_prompt=options.original_prompt,
                                   full_budget=options.schedule_full_budget)
    transition = MinecraftTransition(rows, feedback, user, options.original_prompt, options.previous_response,
                                     instructions_first=options.external_mode in INSTRUCTIONS_FIRST)
    env = _environment("housebuild", options, rows, _loader("housebuild", lambda: housebuild_rows(options), rows),
                       _formatters(user, options), score_one, transition)
    env.seed = options.seed
    env.threat = threat
    return env


STRBUILD = EnvironmentSpec(
    name="strbuild", options_cls=StrBuildOptions, build=build_strbuild,
    description="Spell a word as a wall of /setblock blocks (10 words; 2 agents, 4 turns, max reward 2).",
)
HOUSEBUILD = EnvironmentSpec(
    name="housebuild", options_cls=HouseBuildOptions, build=build_housebuild,
    description="Build a house from y-slices with /fill under resource limits and spider attacks (10 tasks; max 1).",
)
