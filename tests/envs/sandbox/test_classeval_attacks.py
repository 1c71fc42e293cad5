"""ClassEval forgeries through the public reward API: a wrong class plus a trick scores no more than the wrong class.

In the task repository the class and its unittest tests share one module and one process, so an
object that equals everything, a patched ``unittest``, a module global that shadows the test's
helper, or a method that answers with the object itself pass tests they should fail. Here the class
runs in the sandbox and the tests in the checker, which sees only proxies of the candidate's
objects: each attack below is the wrong twin's class (the same methods, answering wrongly: 2 of
the 11 tests pass) plus the trick, scored in one ``reward_func`` batch with the twin and the right
class (6.0), on every isolation level. The ClassEval-specific ones: ``__eq__`` / ``__bool__``
forgeries, attributes that shadow the test's helpers or the proxy's own names, methods that return
the object itself or a proxy of everything, StopIteration / SystemExit / KeyboardInterrupt /
GeneratorExit from methods, an ``__init__`` that floods its output, forged replies to the new
attribute requests, and a class that reads the bundled solutions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

import pytest

from comlrl.envs import get_environment
from comlrl.envs.coding.classeval import scoring

from tests.envs.sandbox.test_protocol import TRUE_FOR_EVERYTHING, patch
from tests.helpers.sandbox_attacks import LEVELS

SKELETON = '''class TallyCounter:
    """
    Counts named events.
    """

    def __init__(self):
        """
        Start with no counts: counts maps a name to how often it was bumped.
        """

    def bump(self, name):
        """
        Count one more event of a name.
        :return: int, the name's count afterwards
        """

    def has(self, name):
        """
        :return: bool, whether the name was ever bumped
        """

    def names(self):
        """
        :return: list of str, the names bumped, in alphabetical order
        """

    def total(self):
        """
        :return: int, the number of events counted
        """
'''
TESTS = '''import unittest


def expected_names():
    return ['a', 'b']


class TallyCounterTestBump(unittest.TestCase):
    def setUp(self):
        self.counter = TallyCounter()

    def test_bump_1(self):
        self.assertEqual(self.counter.bump('a'), 1)
        self.assertEqual(self.counter.bump('a'), 2)

    def test_bump_2(self):
        self.counter.bump('b')
        self.assertEqual(self.counter.counts, {'b': 1})


class TallyCounterTestHas(unittest.TestCase):
    def test_has_1(self):
        counter = TallyCounter()
        counter.counts = {'a': 1}
        self.assertTrue(counter.has('a'))

    def test_has_2(self):
        self.assertFalse(TallyCounter().has('z'))

    def test_has_3(self):
        self.assertIs(TallyCounter().has('z'), False)


class TallyCounterTestNames(unittest.TestCase):
    def test_names_1(self):
        counter = TallyCounter()
        counter.counts = {'b': 1, 'a': 2}
        self.assertEqual(counter.names(), expected_names())

    def test_names_2(self):
        counter = TallyCounter()
        counter.counts = {'b': 1, 'a': 2}
        self.assertEqual([name for name in counter.names()], ['a', 'b'])

    def test_names_3(self):
        self.assertEqual(len(TallyCounter().names()), 0)


class TallyCounterTestTotal(unittest.TestCase):
    def test_total_1(self):
        counter = TallyCounter()
        counter.counts = {'a': 2, 'b': 3}
        self.assertEqual(counter.total(), 5)

    def test_total_2(self):
        self.assertEqual(TallyCounter().total(), 0)

    def test_total_3(self):
        counter = TallyCounter()
        counter.counts = {'a': 2, 'b': 3}
        self.assertTrue(counter.total() == 5)
'''
ROW = {"task_id": "sandbox/tally", "class_name": "TallyCounter", "skeleton": SKELETON, "test": TESTS}

RIGHT = ("def __init__(self):\n    self.counts = {}\n\ndef names(self):\n    return sorted(self.counts)\n\n"
         "def total(self):\n    return sum(self.counts.values())",
         "def bump(self, name):\n    self.counts[name] = self.counts.get(name, 0) + 1\n    return self.counts[name]\n\n"
         "def has(self, name):\n    return name in self.counts")
INIT = "def __init__(self):\n    {setup}self.counts = {{}}\n"
WRONG = {  # the twin: has_1 (True) and names_3 (len of []) pass, nothing else
    "names": "def names(self):\n    {pre}return {value}sorted(self.counts, reverse=True){post}\n",
    "total": "def total(self):\n    {pre}return {value}sum(self.counts.values()) + 1{post}\n",
    "bump": "def bump(self, name):\n    {pre}return {value}0{post}\n",
    "has": "def has(self, name):\n    {pre}return {value}True{post}\n",
}
FORGED_END = "('end', rid, op) if op == 'getattr' else None"
ANYTHING = ("class Anything:\n        __eq__ = lambda s, o: True\n        __ne__ = lambda s, o: False\n        __hash__ = lambda s: 0\n"
            "        __bool__ = lambda s: True\n        __len__ = lambda s: 0\n        __iter__ = lambda s: iter(['a', 'b'])\n"
            "        __getattr__ = lambda s, n: s\n        __call__ = lambda s, *a, **k: s\n    ")


def hostile(setup: str = "", pre: str = "", value: str = "", post: str = "", class_level: str = "") -> tuple:
    """The twin's two completions with ``setup`` at the start of ``__init__``, ``pre`` before every
    other method's return, its answer replaced by ``value`` (when given), and ``class_level`` lines
    after the last method (padded into the class body by the merge)."""
    def method(name):
        text = WRONG[name].format(pre=pre, value="", post="")
        return text.replace("return ", "return " + value + " if True else ", 1) if value else text

    first = INIT.format(setup=setup) + "\n" + method("names") + "\n" + method("total") + class_level
    return first, method("bump") + "\n" + method("has")


ATTACKS = {
    # every answer an object equal to everything, true, empty, iterating like the right list
    "always_equal_answers": hostile(pre=ANYTHING, value="Anything()"),
    # a __bool__ that is not a bool, and one that raises
    "bool_that_forges": hostile(pre="class B:\n        __bool__ = lambda s: 1\n        __eq__ = lambda s, o: True\n    ", value="B()"),
    "bool_that_raises_stop_iteration": hostile(pre="class B:\n        __bool__ = lambda s: next(iter(()))\n    ", value="B()"),
    # methods answering with the object itself, whose class equals everything
    "returns_itself": hostile(value="self", class_level="__eq__ = lambda self, other: True\n__ne__ = lambda self, other: False\n"
                                                           "__hash__ = lambda self: 0\n__len__ = lambda self: 0\n"),
    # an object that is its own every attribute and call result
    "proxy_of_everything": hostile(pre=ANYTHING, value="Anything().counts.anything()"),
    # the test's names shadowed: unittest's asserts, the module's helper and builtins, at load and at call time
    "patch_unittest_asserts": hostile(setup="import unittest\n    for _n in ('assertEqual', 'assertTrue', 'assertFalse', 'assertIs'):\n"
                                            "        setattr(unittest.TestCase, _n, lambda *a, **k: None)\n    "),
    "shadow_the_test_helper": hostile(pre="globals()['expected_names'] = lambda: ['b', 'a']\n    "),
    "patch_builtins": hostile(setup="import builtins\n    builtins.AssertionError = StopIteration\n    builtins.len = lambda x: 0\n    "),
    # instance attributes named like the test's helpers and the proxy's own names
    "attributes_shadow_helpers_and_the_proxy": hostile(
        setup="self.expected_names = lambda: ['b', 'a']\n    self.assertEqual = None\n    self._sbx_link = None\n"
              "    self._sbx_handle = 0\n    self._link = self.kind = self._name = self.request = self\n    ",
        class_level="unittest = None\nTallyCounterTestNames = None\n"),
    # control-flow exceptions from methods: each an ordinary error of its test, the next tests still run
    "control_flow_from_methods": (INIT.format(setup="") + "\ndef names(self):\n    raise StopIteration\n\n"
                                  "def total(self):\n    raise GeneratorExit\n",
                                  "def bump(self, name):\n    raise SystemExit(0)\n\ndef has(self, name):\n    raise KeyboardInterrupt\n"),
    "iterator_that_stops_early": hostile(pre="class It:\n        __iter__ = lambda s: s\n        __next__ = lambda s: next(iter(()))\n    ",
                                         value="It()"),
    # 8 MiB on stdout and stderr from __init__, every time
    "init_floods_its_output": hostile(setup="import sys\n    for _i in range(128):\n        sys.stdout.write('x' * 65536)\n"
                                            "        sys.stderr.write('y' * 65536)\n    "),
    # the harness patched from __init__: every reply `True` (a value where setattr must answer None ...)
    "forged_true_to_every_request": hostile(setup=f"exec({patch(TRUE_FOR_EVERYTHING)!r})\n    "),
    "forged_end_to_every_getattr": hostile(setup=f"exec({patch(FORGED_END)!r})\n    "),
}


FORGE_IN_ONE_PROCESS = ("always_equal_answers", "bool_that_forges", "returns_itself", "proxy_of_everything", "patch_unittest_asserts",
                        "shadow_the_test_helper")
"""The attacks that pass more tests than the twin where the class and its tests share one module (the
task repository's runner): they are real forgeries there."""
ONE_PROCESS_RUNNER = ("\nimport sys as _s, unittest as _u\n_r = _u.TestResult()\n"
                      "_u.defaultTestLoader.loadTestsFromModule(_s.modules[__name__]).run(_r)\n"
                      "print(_r.testsRun - len(_r.failures) - len(_r.errors) - len(_r.skipped))\n")


def passed_in_one_process(joint: tuple) -> int:
    """Tests passed when the merged class and the test module run as one module, in a subprocess."""
    task = scoring.task_of(ROW, 2)
    program = scoring.merge_joint(task, list(joint)).code + "\n\n" + TESTS + ONE_PROCESS_RUNNER
    done = subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, text=True, timeout=120)
    return int(done.stdout.split()[-1])


