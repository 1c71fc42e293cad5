"""The ClassEval environment: the task repository's skeleton rules, merge and reward on golden cases
(every value below is worked out by hand next to it), the feedback prompts, options, data and configs.

The sample class used for the hand-worked values is ``ShelfInventory`` (the first bundled training
row): four incomplete methods -- ``add(self, name, count)`` and ``take(self, name, count)`` go to
agent 2 (more than one parameter), ``total_units(self)`` and ``low_stock(self)`` to agent 1 -- and
12 unittest tests, which the loader runs in this order: TestAdd 1-3, TestLowStock 1-2, TestMain,
TestTake 1-4, TestTotalUnits 1-2.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from tests.helpers.common import no_signal_expected

from comlrl.cli.main import main
from comlrl.envs import get_environment
from comlrl.envs.coding.classeval import scoring, source
from comlrl.envs.sources import DATASETS_DIR_ENV

from tests.helpers.cli_runs import read_jsonl, tiny, train


@pytest.fixture(scope="module")
def env():
    return get_environment("classeval", test_timeout_s=5.0, workers=2)


@pytest.fixture(scope="module")
def rows(env):
    return list(env.load_dataset("train", offline=True)) + list(env.load_dataset("eval", offline=True))


def solution(row, agent, num_agents=2, skip=()):
    """The canonical methods of ``agent`` (the dataset's own per-method solutions), as one completion."""
    parts = source.partition(row["skeleton"], num_agents)
    return "\n\n".join(textwrap.dedent(m["solution_code"]) for m in row["methods_info"]
                       if parts[m["method_name"]] == agent and m["method_name"] not in skip)


def method(row, name):
    return textwrap.dedent(next(m["solution_code"] for m in row["methods_info"] if m["method_name"] == name))


def levels(details):
    return [details[key] for key in scoring.LEVEL_KEYS]


# ----------------------------------------------------------------------------- the skeleton rules

SKELETON = '''import math


class Gadget(Base):
    pass


class Widget:
    """A widget \u201cwith\u201d curly quotes."""

    def __init__(self):
        self.parts = []

    def empty(self):

    def docstring_only(self):
        """Only a docstring."""

    def passes(self, a):
        pass

    def not_yet(self, a, *rest):
        raise NotImplementedError("later")

    def bare_raise(self):
        raise NotImplementedError

    @staticmethod
    def helper():
        """A static stub."""

    def done(self, **options):
        return options

    async def later(self):
        """An async stub is not counted."""
'''


def test_the_skeleton_rules():
    skeleton = SKELETON.replace("    def empty(self):\n\n", "")  # a method without a body does not parse: kept out
    assert source.sanitize("\u201ca\u201d \u2018b\u2019 c\u2013d\u2014e\u2026\u00a0f\u200b") == "\"a\" 'b' c-d-e... f"
    assert source.class_name_of(skeleton) == "Widget"  # class Gadget(Base): has bases, not matched
    # docstring only, pass, raise NotImplementedError(...) are stubs; a bare raise and an async def are not
    assert source.incomplete_methods(skeleton) == ["docstring_only", "passes", "not_yet", "helper"]
    assert source.param_counts(skeleton) == {"__init__": 1, "docstring_only": 1, "passes": 2, "not_yet": 3, "bare_raise": 1,
                                             "helper": 0, "done": 2, "later": 1}
    assert source.partition(skeleton, 2) == {"docstring_only": 0, "passes": 1, "not_yet": 1, "helper": 1}
    assert source.partition(skeleton, 1) == dict.fromkeys(["docstring_only", "passes", "not_yet", "helper"], 0)
    assert source.skeleton_imports(skeleton) == "import math"
    assert source.defined_names(skeleton, "Widget") == ("Widget", "Gadget")
    assert source.incomplete_methods(SKELETON) == []  # a skeleton that does not parse has no methods to write


def test_method_snippets_follow_the_original_extraction():
    allowed = ["a", "b"]
    text = "Sure! Here:\n```python\n    def a(self):\n        return 1\n\ndef c(self):\n    return 3\n\ndef b(self, x):\n    return x\n```\nDone."
    # inside the first fence only; a def of another name ends a snippet; the def line is stripped, the body kept
    assert source.method_snippets(text, allowed) == {"a": "def a(self):\n        return 1", "b": "def b(self, x):\n    return x"}
    # a nested def ends the method (the helper is lost); a later snippet of the same name replaces the first
    nested = "def a(self):\n    def inner():\n        return 2\n    return inner()\n\ndef a(self):\n    return 5"
    assert source.method_snippets(nested, allowed) == {"a": "def a(self):\n    return 5"}
    assert source.method_snippets("def a(self):\n    return 1\nThat is all.", allowed) == {"a": "def a(self):\n    return 1\nThat is all."}
    assert source.method_snippets("```\nno newline after", allowed) == {}
    assert source.method_snippets("```def a(self): pass```", allowed) == {}  # an opening fence without a line break: nothing
    assert source.method_snippets("def a(self):\n" + "    x = 1\n" * 40000, allowed) == {}  # over 256 KiB: nothing
    assert source.method_snippets("def a(self):\n    return 1", []) == {}


def test_merge_replaces_each_region_as_the_original():
    skeleton = ("class Box:\n    def __init__(self):\n        self.n = 0\n\n    def get(self):\n        \"\"\"Get.\"\"\"\n\n"
                "    @property\n    def size(self):\n        \"\"\"Size.\"\"\"\n\n    def put(self, x):\n        pass\n")
    merged = source.merge(skeleton, "Box", {"put": "def put(self, x):\n\tself.n = x  \n\treturn x", "get": "def get(self):\n    return self.n"})
    # get's region ran to the next def at its indentation, so size's decorator went with it (kept quirk);
    # tabs became 4 columns, trailing spaces dropped
    assert merged == ("class Box:\n    def __init__(self):\n        self.n = 0\n\n    def get(self):\n        return self.n\n"
                      "    def size(self):\n        \"\"\"Size.\"\"\"\n\n    def put(self, x):\n        self.n = x\n        return x\n")
    assert source.merge(skeleton, "Other", {"get": "def get(self):\n    return 1"}) == skeleton
    assert source.merge(skeleton, "Box", {}) == skeleton
    assert source.compiles(merged) and not source.compiles("def f():\n    nonlocal x\n") and source.parses("def f():\n    nonlocal x\n")


def test_test_ids_in_the_loaders_order():
    module = ("import unittest\n\nclass Helper:\n    def test_no(self):\n        pass\n\n"
              "class ZTest(unittest.TestCase):\n    def test_b(self):\n        pass\n    def test_a(self):\n        pass\n    def check(self):\n        pass\n\n"
              "class ATest(ZTest):\n    def test_c(self):\n        pass\n\n"
              "class Only(unittest.TestCase):\n    def runTest(self):\n        pass\n")
    assert source.test_ids(module) == ["ATest.test_a", "ATest.test_b", "ATest.test_c", "Only.runTest", "ZTest.test_a", "ZTest.test_b"]


# ----------------------------------------------------------------------------- golden cases


def test_the_canonical_solution_scores_6_on_every_sample_class(env, rows):
    assert len(rows) == 6
    for row in rows:
        details = env.reward_details([solution(row, 0)], [solution(row, 1)], batch_items=[row])[0]
        assert levels(details) == [2.0, 4.0, 0.0, 6.0] and details["reward"] == 6.0, (row["class_name"], details)
        assert details["tests_passed"] == details["tests_run"] == details["tests_total"] > 10 and details["tests_completed"] == 1.0
        assert details["methods_valid"] == details["methods_total"] >= 4


def test_one_agent_writes_every_method(rows):
    single = get_environment("classeval", num_agents=1, num_turns=1, test_timeout_s=5.0)
    row = rows[4]
    assert len(single.formatters) == 1 and "- add_score\n- average\n- best_student\n- failing\n- course_names" in single.formatters[0](row)
    assert single.reward_func([solution(row, 0, num_agents=1)], batch_items=[row]) == [6.0]


def test_hand_worked_rewards(env, rows):
    row = rows[0]
    assert row["class_name"] == "ShelfInventory"
    right_0, right_1 = solution(row, 0), solution(row, 1)
    unsorted_low = right_0.replace("return sorted(name for name, units in self.stock.items() if units <= self.threshold)",
                                   "return [name for name, units in self.stock.items() if units <= self.threshold]")
    assert unsorted_low != right_0
    broken_low = right_0.replace("return sorted(", "return sorted((")
    non_compiling = right_0.replace("return sum(self.stock.values())", "nonlocal total\n    return sum(self.stock.values())")
    cases = {
        # low_stock unsorted: LowStock 1 and Main fail -> lv1 = 2 x 4/4, lv2 = 4 x 10/12, lv3 = 0
        "wrong": ([unsorted_low], [right_1], [2.0, 40 / 12, 0.0, 2.0 + 40 / 12]),
        # take missing: its stub returns None -> Take 1 and 3 and Main fail (Take 2 and 4 expect False: pass);
        # lv1 = 2 x 3/4 = 1.5, lv2 = 4 x 9/12 = 3.0
        "missing": ([right_0], [solution(row, 1, skip=("take",))], [1.5, 3.0, 0.0, 4.5]),
        # agent 1 also writes add (right): agent 2's add is the one kept; lv3 = -1/4
        "overlap": ([right_0 + "\n\n" + method(row, "add")], [right_1], [2.0, 4.0, -0.25, 5.75]),
        # low_stock does not parse: left out (its stub returns None: LowStock 1, 2 and Main fail) -> 1.5 + 4 x 9/12
        "snippet_syntax_error": ([broken_low], [right_1], [1.5, 3.0, 0.0, 4.5]),
        # every snippet parses, but the class does not compile (nonlocal without a binding): 0, every level 0
        "class_does_not_compile": ([non_compiling], [right_1], [0.0, 0.0, 0.0, 0.0]),
        # nothing written: lv1 = 0; of the stubs' answers only Take 4's None passes (assertFalse; Take 2 then
        # finds an empty stock, since add is a stub too) -> 4 x 1/12
        "empty": ([""], [""], [0.0, 4 / 12, 0.0, 4 / 12]),
    }
    names = list(cases)
    firsts = [completion for name in names for completion in cases[name][0]]
    seconds = [completion for name in names for completion in cases[name][1]]
    found = env.reward_details(firsts, seconds, batch_items=[row])
    for name, details in zip(names, found):
        assert levels(details) == pytest.approx(cases[name][2], abs=1e-12), (name, details)
    assert found[names.index("class_does_not_compile")]["compiles"] == 0.0
    assert found[names.index("overlap")]["methods_overlapping"] == 1.0
    assert env.reward_func(firsts, seconds, batch_items=[row]) == [d["reward"] for d in found]


def test_timeouts_and_a_candidate_that_exits(rows):
    row = rows[0]
    env = get_environment("classeval", test_timeout_s=0.5, max_timeouts=2, num_turns=1)
    looping = solution(row, 0).replace("return sum(self.stock.values())", "while True:\n        pass")
    exiting = solution(row, 0).replace("return sorted(", "import os\n    os._exit(0)\n    return sorted(")
    looped, exited = env.reward_details([looping, exiting], [solution(row, 1)] * 2, batch_items=[row])
    # total_units loops: Main times out (1st), TotalUnits 1 times out (2nd), TotalUnits 2 is not run:
    # 11 run, 9 passed -> lv2 = 4 x 9/11
    assert (looped["tests_run"], looped["tests_passed"], looped["tests_timeouts"]) == (11.0, 9.0, 2.0)
    assert levels(looped) == pytest.approx([2.0, 36 / 11, 0.0, 2.0 + 36 / 11])
    # the candidate exits in LowStock 1: the runner did not see the job through -> lv2 = 0 (the original's crashed runner)
    assert exited["tests_completed"] == 0.0 and levels(exited) == [2.0, 0.0, 0.0, 2.0]


def test_a_malformed_row_is_an_error(env):
    with pytest.raises(ValueError, match="needs 'skeleton' and 'test'"):
        env.reward_func(["x"], ["y"], batch_items=[{"task_id": "t", "skeleton": "class A:\n    pass\n"}])
    with pytest.raises(ValueError, match="test is not a Python module"):
        env.reward_func(["x"], ["y"], batch_items=[{"skeleton": "class A:\n    pass\n", "test": "class T(:"}])


# ----------------------------------------------------------------------------- prompts and feedback


def test_first_prompts(env, rows):
    row = rows[0]
    first, second = (formatter(row) for formatter in env.formatters)
    assert "class 'ShelfInventory'" in first and "- total_units\n- low_stock\n" in first and "- add" not in first
    assert "- add\n- take\n" in second
    for prompt in (first, second):
        assert prompt.endswith("SKELETON END") and "SKELETON START\nclass ShelfInventory:" in prompt
    no_methods = {"skeleton": "class Solo:\n    def run(self, x):\n        pass\n", "class_name": "Solo"}
    assert "Implement only these methods:\n(none)" in env.formatters[0](no_methods)
    assert env.formatters[1](row, external_prompts="next turn") == "next turn"


def test_code_feedback_reuses_the_rewards_report(rows, monkeypatch):
    env = get_environment("classeval", test_timeout_s=5.0)
    row = rows[0]
    prompts = [formatter(row) for formatter in env.formatters]
    first = ("```python\n" + solution(row, 0).replace("return sorted(", "return list(") + "\n" + method(row, "add") + "\n```\nThat's all.")
    second = solution(row, 1).replace("raise ValueError(\"count must be at least 1\")", "pass")
    runs = []
    original = env.sandbox.run_many
    monkeypatch.setattr(env.sandbox, "run_many", lambda jobs: runs.append(len(jobs)) or original(jobs))
    details = env.reward_details([first], [second], batch_items=[row])[0]
    nxt = env.external_transition(prompt=row["prompt"], agent_completions=[first, second], num_agents=2,
                                  prompt_history_per_agent=[[prompts[0]], [prompts[1]]], response_history_per_agent=[[first], [second]])
    assert runs == [1]  # the feedback reused the reward's test report
    # Add 3 (no ValueError) fails; low_stock in stock order: LowStock 1 and Main fail
    assert details["tests_passed"] == 9.0
    assert "- Syntax: OK\n- Hidden tests passed: 9/12\n" in nxt[0] and nxt[0] == nxt[0].strip()
    assert ("- Failing tests: ShelfInventoryTestAdd.test_add_3, ShelfInventoryTestLowStock.test_low_stock_1, "
            "ShelfInventoryTestMain.test_main\n") in nxt[1]
    assert "- Turn 1 prompt:\n" + prompts[0] in nxt[0]
    # agent 1's history keeps only its own methods: the add it wrote (agent 2's) and the prose are gone
    history = nxt[0][nxt[0].index("History: your earlier responses:"):nxt[0].index("Class skeleton for reference")]
    assert "def total_units" in history and "def add" not in history and "That's all" not in history
    assert "SKELETON START\nclass ShelfInventory:" in nxt[1] and nxt[1].endswith("outside the block.")


def test_plain_mode_and_the_history_flags(rows):
    row = rows[0]
    env = get_environment("classeval", external_mode="plain", original_prompt=False, previous_response=False)
    with pytest.raises(ValueError, match="matches no row this environment has seen"):
        env.external_transition(prompt=row["prompt"], agent_completions=["x", "y"], num_agents=2)
    env.rows.add([row])
    prompts = [formatter(row) for formatter in env.formatters]
    nxt = env.external_transition(prompt=row["prompt"], agent_completions=["x", "y"], num_agents=2,
                                  prompt_history_per_agent=[[prompts[0], "turn two"], [prompts[1], "turn two b"]],
                                  response_history_per_agent=[["x", "x2"], ["y", "y2"]])
    assert "Diagnostics" not in nxt[0] and "Hidden tests" not in nxt[0]
    assert "- Turn 1 prompt" not in nxt[0] and "- Turn 2 prompt:\nturn two" in nxt[0]  # original_prompt=false: turn 1 left out
    assert "earlier responses" not in nxt[1]
    feedback = get_environment("classeval")
    feedback.rows.add([row])
    broken = feedback.external_transition(prompt=row["prompt"], agent_completions=["def total_units(self):\n    nonlocal q\n    return 1", ""],
                                          num_agents=2)
    assert "- Syntax: ERROR\n- Hidden tests not available or not executed.\n" in broken[0]


def test_options_are_checked():
    with pytest.raises(ValueError, match="external_mode.*code_feedback, plain"):
        get_environment("classeval", external_mode="level_feedback_x")
    assert get_environment("classeval", external_mode="feedback").options.external_mode == "code_feedback"
    with pytest.raises(ValueError, match="max_timeouts"):
        get_environment("classeval", max_timeouts=0)
    with pytest.raises(ValueError, match="num_agents must be 1 or 2"):
        get_environment("classeval", num_agents=3)
    with pytest.raises(ValueError, match="wall_time_s"):
        get_environment("classeval", wall_time_s=-1)
    assert get_environment("classeval").sandbox.limits.wall_time_s == 125.0  # 40 s x 3 timeouts + 5, the original's


# ----------------------------------------------------------------------------- data and configs


def test_the_real_dataset_with_the_original_slices(tmp_path, monkeypatch, rows):
    row = {key: value for key, value in rows[0].items() if key != "prompt"}
    folder = tmp_path / "FudanSELab" / "ClassEval"
    folder.mkdir(parents=True)
    with open(folder / "test.jsonl", "w") as handle:
        for i in range(90):
            handle.write(json.dumps(dict(row, task_id=f"ClassEval_{i}")) + "\n")
    monkeypatch.setenv(DATASETS_DIR_ENV, str(tmp_path))
    env = get_environment("classeval")
    train_rows, eval_rows = env.load_dataset("train", offline=False), env.load_dataset("eval", offline=False)
    assert train_rows["task_id"] == [f"ClassEval_{i}" for i in range(66)]  # test[:66]
    assert eval_rows["task_id"] == [f"ClassEval_{i}" for i in range(66, 82)]  # test[66:82]
    assert train_rows[0]["prompt"] == row["skeleton"]  # the key transitions find a row by
    nxt = env.external_transition(prompt=train_rows[3]["prompt"], agent_completions=["", ""], num_agents=2)
    assert "ShelfInventory" in nxt[0]


def test_the_bundled_configs_resolve_with_the_published_settings(capsys):
    assert main(["train", "--config", "configs/magrpo_classeval_config.yaml", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["environment"] == "classeval" and plan["entities"]["agent_model"] == "Qwen/Qwen3-4B-Instruct-2507"
    assert plan["environment_options"] == {"external_mode": "code_feedback", "original_prompt": True, "previous_response": True,
                                           "test_timeout_s": 40.0, "max_timeouts": 3, "num_turns": 2, "num_agents": 2}
    magrpo = plan["config"]["MAGRPOConfig"]
    assert (magrpo["num_train_epochs"], magrpo["agent_learning_rate"], magrpo["num_generations"], magrpo["max_new_tokens"]) == (13, 1e-5, 2, 600)
    assert (magrpo["temperature"], magrpo["top_p"], magrpo["discount"], magrpo["early_termination_threshold"]) == (0.6, 0.6, 0.9, -0.2)
    assert plan["dataset"]["train_split"] == "test[:66]" and plan["dataset"]["eval_split"] == "test[66:82]"
    assert plan["reward_processor"]["shift"] == -6.0 and plan["wandb"] is None
    for algorithm, epochs in (("iac", 40), ("maac", 40)):
        assert main(["train", "--config", f"{algorithm}_classeval_config.yaml", "--dry-run", "--json"]) == 0
        section = json.loads(capsys.readouterr().out)["config"][f"{algorithm.upper()}Config"]
        assert section["num_train_epochs"] == epochs and section["num_generations"] == 1 and section["critic_learning_rate"] == 5e-6


@no_signal_expected  # tiny or scripted models: a step's answers may all score alike
@pytest.mark.slow
def test_a_tiny_team_trains_on_the_offline_sample(chat_models, tmp_path):
    run = train("magrpo_classeval_config.yaml", [f"agent_model.name={chat_models['qwen']}", "agent_model.torch_dtype=float32",
                                                 "sandbox.test_timeout_s=5", *tiny("magrpo", turns=2)], tmp_path / "run")
    rows = read_jsonl(run / "eval_rows.jsonl")
    assert rows and all("ce_reward/level1_syntax" in row["details"] for row in rows)
    metrics = read_jsonl(run / "metrics.jsonl")
    assert any("eval/ce_reward/total" in row for row in metrics)
