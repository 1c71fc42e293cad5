"""The typed protocol: no reply the candidate sends is anything but a valid answer to the request it answers.

The candidate's code runs in the harness's process, so it can rewrite the harness and answer each
request with any frame it likes (``forge``: the harness's ``Server.answer`` replaced from the
candidate's code, the real answer at hand). Each forgery below is a reply that is *not* a valid
answer to its request -- an end of iteration to a call (which used to become StopIteration in
the checker, so ``all(map(...))`` passed), a reply to another request, a length or truth value of
the wrong type, mutated arguments that were not passed, an exception name or message out of
bounds, extra fields, unknown kinds -- and each must fail the assert it answers with
``ProtocolViolation`` and end the job (the rest not run). The same forgeries then go through the
public reward API in the three placements of the forging suite (single agent, two-agent entry
point, CoopHumanEval's helper called by the entry point) next to their wrong twins: none may score
more, and nothing a candidate raises (StopIteration, GeneratorExit, ...) is control flow.
"""

from __future__ import annotations

import warnings

import pytest

from comlrl.envs import get_environment
from comlrl.envs.sandbox import Sandbox, SandboxLimits, TestJob

from tests.helpers.sandbox_attacks import FRAME, LEVELS

PATCH = (
    "import __main__ as h\n"
    "_orig = h.Server.answer\n"
    "def answer(self, op, rid, target, args, kwargs, budget):\n"
    "    real = h.wire.decode(_orig(self, op, rid, target, args, kwargs, budget), make_ref=self.lookup)\n"
    "    forged = FORGE\n"
    "    return h.wire.encode(forged if forged is not None else real, self.as_ref)\n"
    "h.Server.answer = answer\n"
)
"""Candidate code that replaces the harness's answers: ``FORGE`` (an expression of ``op``, ``rid``,
``real`` -- the honest reply -- and ``self``, the server) is the reply sent, None: the real one."""


def patch(forge: str) -> str:
    return PATCH.replace("FORGE", forge)


