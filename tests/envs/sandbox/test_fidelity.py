"""Honest code scores as if it ran in the trainer: the checker split changes no outcome.

The oracle is the original reward's own method, run here on benign code: ``exec`` the code in
fresh globals, then each assert (after evaluating ``name(args)`` and ``expected`` on their own, the
pre-evaluation) in the same globals. In the sandbox the asserts see only the test module and the
code's entry points: here the test module imports what the code imports (``job``), and the entry
points are the functions the code defines. Every case then goes through the sandbox in one batch, and each
assert's status, error type and message must be the oracle's. The cases cover what crosses the
boundary: generators and iterators, dict views, range, deque, Fraction, Decimal, sets, big ints,
NaN, in-place mutation of list and dict arguments, exceptions of every kind, custom objects,
helper functions, keyword arguments.
"""

from __future__ import annotations

import ast
import re
import shutil
import warnings

import pytest

from comlrl.envs.sandbox import Sandbox, TestJob

from tests.helpers.sandbox_attacks import LEVELS

CASES = [
    ("def f(n):\n    yield from range(n)", ["assert list(f(3)) == [0, 1, 2]", "assert f(2) == [0, 1]", "assert sum(f(4)) == 6",
                                           "assert next(f(5)) == 0", "assert sorted(f(3), reverse=True) == [2, 1, 0]", "assert 2 in f(3)"]),
    ("def f(l):\n    l.sort()\n    return l", ["assert f([3, 1, 2]) == [1, 2, 3]", "assert (lambda x: (f(x), x)[1])([2, 1]) == [1, 2]"]),
    ("def f(d, key='k'):\n    d[key] = 1", ["assert (lambda x: (f(x), x)[1])({}) == {'k': 1}", "assert f({}) is None",
                                            "assert (lambda x: (f({}, key=x), x)[1])('z') == 'z'"]),
    ("def f(x):\n    return {x: [x, (x,)], 'n': None, 'c': complex(1, x)}", ["assert f(2) == {2: [2, (2,)], 'n': None, 'c': 1+2j}"]),
    ("def f(x):\n    return x.keys()", ["assert sorted(f({'b': 1, 'a': 2})) == ['a', 'b']", "assert f({'a': 1}) == {'a'}",
                                       "assert list(f({'z': 0, 'y': 1})) == ['z', 'y']", "assert len(f({1: 1})) == 1"]),
    ("def f(x):\n    return x.items(), x.values()", ["assert f({'a': 1})[0] == {('a', 1)}", "assert list(f({'a': 1})[1]) == [1]",
                                                    "assert f({'a': 1})[1] == [1]"]),
    ("def f(x):\n    return range(x)", ["assert list(f(3)) == [0, 1, 2]", "assert f(3) == range(3)", "assert len(f(3)) == 3"]),
    ("import collections, fractions, decimal\ndef f(x):\n    return collections.deque([x]), fractions.Fraction(x, 4), decimal.Decimal('0.1') * x",
     ["assert f(2) == (collections.deque([2]), fractions.Fraction(1, 2), decimal.Decimal('0.2'))", "assert f(2)[1] == 0.5"]),
    ("def f(x):\n    raise KeyError(x)", ["assert f('a')", "assert f(1) == 2"]),
    ("def f(x):\n    return 1 / x", ["assert f(0) == 1", "assert f(2) == 0.5"]),
    ("import math\ndef f(x):\n    return math.sqrt(x)", ["assert math.isclose(f(2), 1.41421356, rel_tol=1e-6)", "assert abs(f(4) - 2) < 1e-9",
                                                       "assert f(-1) == 0"]),
    ("def f(s):\n    return s[::-1]", ["assert f('abc') == 'cba'", "assert f(b'ab') == b'ba'", "assert f([1, 2]) == [2, 1]", "assert f((1, 2)) == (2, 1)"]),
    ("def f(n):\n    return set(range(n))", ["assert f(3) == {0, 1, 2}", "assert f(0) == set()", "assert frozenset(f(2)) == frozenset({0, 1})"]),
    ("def f(n):\n    return 2 ** n", ["assert f(300) == 2 ** 300", "assert f(-1) == 0.5", "assert f(10) == 1000"]),
    ("def f(x):\n    return x is None", ["assert f(None)", "assert not f(0)", "assert f(None) is True"]),
    ("def f(x):\n    return float('nan')", ["assert f(1) != f(1)", "assert f(1) == f(1)"]),
    ("class C:\n    def __len__(self):\n        return 0\ndef f():\n    return C()", ["assert f() is not None", "assert not f()", "assert len(f()) == 0",
                                                                               "assert f() == f()"]),
    ("def f(*a, **k):\n    return (a, sorted(k))", ["assert f(1, 2, z=3, y=4) == ((1, 2), ['y', 'z'])"]),
    ("def g(x):\n    return x + 1\ndef f(x):\n    return g(x) * 2", ["assert f(1) == 4", "assert g(1) == 2", "assert f('a') == 1"]),
    ("def f():\n    return (i * i for i in range(4)), map(str, [1, 2]), zip('ab', [1, 2])",
     ["assert list(f()[0]) == [0, 1, 4, 9]", "assert 4 in f()[0]", "assert list(f()[1]) == ['1', '2']", "assert dict(f()[2]) == {'a': 1, 'b': 2}"]),
    ("def f(x):\n    assert x > 0, 'positive please'\n    return x", ["assert f(-1)", "assert f(1) == 1"]),
    ("def f(x):\n    return int(x)", ["assert f('12') == 12", "assert f('x') == 0", "assert f(None) == 0"]),
    ("def f(n):\n    return [[0] * n for _ in range(n)]", ["assert f(2) == [[0, 0], [0, 0]]", "assert f(0) == []"]),
    ("def f(s):\n    return s.split()", ["assert f('a b  c') == ['a', 'b', 'c']", "assert f('') == []"]),
    ("def f(x):\n    return undefined_name + x", ["assert f(1) == 2"]),
    ("def f(x):\n    return f(x + 1)", ["assert f(0) == 1"]),
    ("def f(x):\n    return True", ["assert f(1) == 1", "assert f(0) is True", "assert isinstance(f(0), bool)"]),
]
ASSERT_SHAPE = re.compile(r"assert\s+(\w+)\(([^)]*)\)\s*==\s*(.+)")


