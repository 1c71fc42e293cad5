"""Multi-turn feedback: what each mode tells each agent about the previous joint response."""

from __future__ import annotations

import re

import pytest

from comlrl.envs import get_environment

ROW = {
    "task_id": "t/0",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n    assert candidate(2, 2) == 4\n",
    "entry_point": "add",
}
AUX = "def aux(a, b):\n    return a + b"
MINUS = "def add(a, b):\n    result = aux(a, b)\n    return result - 1"


def code_transition(mode, completions=(AUX, MINUS), **options):
    env = get_environment("humaneval", external_mode=mode, test_timeout_s=1.0, **options)
    env.rows.add([ROW])
    prompts = [f(ROW) for f in env.formatters]
    return env.external_transition(prompt=ROW["prompt"], agent_completions=list(completions), num_agents=2,
                                   prompt_history_per_agent=[[p] for p in prompts],
                                   response_history_per_agent=[[c] for c in completions]), prompts


def test_level_feedback_reports_the_first_assert_by_default():
    (aux, main), prompts = code_transition("level_feedback")
    for text, prompt, response in ((aux, prompts[0], AUX), (main, prompts[1], MINUS)):
        assert "- Turn 1 prompt:\n" + prompt in text and "- Turn 1 response:\n" + response in text  # own history only
    assert "Aux definition: FOUND" in aux and "Main definition: FOUND" in main and "Syntax: OK" in main
    # sandbox_slice=1: only the first assert; add(1, 2) returns 2
    assert "Tests: 0/1 passed" in main and "Failed: assert add(1, 2) == 3 -> AssertionError" in main
    # the result of aux is assigned and used: reported as used (the original said "never used")
    assert "Aux usage: main calls aux and uses its result" in main and "Aux usage" not in aux
    assert main.rstrip().endswith("Revise your add(...) accordingly. Output only the function code, nothing else.")


def test_level_feedback_slices_and_errors():
    (_, main), _ = code_transition("level_feedback", sandbox_slice="all")
    # every assert: add(1, 2) = 2, add(0, 0) = -1, add(2, 2) = 3 all miss
    assert "Tests: 0/3 passed" in main and len(re.findall(r"Failed: ", main)) == 3
    (_, main), _ = code_transition("level_feedback", completions=(AUX, "def add(a, b)\n    return a"))
    assert "Main definition: FOUND" in main and "Syntax: ERROR at line" in main and "Tests: no test cases found" in main
    (_, main), _ = code_transition("level_feedback", completions=("", "def add(a, b):\n    return aux(a, b)"))
    assert "Aux definition: MISSING (Aux function not defined)" in main
    assert "Failed: assert add(1, 2) == 3 -> NameError: name 'aux' is not defined" in main
    assert "Warning: main looks like a thin wrapper around aux" in main


def test_level_feedback_counts_a_sandbox_timeout_as_a_failure():
    looping = "def add(a, b):\n    while True:\n        pass\n    return 0"
    (_, main), _ = code_transition("level_feedback", completions=(AUX, looping))
    assert "Failed: assert add(1, 2) == 3 -> TimeoutException" in main


def test_level_passed_passed_and_plain():
    (aux, main), prompts = code_transition("level_passed")
    assert aux.startswith(prompts[0]) and main.startswith(prompts[1])  # memoryless: the first-turn instructions
    assert "Your previous add(...):\n" + MINUS in main and "- Tests: no test passed" in main
    assert "- Implementation: found" in aux and "- Syntax: correct" in main
    (aux, main), _ = code_transition("passed")
    assert "Signal: not every level passed" in main and prompts[1] not in main  # original_prompt off by default
    (_, main), _ = code_transition("passed", original_prompt=True, completions=(AUX, "def add(a, b):\n    return aux(a, b) + 0"))
    assert main.startswith(prompts[1]) and "Signal: every level passed" in main
    (aux, main), _ = code_transition("plain")
    assert "Tests" not in main and main.endswith("Revise your add(...). Output only the function code.")


