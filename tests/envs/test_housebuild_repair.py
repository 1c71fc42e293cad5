"""HouseBuild's ``rect_modification`` and ``resource_schedule`` feedback, hand-worked on a tiny house.

The house (x across a row, z down the rows, 3 x 2 cells per layer, y = 0..3; C white_concrete,
O obsidian, A air):

    y=0  CCC    y=1  COC    y=2  OOO    y=3  AAA
         CCC         AAA         OOO         CCA

Its rectangles (x1, z1, x2, z2 block): y=0 (0,0,2,1 C); y=1 (0,0,0,0 C) (1,0,1,0 O) (2,0,2,0 C)
(0,1,2,1 A); y=2 (0,0,2,1 O); y=3 (0,0,2,0 A) (0,1,1,1 C) (2,1,2,1 A). Cells: C 6 + 2 + 2 = 10,
O 1 + 6 = 7, so the per-agent budgets are C ceil(10/2) + floor(10/4) = 7, O ceil(7/2) + floor(7/4) = 5.
"""

from __future__ import annotations

import json

import pytest

from comlrl.envs import get_environment
from comlrl.envs.minecraft import commands, housebuild, repair

TASK = {
    "task_id": "tiny_house",
    "inventory": {"C": "white_concrete", "O": "obsidian", "A": "air"},
    "count": {"C": 10, "O": 7, "A": 7},
    "target_spec": {"type": "y_layers", "size": [3, 4, 2], "layers": [
        {"y": 0, "rows": ["CCC", "CCC"]}, {"y": 1, "rows": ["COC", "AAA"]},
        {"y": 2, "rows": ["OOO", "OOO"]}, {"y": 3, "rows": ["AAA", "CCA"]},
    ]},
    "bbox": {"from": [0, 0, 0], "to": [2, 3, 1]},
}
AGENT_1 = "/fill 0 0 0 2 0 1 white_concrete"  # layer 0, all right: 6 of white_concrete's 7
AGENT_2 = "/fill 0 2 0 2 2 0 obsidian\n/fill 0 3 1 0 3 1 obsidian"  # layer 2's first row; a wrong block at (0, 3, 1): 4 of 5
C, O = "white_concrete", "obsidian"


@pytest.fixture
def task():
    return housebuild.task_of(TASK)


def world(task, *texts):
    accepted = []
    for text in texts:
        accepted += commands.validate(commands.command_lines(text), command="fill", allowed_blocks=[C, O, "air"], box=task.box,
                                      max_commands=300, resource_limits=housebuild.resource_limits(task, 2)).accepted
    return commands.simulate(accepted, task.box)


def test_budgets(task):
    assert housebuild.resource_limits(task, 2) == {C: 7, O: 5}


def test_mismatch_rectangles_and_the_layer_split(task):
    rects = repair.mismatch_rects(task, world(task, AGENT_1, AGENT_2))
    # wrong cells: y=1 (0,0) C, (1,0) O, (2,0) C (nothing built there); y=2 the row z=1 (O); y=3 (0,1) obsidian and
    # (1,1) air where C belongs. Each is covered by its layer's rectangle of the target block:
    assert rects == [(1, 0, 0, 0, 0, C), (1, 1, 0, 1, 0, O), (1, 2, 0, 2, 0, C), (2, 0, 0, 2, 1, O), (3, 0, 1, 1, 1, C)]
    # agent 1 fixes y <= 2, agent 2 y >= 2 (y = 2 goes to both); lim keeps the first ones
    assert repair.rects_for_agent(rects, 0, None) == rects[:4]
    assert repair.rects_for_agent(rects, 1, 0) == rects[3:]
    assert repair.rects_for_agent(rects, 0, 2) == rects[:2]
    # a stray block where air belongs is covered by the air rectangle
    stray = repair.mismatch_rects(task, world(task, "/fill 2 3 0 2 3 0 obsidian"))
    assert (3, 0, 0, 2, 0, "air") in stray


def test_best_subrect():
    # width 3, depth 2, budget 4: w=3 -> d=min(2, 4//3=1)=1, area 3; w=2 -> d=min(2, 2)=2, area 4 = budget: stop
    assert repair.best_subrect(0, 0, 2, 1, 4) == (0, 0, 1, 1, 4)
    # a 5 x 1 strip, budget 3: w=5, 4 -> d=0; w=3 -> area 3
    assert repair.best_subrect(10, 7, 14, 7, 3) == (10, 7, 12, 7, 3)
    assert repair.best_subrect(1, 1, 3, 3, 0) == (1, 1, 1, 1, 0)
    # budget above the area: the whole rectangle (w=3, d=min(2, 100//3)=2)
    assert repair.best_subrect(0, 0, 2, 1, 100) == (0, 0, 2, 1, 6)


def test_filled_cells():
    assert repair.filled_cells(["/fill 0 0 0 2 0 1 white_concrete", "/fill 2 2 2 0 2 2 air", "/kill", "/fill 1 1 1 1 1 1 obsidian"]) == {
        C: 6, "air": 3, O: 1}


def test_schedule_agent_1(task):
    plan = repair.schedule(task, [AGENT_1], [C, O, "air"], housebuild.resource_limits(task, 2))
    # budgets left after the previous turn: C 7 - 6 = 1, O 5. Candidates, largest first: y0 C (6), y2 O (6), y3 C (2), then
    # the 1-cell y1 rectangles (0,0 C), (1,0 O), (2,0 C). Full fits: y1 (0,0 C) -> C 0, y1 (1,0 O) -> O 4.
    # Partial: y2 O with 4 left -> the 2 x 2 corner (0,0)-(1,1); y0 C, y3 C and y1 (2,0 C) have no C left.
    assert plan.rects == [(1, 0, 0, 0, 0, C), (1, 1, 0, 1, 0, O), (2, 0, 0, 1, 1, O)]
    assert plan.remaining == {C: 0, O: 4}  # after the full rectangles; the partial one is not deducted


