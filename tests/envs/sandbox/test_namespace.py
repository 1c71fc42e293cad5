"""The asserts see the test module and the entry points, nothing else the candidate defines.

A wrong completion that also sets the names a test's loop uses, defines the helper the test calls
for its reference value, shadows the test's imports or builtins, smuggles extra names into its
load reply (by walking to the harness's frame, or by writing the reply itself) or does any of this
from the helper agent's code must score exactly what the wrong function alone scores; an honest
completion keeps the original's reward. First the rule itself on the ``Sandbox`` API, then the
attacks through the public reward and feedback APIs, in the forging suite's three placements.
"""

from __future__ import annotations

import warnings

import pytest

from comlrl.envs import get_environment
from comlrl.envs.sandbox import Sandbox, SandboxLimits, TestJob

from tests.helpers.sandbox_attacks import FRAME, LEVELS


@pytest.mark.parametrize("level", LEVELS)
def test_only_entry_points_are_visible_and_test_names_are_never_replaced(level):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sandbox = Sandbox(SandboxLimits(wall_time_s=20.0), isolation=level, workers=2)
    code = ("import math, os\nx = 41\nmath = None\nabs = lambda v: 0\ndef helper():\n    return 1\n"
            "def f(v):\n    global leaked\n    leaked = v\n    return helper() + v\ndef sorted(v):\n    return 'mine'\nlimit = 3\n")
    tests = ["assert f(1) == 2", "assert x == 41", "assert helper() == 1", "assert leaked == 1", "assert os.sep == '/'",
             "assert math.sqrt(4) == 2", "assert abs(-2) == 2", "assert sorted([2, 1]) == 'mine'", "assert limit == 3",
             "assert max([1, 2]) == 2"]
    report, shadowing = sandbox.run_many([
        TestJob(code=code, tests=tests, setup="import math", entry_points=("f", "sorted", "limit")),
        # an entry point that the test module also defines is the test module's
        TestJob(code="def math():\n    return 0", tests=["assert math.pi > 3"], setup="import math", entry_points=("math",)),
    ])
    assert report.loaded, report.load_error
    got = {test: (r.status, r.error_type) for test, r in zip(tests, report.results)}
    assert got == {
        "assert f(1) == 2": ("pass", None),  # the entry point, calling its own helper in its own globals
        "assert x == 41": ("fail", "NameError"), "assert helper() == 1": ("fail", "NameError"),
        "assert leaked == 1": ("fail", "NameError"), "assert os.sep == '/'": ("fail", "NameError"),
        "assert math.sqrt(4) == 2": ("pass", None),  # the test module's math, not the candidate's None
        "assert abs(-2) == 2": ("pass", None),  # the builtin
        "assert sorted([2, 1]) == 'mine'": ("pass", None),  # an entry point named like a builtin is the candidate's
        "assert limit == 3": ("pass", None),  # an entry point may hold plain data
        "assert max([1, 2]) == 2": ("pass", None),
    }
    assert [r.status for r in shadowing.results] == ["pass"]


@pytest.mark.parametrize("names", [(), "f", ("f", "not an identifier"), ("f", 3)])
def test_a_job_must_name_its_entry_points(names):
    with pytest.raises(ValueError, match="entry_points"):
        TestJob(code="def f():\n    return 1", tests=["assert f() == 1"], entry_points=names)


# ----------------------------------------------------------------------------- through the public reward API

ROW = {
    "task_id": "sandbox/add-names",
    "prompt": 'import math\n\n\ndef add(a, b):\n    """Return a + b."""\n',
    "test": (
        "def check(candidate):\n    def ref(a, b):\n        return a + b\n    assert candidate(1, 2) == 3\n"
        "    for x in range(3):\n        assert candidate(x, x) == x + x\n    assert candidate(2, 2) == ref(2, 2)\n"
        "    assert math.isclose(candidate(0.5, 0.25), 0.75)\n    assert abs(candidate(2, 3) - 5) < 1e-9\n    assert candidate(0, 0) == 0\n"
    ),
    "entry_point": "add",
}
"""The original runs only the assert lines: ``x`` (the loop's) and ``ref`` (the test's reference
helper) are undefined there, so an honest completion fails those two asserts, and a completion that
defined them decided the expected value itself."""
NAMES = "x=0, i=0, ref=lambda a, b: a - b, math=type('M', (), {'isclose': staticmethod(lambda *a, **k: True)}), abs=lambda v: 0"
ATTACKS = {
    "globals_for_the_loop_and_the_reference": f"globals().update({NAMES})",
    "globals_set_at_call_time": "None",
    "builtins_of_its_own_process": f"__import__('builtins').__dict__.update({NAMES})",
    "extra_names_through_the_harness_frame": (f"(globals().update({NAMES}), "
                                              "__import__('sys')._getframe(1).f_locals['exports'].extend(['x', 'ref', 'math', 'abs']))"),
    "forged_load_reply_with_extra_names": ("exec(" + repr(FRAME + "os.write(REPLY, frame(('value', 0, 'load', {'x': 0, 'i': 0}, [], {})))\n")
                                           + ")"),
    "replace_its_own_builtins_mapping": "globals().__setitem__('__builtins__', {'abs': lambda v: 0})",
}
AT_CALL = f"    global x, i, ref, math, abs\n    (x, i, ref, math, abs) = (lambda {NAMES}: (x, i, ref, math, abs))()\n"
TWIN = "def add(a, b, _f=None):\n    return a - b"
HONEST = "def add(a, b):\n    return a + b"
COOP_MAIN = "def add(a, b):\n    total = aux(a, b)\n    total = total + 0\n    return total"