def job(code: str, tests) -> TestJob:
    """The sandbox job of a case: the code's functions are its entry points, its imports the test module's."""
    tree = ast.parse(code)
    functions = tuple(node.name for node in tree.body if isinstance(node, ast.FunctionDef))
    imports = "\n".join(ast.get_source_segment(code, node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))
    return TestJob(code=code, tests=tests, pre_evaluate=True, test_timeout_s=5.0, setup=imports, entry_points=functions)


def oracle(code: str, tests):
    """(status, error type, message) per assert, exactly as the original in-process reward would see them."""
    env: dict = {}
    exec(code, env)
    out = []
    for test in tests:
        try:
            shape = ASSERT_SHAPE.search(test)
            if shape:
                eval(f"{shape.group(1)}({shape.group(2)})", env)
                eval(shape.group(3), env)
            exec(test, env)
            out.append(("pass", None, None))
        except Exception as exc:  # noqa: BLE001 - the benign cases raise ordinary exceptions only
            out.append(("fail", type(exc).__name__, str(exc)[:300]))
    return out


@pytest.mark.parametrize("level", LEVELS)
def test_every_outcome_is_the_in_process_one(level):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sandbox = Sandbox(isolation=level, workers=2)
    reports = sandbox.run_many([job(code, tests) for code, tests in CASES])
    for (code, tests), report in zip(CASES, reports):
        assert report.loaded, (code, report.load_error)
        got = [(r.status, r.error_type, r.error_message) for r in report.results]
        for test, mine, theirs in zip(tests, got, oracle(code, tests)):
            assert mine == theirs, f"{code!r}: {test}"
    assert sum(len(tests) for _, tests in CASES) >= 70


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
def test_the_canonical_solutions_pass_every_assert():
    from comlrl.envs.coding.rewards import CodeQuirkFixes, static_part
    import json
    import os

    jobs = []
    for name in ("humaneval", "coophumaneval", "mbpp"):
        path = os.path.join(os.path.dirname(__import__("comlrl").__file__), "envs", "data", f"{name}.json")
        with open(path) as handle:
            data = json.load(handle)
        for row in data["train"] + data["eval"]:
            jobs.append(static_part("", row["prompt"] + row["canonical_solution"], row, CodeQuirkFixes(), 5.0, 3).job)
    reports = Sandbox(isolation="bwrap", workers=2).run_many(jobs)
    assert [(r.passed, r.total) for r in reports] == [(len(j.tests), len(j.tests)) for j in jobs]