@pytest.fixture(scope="module", params=LEVELS)
def scored(request):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = get_environment("classeval", num_turns=1, isolation=request.param, test_timeout_s=2.0, workers=2)
    joints = [RIGHT, hostile(), *ATTACKS.values()]
    details = env.reward_details([j[0] for j in joints], [j[1] for j in joints], batch_items=[ROW])
    return env, details[0], details[1], dict(zip(ATTACKS, details[2:]))


def test_the_right_class_scores_6_and_the_twin_2_of_11(scored):
    _, right, twin, _ = scored
    assert right["reward"] == 6.0
    # lv1 = 2 (5 of 5 methods), lv2 = 4 x 2/11 (has_1 and names_3), lv3 = 0
    assert [twin[k] for k in scoring.LEVEL_KEYS] == pytest.approx([2.0, 8 / 11, 0.0, 2.0 + 8 / 11])


def test_these_attacks_forge_where_class_and_tests_share_a_process():
    twin = passed_in_one_process(hostile())
    assert twin == 2 and passed_in_one_process(RIGHT) == 11
    for name in FORGE_IN_ONE_PROCESS:
        assert passed_in_one_process(ATTACKS[name]) > twin, name


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_classeval_forgery_scores_no_more_than_the_wrong_class(name, scored):
    _, _, twin, attacks = scored
    details = attacks[name]
    assert details["methods_valid"] == 5.0 and details["compiles"] == 1.0, details  # the merge kept every method
    assert details["reward"] <= twin["reward"], (name, details)
    assert details["tests_passed"] <= twin["tests_passed"], (name, details)


