"""unittest-style jobs (ClassEval): each test's outcome is the one the class and the tests would have in one process.

The reference runs the class and the test module as one module in a subprocess with unittest's own
loader and ``TestResult`` (a test passes unless it is among the failures, errors or skips; expected
failures and unexpected successes pass, as the task repository counts them). The sandbox runs the
class contained and the tests in the checker, against proxies: attribute reads, sets and deletes,
method calls, class attributes, static and class methods, objects passed back, identity,
iteration, properties, fixtures, skips, expected failures, subtests. Then the bundled sample's
classes, right and wrong, on both levels.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import pytest

from comlrl.envs.coding.classeval import scoring, source
from comlrl.envs.sandbox import Sandbox, SandboxLimits, TestJob

from tests.helpers.sandbox_attacks import LEVELS

CODE = '''
class Thing:
    UNIT = "cm"

    def __init__(self, value):
        self.value = value
        self.kind, self._name, self._link, self.request = "k", "n", "l", "r"

    def double(self):
        return self.value * 2

    def explode(self):
        raise KeyError("boom")

    def divide(self, by):
        return self.value / by

    def scaled(self, i):
        return self.value * i

    def close(self):
        self.closed = True

    @staticmethod
    def twice(x):
        return 2 * x

    @classmethod
    def make(cls, value):
        return cls(value)

    def add(self, other):
        return Thing(self.value + other.value)

    def me(self):
        return self

    def bump(self):
        self.value += 1

    def __iter__(self):
        return iter([self.value])

    def __len__(self):
        return 1

    @property
    def label(self):
        return f"thing-{self.value}"
'''
TESTS = '''
import unittest


class ThingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.shared = Thing(3)

    def setUp(self):
        self.thing = Thing(1)

    def tearDown(self):
        self.thing.close()

    def test_attribute(self):
        self.assertEqual(self.thing.value, 1)

    def test_method(self):
        self.assertEqual(self.thing.double(), 2)

    def test_class_fixture(self):
        self.assertEqual(self.shared.value, 3)

    def test_failure(self):
        self.assertEqual(self.thing.double(), 3)

    def test_error(self):
        self.thing.explode()

    def test_raises(self):
        with self.assertRaises(ZeroDivisionError):
            self.thing.divide(0)

    @unittest.skip("later")
    def test_skipped(self):
        pass

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(self.thing.value, 2)

    @unittest.expectedFailure
    def test_unexpected_success(self):
        self.assertEqual(self.thing.value, 1)

    def test_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(self.thing.scaled(i), 2)

    def test_getattr_default_and_hasattr(self):
        self.assertEqual(getattr(self.thing, "missing", "d"), "d")
        self.assertFalse(hasattr(self.thing, "missing"))

    def test_attribute_error(self):
        with self.assertRaises(AttributeError):
            self.thing.missing

    def test_names_like_the_proxys_own(self):
        self.assertEqual((self.thing.kind, self.thing._name, self.thing._link, self.thing.request), ("k", "n", "l", "r"))

    def test_set_and_delete(self):
        self.thing.value = 7
        self.assertEqual(self.thing.double(), 14)
        del self.thing.value
        self.assertFalse(hasattr(self.thing, "value"))

    def test_class_attribute_static_and_class_methods(self):
        self.assertEqual(Thing.UNIT, "cm")
        self.assertEqual(Thing.twice(4), 8)
        self.assertEqual(Thing.make(5).value, 5)

    def test_objects_cross_back(self):
        self.assertEqual(self.thing.add(Thing(4)).value, 5)

    def test_identity(self):
        self.assertIs(self.thing.me(), self.thing)
        self.assertIsNot(Thing(1), self.thing)

    def test_many_method_calls(self):
        for _ in range(4200):
            self.thing.bump()
        self.assertEqual(self.thing.value, 4201)

    def test_iteration_length_and_property(self):
        self.assertEqual(list(self.thing), [1])
        self.assertEqual(len(self.thing), 1)
        self.assertEqual(self.thing.label, "thing-1")

    def test_equality_is_the_objects(self):
        self.assertNotEqual(Thing(1), Thing(1))
'''
REFERENCE = '''
import json as _json, sys as _sys, unittest as _unittest
_result = _unittest.TestResult()
_suite = _unittest.defaultTestLoader.loadTestsFromModule(_sys.modules[__name__])
_suite.run(_result)
_bad = set()
for _test, _ in _result.failures + _result.errors + _result.skipped:
    _case = getattr(_test, "test_case", _test)
    _bad.add(type(_case).__name__ + "." + _case._testMethodName)
print(_json.dumps(_bad and sorted(_bad) or []))
'''


def in_one_process(code: str, tests: str, ids) -> list:
    """Each test's status when ``code`` and ``tests`` are one module (the reference)."""
    done = subprocess.run([sys.executable, "-I", "-c", code + "\n\n" + tests + REFERENCE], capture_output=True, text=True, timeout=300)
    failed = set(json.loads(done.stdout.splitlines()[-1]))
    return ["fail" if test_id in failed else "pass" for test_id in ids]


def sandbox(level: str) -> Sandbox:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Sandbox(SandboxLimits(wall_time_s=120.0), isolation=level, workers=2)