CODE = (
    "class Bag:\n    size = 2\n    def __init__(self):\n        self.extra = 1\n"
    "    def __len__(self):\n        return 2\n    def __bool__(self):\n        return False\n"
    "    def __iter__(self):\n        return iter([1, 2])\n"
    "def bag():\n    return Bag()\n"
    "def f(n, out=None):\n    if out is not None:\n        out.append(n)\n    return n - 1\n"
    "def g(n):\n    return (i for i in range(n))\n"
)
TESTS = [
    "assert f(1) == 0",
    "assert (lambda out: (f(3, out), out)[1])([]) == [3]",
    "assert list(g(3)) == [0, 1, 2]",
    "assert len(bag()) == 2",
    "assert not bag()",
    "assert list(bag()) == [1, 2]",
    "assert bag().size == 2",
    "assert (lambda b: (setattr(b, 'size', 5), b.size)[1])(bag()) == 5",
    "assert (lambda b: (delattr(b, 'extra'), hasattr(b, 'extra'))[1])(bag()) is False",
    "assert all(map(lambda n: f(n) == n, [1, 2]))",
]
# name -> (the forged reply, the first assert it answers; list() asks a length first, as a length hint,
# which swallows a TypeError but not the violation)
FORGED = {
    "end_to_a_call": ("('end', rid, op) if op == 'call' else None", 0),
    "end_to_a_call_claiming_next": ("('end', rid, 'next') if op == 'call' else None", 0),
    "value_to_another_request_id": ("('value', rid + 1, op, real[3], [], {}) if op == 'call' else None", 0),
    "value_to_an_earlier_request_only": ("('value', 0, op, real[3], [], {}) if op == 'call' else None", 0),
    "reply_without_its_request": ("('value', rid) if op == 'call' else None", 0),
    "reply_that_is_not_a_tuple": ("[real] if op == 'call' else None", 0),
    "unknown_reply_kind": ("('pass', rid, op) if op == 'call' else None", 0),
    "extra_field": ("real + ('extra',) if op == 'call' else None", 0),
    "mutated_argument_not_passed": ("('value', rid, op, real[3], [(5, [1])], {}) if op == 'call' else None", 0),
    "mutated_argument_of_another_type": ("('value', rid, op, real[3], [(0, [0])], {}) if op == 'call' else None", 0),
    "mutated_keyword_not_passed": ("('value', rid, op, real[3], [], {'out': [3]}) if op == 'call' else None", 0),
    "mutated_argument_twice": ("('value', rid, op, real[3], real[4] * 2, {}) if op == 'call' and real[4] else None", 1),
    "exception_name_not_an_identifier": ("('raised', rid, op, 'Stop Iteration', '') if op == 'call' else None", 0),
    "exception_message_too_long": ("('raised', rid, op, 'ValueError', 'x' * 301) if op == 'call' else None", 0),
    "exception_name_too_long": ("('raised', rid, op, 'E' * 81, '') if op == 'call' else None", 0),
    "unsendable_reason_not_text": ("('unsendable', rid, op, 3) if op == 'call' else None", 0),
    "next_answered_with_a_return_of_the_call_kind": ("('value', rid, 'call', 0, [], {}) if op == 'next' else None", 2),
    "next_with_a_mutation": ("('value', rid, op, 0, [(0, [])], {}) if op == 'next' else None", 2),
    "len_negative": ("('value', rid, op, -1, [], {}) if op == 'len' else None", 2),
    "len_a_bool": ("('value', rid, op, True, [], {}) if op == 'len' else None", 2),
    "len_beyond_maxsize": ("('value', rid, op, 2 ** 70, [], {}) if op == 'len' else None", 2),
    "len_a_float": ("('value', rid, op, 2.0, [], {}) if op == 'len' else None", 2),
    "len_unsendable": ("('unsendable', rid, op, 'no') if op == 'len' else None", 2),
    "len_end": ("('end', rid, op) if op == 'len' else None", 2),
    "bool_an_int": ("('value', rid, op, 0, [], {}) if op == 'bool' else None", 4),
    "bool_a_string": ("('value', rid, op, '', [], {}) if op == 'bool' else None", 4),
    "iter_a_plain_list": ("('value', rid, op, [1, 2], [], {}) if op == 'iter' else None", 5),
    "iter_a_function": ("('value', rid, op, self.as_ref(len), [], {}) if op == 'iter' else None", 5),
    "iter_end": ("('end', rid, op) if op == 'iter' else None", 5),
    "getattr_end": ("('end', rid, op) if op == 'getattr' else None", 6),
    "getattr_answered_as_a_call": ("('value', rid, 'call', 2, [], {}) if op == 'getattr' else None", 6),
    "getattr_with_a_mutation": ("('value', rid, op, 2, [(0, [])], {}) if op == 'getattr' else None", 6),
    "setattr_answers_a_value": ("('value', rid, op, True, [], {}) if op == 'setattr' else None", 7),
    "setattr_unsendable": ("('unsendable', rid, op, 'no') if op == 'setattr' else None", 7),
    "delattr_answers_a_value": ("('value', rid, op, 0, [], {}) if op == 'delattr' else None", 8),
    "delattr_end": ("('end', rid, op) if op == 'delattr' else None", 8),
}


@pytest.fixture(scope="module", params=LEVELS)
def reports(request):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sandbox = Sandbox(SandboxLimits(wall_time_s=20.0), isolation=request.param, workers=2)
    jobs = [TestJob(code=CODE, tests=TESTS, entry_points=("f", "g", "bag"), test_timeout_s=2.0)]
    jobs += [TestJob(code=f"exec({patch(forge)!r})\n" + CODE, tests=TESTS, entry_points=("f", "g", "bag"), test_timeout_s=2.0)
             for forge, _ in FORGED.values()]
    done = sandbox.run_many(jobs)
    return done[0], dict(zip(FORGED, done[1:]))


def test_the_honest_harness_answers_every_request(reports):
    honest, _ = reports
    # f(1) == 0 and the mutation pass; the generator, len, bool and iter answers are right; an attribute is read,
    # set and deleted; f(n) == n fails honestly
    assert [r.status for r in honest.results] == ["pass"] * 9 + ["fail"]
    assert honest.results[9].error_type == "AssertionError" and honest.completed