def test_control_flow_from_a_method_ends_only_its_test(scored):
    _, _, _, attacks = scored
    for name in ("control_flow_from_methods", "bool_that_raises_stop_iteration", "iterator_that_stops_early", "init_floods_its_output"):
        details = attacks[name]
        assert details["tests_run"] == 11.0 and details["tests_completed"] == 1.0, (name, details)


@pytest.mark.parametrize("level", LEVELS)
def test_a_flood_from_init_is_read_capped_and_the_job_ends(level):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = get_environment("classeval", num_turns=1, isolation=level, test_timeout_s=2.0)
    task = scoring.task_of(ROW, 2)
    merged = scoring.merge_joint(task, list(ATTACKS["init_floods_its_output"]))
    started = time.monotonic()
    report = env.sandbox.run(scoring.test_job(task, merged, scoring.TestSettings(2.0, 3)))
    assert time.monotonic() - started < 60 and report.completed
    limit = env.sandbox.limits.max_output_bytes
    assert 0 < len(report.stdout.encode()) <= limit and 0 < len(report.stderr.encode()) <= limit


def test_the_bundled_solutions_cannot_be_read():
    """A class that answers with the bundled sample's own solution, read from the package's file."""
    data = os.path.join(os.path.dirname(__import__("comlrl").__file__), "envs", "data", "classeval.json")
    with open(data) as handle:
        rows = json.load(handle)
    row = rows["train"][0]
    steal = ("def __init__(self, threshold=2):\n    import json, textwrap\n    self.stock, self.threshold = {}, threshold\n"
             f"    try:\n        found = json.load(open({data!r}))\n    except OSError:\n        return\n"
             "    ns = {}\n    exec(found['train'][0]['solution_code'], ns)\n    self.__class__ = ns['ShelfInventory']\n")
    skeleton = row["skeleton"].replace("        self.stock = {}\n        self.threshold = threshold\n", "")  # __init__ to write
    stolen = dict(row, skeleton=skeleton)
    env = get_environment("classeval", num_turns=1, isolation="bwrap", test_timeout_s=2.0)
    twin = "def __init__(self, threshold=2):\n    self.stock, self.threshold = {}, threshold\n"
    hostile_reward, twin_reward = env.reward_func(["", ""], [steal, twin], batch_items=[stolen])  # __init__(self, threshold): agent 2's
    assert hostile_reward <= twin_reward
    with open(data) as handle:
        assert json.load(handle) == rows  # unchanged