def _hostile(name: str, function: str) -> str:
    body = AT_CALL if name == "globals_set_at_call_time" else ""
    return f"def {function}(a, b, _f={ATTACKS[name]}):\n{body}    return a - b"


@pytest.fixture(scope="module", params=LEVELS)
def scored(request):
    """{(attack, placement): (hostile reward, twin reward)}, plus the honest rewards."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = dict(num_turns=1, isolation=request.param, test_timeout_s=1.0, max_timeouts=2, wall_time_s=12.0)
        single = get_environment("humaneval", num_agents=1, **kwargs)
        coop = get_environment("coophumaneval", num_agents=2, **kwargs)
    names, out = list(ATTACKS), {}
    rewards = single.reward_func([_hostile(n, "add") for n in names] + [TWIN, HONEST], batch_items=[ROW])
    out.update({(n, "single"): (rewards[i], rewards[-2]) for i, n in enumerate(names)})
    honest = {"single": rewards[-1]}
    aux = "def aux(a, b):\n    return a + b"
    rewards = coop.reward_func([aux] * (len(names) + 2), [_hostile(n, "add") for n in names] + [TWIN, HONEST], batch_items=[ROW])
    out.update({(n, "two_agents_main"): (rewards[i], rewards[-2]) for i, n in enumerate(names)})
    honest["two_agents_main"] = rewards[-1]
    rewards = coop.reward_func([_hostile(n, "aux") for n in names] + [TWIN.replace("add", "aux"), aux], [COOP_MAIN] * (len(names) + 2),
                               batch_items=[ROW])
    out.update({(n, "two_agents_aux"): (rewards[i], rewards[-2]) for i, n in enumerate(names)})
    honest["two_agents_aux"] = rewards[-1]
    return request.param, out, honest


# 6 asserts: add(1, 2) == 3, add(x, x) == x + x, add(2, 2) == ref(2, 2), math.isclose(...), abs(...) < 1e-9, add(0, 0) == 0.
# The twin (a - b) passes the last only (1/6); the honest one (a + b) all but the two with undefined names (4/6).
TWINS = {"single": 1.1 + 1 / 6, "two_agents_main": 1.5 + 1 / 6, "two_agents_aux": 3.0 + 1 / 6}
HONEST_REWARDS = {"single": 1.1 + 4 / 6, "two_agents_main": 1.5 + 4 / 6, "two_agents_aux": 3.0 + 4 / 6}


@pytest.mark.parametrize("placement", list(TWINS))
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_names_of_the_completion_score_nothing(attack, placement, scored):
    level, results, honest = scored
    hostile, twin = results[(attack, placement)]
    assert twin == pytest.approx(TWINS[placement]) and honest[placement] == pytest.approx(HONEST_REWARDS[placement])
    assert hostile <= twin, f"{attack} ({placement}, {level}) scored {hostile} > {twin}"


def test_nor_do_they_change_the_feedback():
    env = get_environment("humaneval", num_turns=2, num_agents=1, external_mode="level_feedback", sandbox_slice="all", test_timeout_s=1.0)
    env.rows.add([ROW])
    prompts = []
    for main in (_hostile("globals_for_the_loop_and_the_reference", "add"), TWIN):
        (prompt,) = env.external_transition(prompt=ROW["prompt"], agent_completions=[main], num_agents=1,
                                            prompt_history_per_agent=[[ROW["prompt"]]], response_history_per_agent=[[main]])
        prompts.append(prompt[prompt.index("Diagnostics"):])
    assert prompts[0] == prompts[1]  # the same diagnostics as the plain wrong function
    assert "Tests: 1/6 passed" in prompts[0] and "NameError: name 'ref' is not defined" in prompts[0]
