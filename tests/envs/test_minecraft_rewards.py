"""Minecraft rewards (StrBuild, HouseBuild): hand-worked cases per level, rules, one value per joint response."""

from __future__ import annotations

import json
import random
from importlib import resources

import pytest

from comlrl.envs import get_environment

# StrBuild task 1 is "I": rows top to bottom 11111 / 00100 / 00100 / 00100 / 11111 in a 5 x 5 box at z = 0.
# Target cells: y=4 and y=0 rows (5 + 5) and x=2 at y=1..3 (3) = 13; background = 25 - 13 = 12.
TOP = "\n".join(f"/setblock {x} 4 0 {b}" for x, b in enumerate(["oak_planks", "stone"] * 2 + ["oak_planks"]))
STEM_AND_BOTTOM = "\n".join(
    ["/setblock 2 3 0 white_concrete", "/setblock 2 2 0 obsidian", "/setblock 2 1 0 white_concrete"]
    + [f"/setblock {x} 0 0 {b}" for x, b in enumerate(["white_concrete", "obsidian"] * 2 + ["white_concrete"])]
)


@pytest.fixture(scope="module")
def strbuild():
    env = get_environment("strbuild")
    return env, env.load_dataset("train")[0]


def sb(env, row, c1, c2):
    return env.reward_details([c1], [c2], batch_items=[row])[0]


def test_strbuild_row(strbuild):
    env, row = strbuild
    assert row["string"] == "I" and row["task_id"] == "str_build_0001" and row["difficulty"] == 1
    assert row["target_rows_topdown"] == ["#####", "..#..", "..#..", "..#..", "#####"]
    assert (row["local_bbox_from"], row["local_bbox_to"]) == ([0, 0, 0], [4, 4, 0])


def test_strbuild_empty_wall(strbuild):
    env, row = strbuild
    d = sb(env, row, "", "")
    # nothing placed: coverage 0, no extras, no pairs; both palettes missing: -0.25 x 2
    assert (d["level_1"], d["level_2"], d["level_3"], d["level_4"]) == (0.0, 0.0, 0.0, -0.5)
    assert d["reward"] == -0.5 and d["coverage"] == 0.0 and d["iou"] == 0.0


def test_strbuild_complete_word(strbuild):
    env, row = strbuild
    d = sb(env, row, TOP, STEM_AND_BOTTOM)
    # coverage 13/13 -> level 1 = 2.0; no extras; adjacent pairs: 4 (top) + 4 (bottom) + 4 (x=2 column) = 12,
    # of which one has the same texture family: (2,0) and (2,1), both concrete -> level 3 = -1/12;
    # every palette block is used -> level 4 = 0
    assert (d["coverage"], d["level_1"], d["level_2"], d["level_4"]) == (1.0, 2.0, 0.0, 0.0)
    assert d["level_3"] == pytest.approx(-1 / 12) and d["adjacency_ratio"] == pytest.approx(1 / 12)
    assert d["reward"] == pytest.approx(2.0 - 1 / 12) and d["iou"] == 1.0
    assert d["reward"] == pytest.approx(sum(d[f"level_{k}"] for k in range(1, 5)))


def test_strbuild_extra_blocks_and_overwrites(strbuild):
    env, row = strbuild
    # a stone at (0, 2) is off the letter: extra_ratio 1/12 -> level 2 = -1.5/12 = -0.125; it has no neighbours
    d = sb(env, row, TOP + "\n/setblock 0 2 0 stone", STEM_AND_BOTTOM)
    assert d["level_2"] == pytest.approx(-0.125) and d["iou"] == pytest.approx(13 / 14)
    assert d["reward"] == pytest.approx(2.0 - 0.125 - 1 / 12)
    # agent 2 writes last: its obsidian at (0, 4) replaces agent 1's oak planks; the top row becomes
    # obsidian, stone, oak, stone, oak: no same-family pair is added, oak is still used -> same reward
    assert sb(env, row, TOP, STEM_AND_BOTTOM + "\n/setblock 0 4 0 obsidian")["reward"] == pytest.approx(2.0 - 1 / 12)
    # agent 2 erasing (air) a top cell of agent 1: coverage 12/13
    d = sb(env, row, TOP, STEM_AND_BOTTOM + "\n/setblock 1 4 0 air")
    assert d["coverage"] == pytest.approx(12 / 13)


def test_strbuild_command_rules(strbuild):
    env, row = strbuild
    rejected = "\n".join([
        "/setblock 0 4 0 obsidian",  # not in agent 1's palette
        "/setblock 5 4 0 stone",  # outside the box (x <= 4)
        "/setblock ~ 4 0 stone",  # relative coordinates
        "/setblock 0 4 1 stone",  # z must be 0
        "/fill 0 4 0 4 4 0 stone",  # only /setblock
    ])
    assert sb(env, row, rejected, "")["coverage"] == 0.0
    fenced = "```text\n- /setblock 0 4 0 stone\n1. minecraft:stone\n2) setblock 1 4 0 minecraft:oak_planks\n```"
    # fences, bullets and numbering are stripped; "minecraft:" prefixes are accepted; the bare block name is no command
    assert sb(env, row, fenced, "")["covered"] == 2.0