@pytest.mark.parametrize("level", LEVELS)
def test_every_outcome_is_the_one_process_one(level):
    ids = source.test_ids(TESTS)
    assert len(ids) == 20
    report = sandbox(level).run(TestJob(code=CODE, tests=ids, setup=TESTS, entry_points=("Thing",), style="unittest", test_timeout_s=30.0))
    expected = in_one_process(CODE, TESTS, ids)
    assert [r.status for r in report.results] == expected, [(i, r) for i, r in zip(ids, report.results)]
    by_id = dict(zip(ids, report.results))
    assert expected.count("fail") == 4  # failure, error, skip, a failing subtest
    assert by_id["ThingTest.test_error"].error_type == "KeyError" and by_id["ThingTest.test_skipped"].error_type == "SkipTest"
    assert by_id["ThingTest.test_failure"].error_type == "AssertionError" and report.completed


@pytest.mark.parametrize("level", LEVELS)
def test_a_failing_class_fixture_fails_its_tests_and_a_missing_test_fails(level):
    tests = ("import unittest\n\nclass Broken(unittest.TestCase):\n    @classmethod\n    def setUpClass(cls):\n"
             "        raise RuntimeError('fixture')\n    def test_a(self):\n        pass\n\n"
             "class Fine(unittest.TestCase):\n    def test_b(self):\n        self.assertEqual(Thing(2).value, 2)\n")
    ids = ["Broken.test_a", "Fine.test_b", "Fine.test_nothing", "Nowhere.test_c"]
    report = sandbox(level).run(TestJob(code=CODE, tests=ids, setup=tests, entry_points=("Thing",), style="unittest"))
    assert [r.status for r in report.results] == ["fail", "pass", "fail", "fail"]
    assert report.results[0].error_type == "RuntimeError" and report.results[3].error_type == "LookupError"


@pytest.mark.parametrize("level", LEVELS)
def test_the_tests_files_are_their_own_and_go_with_the_job(level, tmp_path, monkeypatch):
    """The checker runs a unittest job in a fresh directory of its own (a fixture writing a file lands
    there, not in /), which the class does not see and which is removed with the job."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = "import os\n\nclass Reader:\n    def exists(self, path):\n        return os.path.exists(path)\n"
    tests = ("import os\nimport unittest\n\nclass T(unittest.TestCase):\n    def test_a_write(self):\n"
             "        with open('probe.txt', 'w') as handle:\n            handle.write('x')\n"
             "        self.assertTrue(os.path.exists('probe.txt'))\n        self.assertNotEqual(os.getcwd(), '/')\n\n"
             "    def test_b_the_class_does_not_see_it(self):\n        self.assertFalse(Reader().exists('probe.txt'))\n")
    report = sandbox(level).run(TestJob(code=code, tests=["T.test_a_write", "T.test_b_the_class_does_not_see_it"], setup=tests,
                                        entry_points=("Reader",), style="unittest"))
    assert [r.status for r in report.results] == ["pass", "pass"], report.results
    assert list(tmp_path.iterdir()) == []


def test_a_unittest_job_is_checked():
    with pytest.raises(ValueError, match="ids 'TestClass.test_method'"):
        TestJob(code=CODE, tests=["assert Thing(1)"], setup=TESTS, entry_points=("Thing",), style="unittest")
    with pytest.raises(ValueError, match="pre_evaluate"):
        TestJob(code=CODE, tests=["A.test_a"], entry_points=("Thing",), style="unittest", pre_evaluate=True)
    with pytest.raises(ValueError, match="style must be 'assert' or 'unittest'"):
        TestJob(code=CODE, tests=[], entry_points=("Thing",), style="pytest")


def _mutants(row: dict) -> list:
    """The right class, and wrong ones: each method answering None in turn."""
    parts = source.partition(row["skeleton"], 2)
    methods = {m["method_name"]: textwrap.dedent(m["solution_code"]) for m in row["methods_info"]}
    joints = [methods]
    for name in methods:
        wrong = dict(methods)
        wrong[name] = wrong[name].split('"""', 2)[0] + '"""' + wrong[name].split('"""', 2)[1] + '"""\n    return None\n'
        joints.append(wrong)
    return [["\n\n".join(code for n, code in joint.items() if parts[n] == agent) for agent in (0, 1)] for joint in joints]


@pytest.mark.parametrize("level", LEVELS)
def test_the_sample_classes_score_as_in_one_process(level):
    from comlrl.envs import get_environment

    env = get_environment("classeval", num_turns=1, test_timeout_s=10.0)
    rows = list(env.load_dataset("train", offline=True)) + list(env.load_dataset("eval", offline=True))
    box = sandbox(level)
    compared = 0
    for row in rows:
        task = scoring.task_of(row, 2)
        merged = [scoring.merge_joint(task, joint) for joint in _mutants(row)]
        reports = box.run_many([scoring.test_job(task, m, scoring.TestSettings(10.0, 3)) for m in merged])
        for m, report in zip(merged, reports):
            assert [r.status for r in report.results] == in_one_process(m.code, row["test"], task.test_ids), row["class_name"]
            compared += len(task.test_ids)
    assert compared > 350