def test_schedule_agent_2_and_the_full_budget_option(task):
    limits = housebuild.resource_limits(task, 2)
    accepted = commands.command_lines(AGENT_2)
    plan = repair.schedule(task, accepted, [C, O, "air"], limits)
    # O 5 - 4 = 1, C 7: y0 C (6) -> C 1; y2 O (6) no; y3 C (2) no; y1 (0,0 C) -> C 0; y1 (1,0 O) -> O 0; nothing left for a partial
    assert plan.rects == [(0, 0, 0, 2, 1, C), (1, 0, 0, 0, 0, C), (1, 1, 0, 1, 0, O)] and plan.remaining == {C: 0, O: 0}
    # schedule_full_budget: agent 1 plans with C 7, O 5: y0 C -> C 1; y1 (0,0 C) -> C 0; y1 (1,0 O) -> O 4; partial y2 O (2 x 2)
    plan = repair.schedule(task, [AGENT_1], [C, O, "air"], limits, full_budget=True)
    assert plan.rects == [(0, 0, 0, 2, 1, C), (1, 0, 0, 0, 0, C), (1, 1, 0, 1, 0, O), (2, 0, 0, 1, 1, O)]
    # an agent without obsidian gets no obsidian rectangle
    assert all(r[5] == C for r in repair.schedule(task, [], [C, "air"], limits).rects)


# ----------------------------------------------------------------------------- through the environment


def env_for(tmp_path, mode, **options):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([TASK]))
    env = get_environment("housebuild", external_mode=mode, json_path=str(path), seed=0, **options)
    row = env.load_dataset("train")[0]
    return env, row


def test_rect_modification_prompts(tmp_path):
    env, row = env_for(tmp_path, "rect_modification", lim=3)
    first, second = env.external_transition(prompt=row["prompt"], agent_completions=[AGENT_1, AGENT_2], num_agents=2)
    assert first.index("You are agent 1") < first.index("Target rectangles")  # instructions first, as in the original
    assert "Your accepted commands of the previous turn:\n- /fill 0 0 0 2 0 1 white_concrete\n" in first
    assert first.endswith("(y: x1, z1, x2, z2 block):\ny=1: (0, 0, 0, 0 white_concrete)\ny=1: (1, 0, 1, 0 obsidian)\n"
                          "y=1: (2, 0, 2, 0 white_concrete)")
    assert second.endswith("y=2: (0, 0, 2, 1 obsidian)\ny=3: (0, 1, 1, 1 white_concrete)")
    assert "- /fill 0 2 0 2 2 0 obsidian\n- /fill 0 3 1 0 3 1 obsidian" in second
    # without the first-turn instructions the limits text comes first
    env, row = env_for(tmp_path, "rect_modification", original_prompt=False)
    first, _ = env.external_transition(prompt=row["prompt"], agent_completions=["", ""], num_agents=2)
    assert "Resource limits per agent (air unlimited):\n- white_concrete: 7\n- obsidian: 5" in first and "You are agent" not in first
    assert "Your accepted commands of the previous turn:\n- (none)" in first


def test_resource_schedule_prompts(tmp_path):
    env, row = env_for(tmp_path, "resource_schedule", previous_response=True)
    first, second = env.external_transition(prompt=row["prompt"], agent_completions=[AGENT_1, AGENT_2], num_agents=2)
    assert "(air unlimited):\n- white_concrete: 0\n- obsidian: 4\n" in first
    assert ("largest first (y: x1, z1, x2, z2 block):\ny=1: (0, 0, 0, 0 white_concrete)\ny=1: (1, 0, 1, 0 obsidian)\n"
            "y=2: (0, 0, 1, 1 obsidian)") in first
    assert "- white_concrete: 0\n- obsidian: 0\n" in second and "y=0: (0, 0, 2, 1 white_concrete)" in second
    assert second.endswith("Your previous commands:\n" + AGENT_2)
    env, row = env_for(tmp_path, "resource_schedule", schedule_full_budget=True)
    first, _ = env.external_transition(prompt=row["prompt"], agent_completions=[AGENT_1, ""], num_agents=2)
    assert "Blocks left after the full rectangles below" in first and "y=0: (0, 0, 2, 1 white_concrete)" in first


def test_resource_schedule_needs_limited_resources():
    with pytest.raises(ValueError, match="resource_schedule.*task.limited_resource=true"):
        get_environment("housebuild", external_mode="resource_schedule", limited_resource=False, seed=0)
    assert get_environment("housebuild", external_mode="rect-modification", seed=0).options.external_mode == "rect_modification"


def test_position_modification_shows_the_limits_without_the_first_turn_instructions(tmp_path):
    env, row = env_for(tmp_path, "position_modification", original_prompt=False, lim=1)
    first, _ = env.external_transition(prompt=row["prompt"], agent_completions=["", ""], num_agents=2)
    # as the original: the limits text stands in for the instructions that carry it; the first wrong cell by y is (0, 0, 0)
    assert "Resource limits per agent (air unlimited):\n- white_concrete: 7\n- obsidian: 5" in first and "You are agent" not in first
    assert first.endswith("Suggested fixes (use them to correct errors):\n(0 0 0 white_concrete)")