# ----------------------------------------------------------------------------- Minecraft


def strbuild_transition(mode, completions, **options):
    env = get_environment("strbuild", external_mode=mode, **options)
    row = env.load_dataset("train")[0]  # "I"
    return env.external_transition(prompt=row["prompt"], agent_completions=completions, num_agents=2,
                                   prompt_history_per_agent=[[f(row)] for f in env.formatters]), env, row


def test_strbuild_position_feedback_lists_every_letter_cell():
    (first, second), env, row = strbuild_transition("position_feedback", ["", ""])
    cells = re.findall(r"^- \((\d+), (\d+), 0\)$", first, flags=re.M)
    # the 13 cells of "I", top row first: (0..4, 4), then (2, 3), (2, 2), (2, 1), then (0..4, 0)
    assert [(int(x), int(y)) for x, y in cells] == [(x, 4) for x in range(5)] + [(2, 3), (2, 2), (2, 1)] + [(x, 0) for x in range(5)]
    assert "- Turn: 2" in first and "about half of the positions (about 6)" in first
    assert "Max commands allowed: 150" in first and "- oak_planks" in first and "- white_concrete" in second
    assert "You are agent 1" in first and "You are agent 2" in second  # original_prompt: the first-turn instructions


def test_strbuild_score_and_perfect_feedback():
    top = "\n".join(f"/setblock {x} 4 0 {b}" for x, b in enumerate(["oak_planks", "stone"] * 2 + ["oak_planks"]))
    (first, _), env, row = strbuild_transition("score_feedback", [top, ""], previous_response=True)
    reward = env.reward_func([top], [""], batch_items=[row])[0]
    assert f"Previous reward: {reward:.4f}" in first and "Your previous commands:\n" + top in first
    (first, second), env, row = strbuild_transition("perfect_feedback", ["", "/setblock 0 2 0 obsidian"])
    wrong = [re.findall(r"^- \((\d+), (\d+), 0\)$", text.split("Remove")[0], flags=re.M) for text in (first, second)]
    # nothing right yet: the 13 cells split by owner (x + y) % 2 between the agents; the stray block goes to agent 2
    assert len(wrong[0]) + len(wrong[1]) == 13 and all((int(x) + int(y)) % 2 == 0 for x, y in wrong[0])
    assert "Remove the stray blocks (set air) at:\n- (0, 2, 0)" in second and "Remove" not in first


def test_housebuild_position_modification_lim():
    env = get_environment("housebuild", external_mode="position_modification", lim=3, seed=0)
    row = env.load_dataset("train")[0]
    first, _ = env.external_transition(prompt=row["prompt"], agent_completions=["", ""], num_agents=2)
    suggestions = first.split("Suggested fixes (use them to correct errors):\n")[1].splitlines()
    # an empty box: the wrong cells are the non-air ones, lowest y first: y = 0 row z = 1 is concrete
    assert suggestions == ["(0 0 1 white_concrete)", "(0 0 2 white_concrete)", "(0 0 3 white_concrete)"]
    assert first.index("You are agent 1") < first.index("Suggested fixes")  # instructions first in this mode


@pytest.mark.parametrize("mode", ["score_feedback", "position_feedback", "perfect_feedback"])
def test_housebuild_modes(mode):
    env = get_environment("housebuild", external_mode=mode, seed=0)
    row = env.load_dataset("train")[0]
    history = [[f(row)] for f in env.formatters]
    first, second = env.external_transition(prompt=row["prompt"], agent_completions=["/kill", ""], num_agents=2,
                                            prompt_history_per_agent=history)
    assert "Do not output any text other than commands." in first and "- Turn: 2" in second
    if mode == "perfect_feedback":
        cells = re.findall(r"^- \(\d+, \d+, \d+\) = (\w+)$", first + second, flags=re.M)
        assert len(cells) == 294 - 122  # every non-air cell is wrong in an empty box