@pytest.mark.parametrize("name", list(FORGED))
def test_a_reply_that_answers_nothing_fails_the_assert_and_ends_the_job(name, reports):
    _, forged = reports
    report, first = forged[name], FORGED[name][1]
    statuses = [r.status for r in report.results]
    assert statuses[:first] == ["pass"] * first, (name, report.results)
    assert statuses[first] == "fail" and report.results[first].error_type == "ProtocolViolation", (name, report.results[first])
    assert statuses[first + 1:] == ["not run"] * (len(TESTS) - first - 1), name
    assert report.termination.startswith("candidate: protocol violation"), report.termination


def test_every_request_kind_is_attacked():
    assert len(FORGED) >= 25
    for op in ("call", "next", "len", "bool", "iter", "getattr", "setattr", "delattr"):
        assert any(f"op == '{op}'" in forge for forge, _ in FORGED.values()), op


@pytest.mark.parametrize("level", LEVELS)
def test_valid_answers_of_every_kind_still_mean_what_they_mean(level):
    """A candidate's own exceptions keep their builtin type (AssertionError, KeyError ...), except
    the control-flow ones, which are ordinary errors; a timeout answer counts as a timeout."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sandbox = Sandbox(SandboxLimits(wall_time_s=20.0), isolation=level, workers=2)
    raising = "def f(kind):\n    raise {'stop': StopIteration, 'exit': SystemExit, 'gen': GeneratorExit, 'kbd': KeyboardInterrupt, 'key': KeyError}[kind]('m')"
    tests = ["assert all(map(f, ['stop']))", "assert not any(map(f, ['stop']))", "assert [x for x in map(f, ['stop'])] == []",
             "assert all(map(f, ['exit']))", "assert all(map(f, ['gen']))", "assert all(map(f, ['kbd']))", "assert f('key')"]
    timing_out = patch("('timeout', rid, op) if op == 'call' else None")
    report, timed = sandbox.run_many([
        TestJob(code=raising, tests=tests, entry_points=("f",)),
        TestJob(code=f"exec({timing_out!r})\ndef f(n):\n    return n", tests=["assert f(1) == 1"] * 2 + ["assert True"], max_timeouts=2,
                entry_points=("f",)),
    ])
    assert [r.status for r in report.results] == ["fail"] * len(tests)
    assert [r.error_type for r in report.results] == ["StopIteration"] * 3 + ["SystemExit", "GeneratorExit", "KeyboardInterrupt", "KeyError"]
    assert [r.status for r in timed.results] == ["timeout", "timeout", "not run"]  # a timeout answer is a timeout, as counted


@pytest.mark.parametrize("level", LEVELS)
def test_a_reply_that_is_slow_to_decode_times_out_its_assert(level):
    """A valid answer built to be slow on the checker's side (a set of 200,000 ints with one hash:
    quadratic to rebuild) is decoded under the assert's alarm: the assert times out, the job goes on."""
    flood = FRAME + (
        "import __main__ as h\nitem = lambda k: b'i' + struct.pack('>I', 10) + (k * (2 ** 61 - 1)).to_bytes(10, 'big', signed=True)\n"
        "colliding = b'S' + struct.pack('>I', 200000) + b''.join(item(k) for k in range(200000))\n"
        "h.Server.answer = lambda self, op, rid, *a: t(s(b'value'), i(rid), s(op.encode()), colliding, b'l' + bytes(4), b'd' + bytes(4))\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sandbox = Sandbox(SandboxLimits(wall_time_s=30.0), isolation=level)
    report = sandbox.run(TestJob(code=f"exec({flood!r})\ndef f():\n    return 0", tests=["assert f() == {0}", "assert True"],
                                 test_timeout_s=0.5, entry_points=("f",)))
    assert [r.status for r in report.results] == ["timeout", "pass"] and report.completed, report


# ----------------------------------------------------------------------------- through the public reward API

ROW = {
    "task_id": "sandbox/add-protocol",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "test": (
        "def check(candidate):\n    assert candidate(1, 2) == 3\n"
        "    assert all(map(lambda t: candidate(*t[0]) == t[1], [((1, 2), 3), ((2, 5), 7)]))\n"
        "    assert not any(map(lambda t: candidate(*t[0]) != t[1], [((3, 4), 7), ((0, 1), 1)]))\n"
        "    assert sum(1 for _ in filter(lambda t: candidate(*t) != sum(t), [(1, 1), (2, 3)])) == 0\n"
        "    assert [candidate(*t) for t in zip(range(3), range(3))] == [0, 2, 4]\n"
        "    assert candidate(0, 0) == 0\n"
    ),
    "entry_point": "add",
}
"""Asserts that iterate over the candidate's answers: a forged end of iteration would pass the
second, third and fourth (``all`` / ``any`` / ``sum`` over nothing)."""
TRUE_FOR_EVERYTHING = "('value', rid, op, True, [], {})"
ATTACKS = {
    "end_of_iteration_to_every_call": f"exec({patch(FORGED['end_to_a_call'][0])!r})",
    "end_of_iteration_claiming_next": f"exec({patch(FORGED['end_to_a_call_claiming_next'][0])!r})",
    "forged_true_to_every_request": f"exec({patch(TRUE_FOR_EVERYTHING)!r})",
    "replies_sent_ahead_for_every_id": "exec(" + repr(FRAME + "os.write(REPLY, b''.join(frame(('end', k, 'call')) for k in range(1, 64)))\n") + ")",
    "raise_stop_iteration_itself": "None",
}
TWIN = "def add(a, b, _f=None):\n    return a - b"
COOP_MAIN = "def add(a, b):\n    total = aux(a, b)\n    total = total + 0\n    return total"


def _hostile(name: str, function: str) -> str:
    body = "    raise StopIteration\n" if name == "raise_stop_iteration_itself" else ""
    return f"def {function}(a, b, _f={ATTACKS[name]}):\n{body}    return a - b"


@pytest.fixture(scope="module", params=LEVELS)
def scored(request):
    """{(attack, placement): (hostile reward, twin reward)}, each placement's completions in one batch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = dict(num_turns=1, isolation=request.param, test_timeout_s=1.0, max_timeouts=2, wall_time_s=12.0,
                      fix_assert_pre_evaluation=True)  # each assert as written (the regex split breaks the map asserts)
        single = get_environment("humaneval", num_agents=1, **kwargs)
        coop = get_environment("coophumaneval", num_agents=2, **kwargs)
    out = {}
    names = list(ATTACKS)
    rewards = single.reward_func([_hostile(n, "add") for n in names] + [TWIN], batch_items=[ROW])
    out.update({(n, "single"): (rewards[i], rewards[-1]) for i, n in enumerate(names)})
    aux = "def aux(a, b):\n    return a + b"
    rewards = coop.reward_func([aux] * (len(names) + 1), [_hostile(n, "add") for n in names] + [TWIN], batch_items=[ROW])
    out.update({(n, "two_agents_main"): (rewards[i], rewards[-1]) for i, n in enumerate(names)})
    rewards = coop.reward_func([_hostile(n, "aux") for n in names] + [TWIN.replace("add", "aux")], [COOP_MAIN] * (len(names) + 1),
                               batch_items=[ROW])
    out.update({(n, "two_agents_aux"): (rewards[i], rewards[-1]) for i, n in enumerate(names)})
    return request.param, out


# the twin (a - b) passes only add(0, 0) == 0: 1 of 6. Single: 0.6 + 0.5 + 1/6; two agents + 0.4 for aux;
# the helper placement: main calls aux and is no wrapper, so the one passed test adds 0.5 + 1.0
TWINS = {"single": 1.1 + 1 / 6, "two_agents_main": 1.5 + 1 / 6, "two_agents_aux": 3.0 + 1 / 6}


@pytest.mark.parametrize("placement", list(TWINS))
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_protocol_forgery_scores_no_more_than_the_wrong_answer(attack, placement, scored):
    level, results = scored
    hostile, twin = results[(attack, placement)]
    assert twin == pytest.approx(TWINS[placement])
    assert hostile <= twin, f"{attack} ({placement}, {level}) scored {hostile} > {twin}"
