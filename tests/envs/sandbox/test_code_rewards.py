"""Code rewards: hand-worked cases per level, the kept quirks and their fixes, hostile candidates.

Row: ``add(a, b)`` with four asserts the reward runs and one it skips (``assert(`` without a space
is not collected by the original's pattern). Level values: aux defined 0.4, main defined 0.6,
syntax 0.5, tests passed/total, cooperation +0.5 (calls aux) +1.0 (not a thin wrapper) -0.5
(ignored aux result).
"""

from __future__ import annotations

import pytest

from comlrl.envs import get_environment

ROW = {
    "task_id": "t/0",
    "prompt": 'import math\n\n\ndef add(a, b):\n    """Return a + b."""\n',
    "test": (
        "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
        "    assert candidate(-1, 1) == 0\n    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n    assert(candidate(2, 2) == 4)\n"
    ),
    "entry_point": "add",
}
AUX = "def aux(a, b):\n    return a + b"


@pytest.fixture(scope="module")
def env():
    return get_environment("humaneval", num_turns=1, test_timeout_s=0.5)


def score(env, aux, main, row=ROW):
    return env.reward_details([aux], [main], batch_items=[row])[0]


def test_level_1_definitions(env):
    # no main: +0.4 for aux only, then stop
    assert score(env, AUX, "print('no function')")["reward"] == pytest.approx(0.4)
    # neither: 0
    assert score(env, "", "")["reward"] == 0.0
    # a main without "return " is not defined
    d = score(env, AUX, "def add(a, b):\n    pass")
    assert d["reward"] == pytest.approx(0.4) and d["main_defined"] == 0.0


def test_level_2_syntax(env):
    # both defined (0.4 + 0.6) but the combination does not parse: 1.0, stop
    d = score(env, AUX, "def add(a, b):\n    return a +")
    assert (d["level_1"], d["level_2"], d["reward"]) == (pytest.approx(1.0), 0.0, pytest.approx(1.0))


def test_level_3_tests_without_aux(env):
    # main only: 0.6 + syntax 0.5 + 4/4 tests (the "assert(" line is not collected) = 2.1; no aux -> no bonus
    d = score(env, "", "def add(a, b):\n    return a + b")
    assert (d["passed_tests"], d["total_tests"]) == (4, 4)
    assert d["reward"] == pytest.approx(0.6 + 0.5 + 1.0)
    # a - b passes only candidate(0, 0) == 0 (1 - 2, -1 - 1 and 0.5 - 0.25 miss): 1/4
    d = score(env, AUX, "def add(a, b):\n    return a - b")
    assert d["passed_tests"] == 1 and d["level_3"] == pytest.approx(0.25)
    # a test passed and aux exists, but main does not call aux: no cooperation bonus
    assert d["level_4"] == 0.0 and d["reward"] == pytest.approx(1.0 + 0.5 + 0.25)


def test_level_4_cooperation(env):
    wrapper = "def add(a, b):\n    total = aux(a, b)\n    return total"
    d = score(env, AUX, wrapper)
    # 1.0 + 0.5 + 1.0 + 0.5 (calls aux); assign-then-return is a thin wrapper: no +1.0
    assert d["is_wrapper"] == 1.0 and d["level_4"] == pytest.approx(0.5) and d["reward"] == pytest.approx(3.0)
    worker = "def add(a, b):\n    total = aux(a, b)\n    total = total + 0\n    return total"
    d = score(env, AUX, worker)
    assert d["level_4"] == pytest.approx(1.5) and d["reward"] == pytest.approx(4.0)
    assert d["reward"] == pytest.approx(sum(d[f"level_{k}"] for k in range(1, 5)))


def test_ignored_aux_result_quirk_and_its_fix():
    main = "def add(a, b):\n    aux(a, b)\n    return a + b"
    original = get_environment("humaneval", num_turns=1)
    # the original's pattern needs "aux" + one space + "(" + one character + ")": it does not see "aux(a, b)"
    d = score(original, AUX, main)
    assert d["ignored_aux_call"] == 0.0 and d["reward"] == pytest.approx(4.0)
    fixed = get_environment("humaneval", num_turns=1, fix_ignored_aux_call=True)
    d = score(fixed, AUX, main)
    assert d["ignored_aux_call"] == 1.0 and d["reward"] == pytest.approx(3.5)
    # the one shape the original does penalise
    d = score(original, "def aux(a, b=0):\n    return a + b", "def add(a, b):\n    aux (a)\n    return a + b")
    assert d["ignored_call_penalty"] == -0.5 and d["reward"] == pytest.approx(3.5)