def test_strbuild_command_cap_is_split_between_agents():
    env = get_environment("strbuild", max_commands=5)  # agent 1: 5 // 2 + 1 = 3, agent 2: 2
    row = env.load_dataset("train")[0]
    d = env.reward_details([TOP], [STEM_AND_BOTTOM], batch_items=[row])[0]
    assert d["covered"] == 3 + 2


def test_strbuild_one_value_per_joint_response(strbuild):
    env, row = strbuild
    rewards = env.reward_func([TOP, "", TOP], [STEM_AND_BOTTOM, "", ""], batch_items=[row])
    # the original scored only the first joint response of a call; here every one is scored
    assert len(rewards) == 3 and rewards[0] == pytest.approx(2.0 - 1 / 12) and rewards[1] == -0.5
    assert rewards[2] == pytest.approx(2 * 5 / 13 - 0.25)  # top row only, agent 2's palette missing


def test_housebuild_spider_attacks_are_drawn_from_the_seed():
    env = get_environment("housebuild", seed=7)
    rng = random.Random(7)
    assert env.threat.attacks == tuple(rng.randint(1, 3) for _ in range(3)) == (2, 1, 2)
    assert env.seed == 7 and env.threat.damage == 5.0
    assert get_environment("housebuild", seed=7, spider_num=0).threat.attacks == ()
    drawn = get_environment("housebuild")
    assert isinstance(drawn.seed, int)  # None draws a seed and keeps it, so the run can be repeated


@pytest.fixture(scope="module")
def housebuild():
    env = get_environment("housebuild", seed=7)
    return env, env.load_dataset("train")[0]


def test_housebuild_row(housebuild):
    env, row = housebuild
    raw = json.loads(resources.files("comlrl.envs").joinpath("data/minecraft/housebuild_tasks.json").read_text())[0]
    for key in ("task_id", "inventory", "count", "target_spec"):
        assert row[key] == raw[key]
    assert (row["local_bbox_from"], row["local_bbox_to"]) == ([0, 0, 0], [5, 6, 6])
    assert row["layers_by_y"]["0"][1] == "CCCCCC"


def test_housebuild_levels(housebuild):
    env, row = housebuild
    # house_build_0002: 6 x 7 x 7 = 294 cells, 122 of them air (count A = 122); an empty box matches the air cells
    empty = env.reward_details([""], [""], batch_items=[row])[0]
    # spiders: damage 2 + 1 + 2 = 5 = HP -> penalty 0.1 x min(1, 5/5) = 0.1
    assert empty["level_1"] == pytest.approx(122 / 294) and empty["level_2"] == pytest.approx(-0.1)
    assert empty["reward"] == pytest.approx(122 / 294 - 0.1)
    killed = env.reward_details(["/kill"], [""], batch_items=[row])[0]
    assert killed["level_2"] == 0.0 and killed["reward"] == pytest.approx(122 / 294)
    # the y=0 floor: rows z=1..5 are concrete -> one fill makes 30 more cells right
    floor = env.reward_details(["/fill 0 0 1 5 0 5 white_concrete"], ["/kill @e"], batch_items=[row])[0]
    assert floor["level_1"] == pytest.approx((122 + 30) / 294)
    # iou of the non-air cells: 30 placed, all on target, of 294 - 122 = 172 target cells
    assert floor["iou"] == pytest.approx(30 / 172)


def test_housebuild_resource_limits(housebuild):
    env, row = housebuild
    # white_concrete: count 68 -> per agent ceil(68/2) + floor(68/4) = 34 + 17 = 51 cells
    twice = "/fill 0 0 1 5 0 5 white_concrete\n/fill 0 0 1 5 0 5 white_concrete"
    d = env.reward_details([twice + "\n/kill"], [""], batch_items=[row])[0]
    assert d["level_1"] == pytest.approx((122 + 30) / 294)  # the second 30 would exceed 51: rejected, same cells
    overflow = "/fill 0 1 0 5 3 6 white_concrete"  # 6 x 3 x 7 = 126 > 51: rejected outright
    assert env.reward_details([overflow + "\n/kill"], [""], batch_items=[row])[0]["level_1"] == pytest.approx(122 / 294)
    unlimited = get_environment("housebuild", seed=7, limited_resource=False)
    d = unlimited.reward_details([overflow + "\n/kill"], [""], batch_items=[row])[0]
    assert d["level_1"] != pytest.approx(122 / 294)


def test_housebuild_accepts_the_raw_task_object(housebuild):
    env, row = housebuild
    raw = json.loads(resources.files("comlrl.envs").joinpath("data/minecraft/housebuild_tasks.json").read_text())
    assert env.reward_func(["/kill"], [""], batch_items=[raw[0]]) == pytest.approx([122 / 294])
    # tasks 0101.. have no bbox: it is derived from the layers (x: row length, z: rows, y: layer range)
    assert env.reward_func(["/kill"], [""], batch_items=[raw[1]])[0] == env.reward_func(["/kill"], [""], batch_items=[env.load_dataset("train")[1]])[0]


def test_housebuild_fill_rules(housebuild):
    env, row = housebuild
    for bad in ("/fill 0 0 1 5 0 5 white_concrete replace", "/fill 0 0 1 6 0 5 white_concrete", "/fill ~ 0 1 5 0 5 white_concrete",
                "/fill 0 0 1 5 0 5 diamond_block", "/setblock 0 0 1 white_concrete"):
        assert env.reward_details([bad + "\n/kill"], [""], batch_items=[row])[0]["level_1"] == pytest.approx(122 / 294), bad