def test_wrapper_docstring_quirk_and_its_fix():
    main = 'def add(a, b):\n    """Add.\n    Two numbers.\n    """\n    total = aux(a, b)\n    total = total + 0\n    return total'
    # the original never leaves a docstring closed by a stand-alone quote line: empty body -> "wrapper"
    d = score(get_environment("humaneval", num_turns=1), AUX, main)
    assert d["is_wrapper"] == 1.0 and d["reward"] == pytest.approx(3.0)
    d = score(get_environment("humaneval", num_turns=1, fix_wrapper_check=True), AUX, main)
    assert d["is_wrapper"] == 0.0 and d["reward"] == pytest.approx(4.0)


def test_assert_pre_evaluation_quirk_and_its_fix():
    # a candidate that alternates 3, 0, 3, 0 ... between calls
    main = (
        "def add(a, b):\n    global calls\n    calls = globals().get('calls', 0) + 1\n"
        "    return aux(a, b) if calls % 2 else 0"
    )
    row = dict(ROW, test="def check(candidate):\n" + "    assert candidate(1, 2) == 3\n" * 2 + "    assert candidate(2, 2) == 4\n")
    # original: each assert first evaluates add(1, 2) (odd call: 3), then the assert's own call is even -> 0: all fail
    d = score(get_environment("humaneval", num_turns=1), AUX, main, row)
    assert d["total_tests"] == 2  # duplicates are dropped: two distinct asserts
    assert d["passed_tests"] == 0
    # fixed: one call per assert: call 1 -> 3 (pass), call 2 -> 0 (fail)
    d = score(get_environment("humaneval", num_turns=1, fix_assert_pre_evaluation=True), AUX, main, row)
    assert d["passed_tests"] == 1


def test_timeouts_and_hostile_code_get_no_test_credit(env):
    looping = "def add(a, b):\n    while True:\n        pass\n    return 0"
    d = score(env, AUX, looping)
    # 3 timeouts stop the run: 0/4 -> the static levels only (0.4 + 0.6 + 0.5)
    assert (d["passed_tests"], d["timeouts"]) == (0, 3) and d["reward"] == pytest.approx(1.5)
    for body in ("import os\n    os.fork()", "import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)",
                 "import socket\n    socket.create_connection(('127.0.0.1', 22))", "import sys\n    sys.exit(0)"):
        d = score(env, AUX, f"def add(a, b):\n    {body}\n    return a + b")
        assert d["passed_tests"] == 0 and d["level_3"] == 0.0 and d["reward"] == pytest.approx(1.5), body
    d = score(env, AUX, "import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b")
    assert d["passed_tests"] == 4  # top-level lines outside functions are dropped by the cleaner, as in the original


def test_batch_is_index_aligned_and_scored_once(env, monkeypatch):
    runs = []
    original = env.sandbox.run_many

    def counting(jobs):
        runs.append(len(jobs))
        return original(jobs)

    monkeypatch.setattr(env.sandbox, "run_many", counting)
    mains = ["def add(a, b):\n    return a + b", "nothing", "def add(a, b):\n    return a * b"]
    rewards = env.reward_func([AUX] * 3, mains, batch_items=[ROW])
    # 2.1 + 0.4 = 2.5 (aux + main + syntax + 4/4, no call of aux); 0.4; 1.5 + 1/4 (0 * 0 == 0 only)
    assert rewards == pytest.approx([2.5, 0.4, 1.75])
    assert runs == [2]  # the two candidates that reach the tests, in one parallel batch
    details = env.reward_details([AUX] * 3, mains, batch_items=[ROW])
    assert [d["reward"] for d in details] == rewards and runs == [2]  # cached: no second run
    rows = [ROW, dict(ROW, entry_point="mul", prompt="def mul(a, b):\n    pass\n"), ROW]
    assert env.reward_func([AUX] * 3, mains, batch_items=rows)[1] == pytest.approx(0.4)
