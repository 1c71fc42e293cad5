"""Reward forging through the public API: a wrong function plus a trick must score no more than the wrong function.

The red team's one-line forgeries (patching the harness's assert runner from a default argument,
writing pass records to the result descriptor in ``sys.argv``, walking frames to the test, an
always-equal object, reading the bundled dataset) and variants, each in three placements: the
single agent's entry point (max 2.1), the two-agent entry point (max 2.5 without calling aux) and
the helper ``aux`` called by a cooperating entry point (max 4.0). Every hostile completion and its
wrong twin are scored in one ``reward_func`` batch per placement, on every isolation level: the
checker split has to hold on ``none`` too (it is opted into explicitly here; the attacks below
harm nothing outside the candidate's own process).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest

from comlrl.envs import get_environment

from tests.helpers.sandbox_attacks import FRAME, LEVELS, ROW, runtime_hashes

# name -> (default-argument expression run at load, statements run at call, returned expression)
FORGERIES = {
    "patch_the_harness_runner": ("exec(\"import __main__\\n__main__.run_assert = lambda *a, **k: None\\n"
                                 "if hasattr(__main__, 'Server'):\\n"
                                 "    __main__.Server.answer = lambda self, op, rid, *a: __main__.wire.encode(('value', rid, op, True, [], {}))\")",
                                 "", "a - b"),
    "pass_records_to_argv_fds": ("exec(" + repr(FRAME + "lines = b''.join(b'{\"event\": \"test\", \"i\": %d, \"status\": \"pass\"}\\n' % i for i in range(8))\n"
                                 "for fd in [int(x) for x in sys.argv[1:] if x.isdigit()] + list(range(20)):\n"
                                 "    for data in (b'{\"event\": \"load\", \"ok\": true}\\n' + lines, frame(('value', 0, 'load', {}, [], {})),\n"
                                 "                 b''.join(frame(('value', k, 'call', True, [], {})) for k in range(1, 12))):\n"
                                 "        try:\n            os.write(fd, data)\n        except OSError:\n            pass\n") + ")", "", "a - b"),
    "forged_replies_for_every_request": ("exec(" + repr(FRAME + "os.write(int(sys.argv[2]), b''.join(frame(('value', k, 'call', 3, [], {})) for k in range(1, 40)))\n") + ")",
                                         "", "a - b"),
    "walk_frames_to_the_test": ("None", "import sys, re\n_f, _seen = sys._getframe(), []\nwhile _f is not None:\n"
                                "    _seen += [repr(_f.f_locals), repr(_f.f_code.co_consts), repr(list(_f.f_globals))]\n    _f = _f.f_back\n"
                                "_m = [m for m in re.finditer(r'add\\(([^)]*)\\)\\s*==\\s*([-\\w.]+)', ' '.join(_seen)) if m.group(1).replace(' ', '') == '%r,%r' % (a, b)]\n"
                                "if _m:\n    return eval(_m[0].group(2))", "a - b"),
    "gc_search_for_the_test_source": ("None", "import gc, re\n_text = ' '.join(x for o in gc.get_objects() if isinstance(o, (list, tuple, dict))"
                                      " for x in (o.values() if isinstance(o, dict) else o) if isinstance(x, str) and 'assert' in x)\n"
                                      "_m = re.search(r'add\\(%r, %r\\) == ([-\\w.]+)' % (a, b), _text)\nif _m:\n    return eval(_m.group(1))", "a - b"),
    "always_equal_object": ("None", "class _Any:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n    __lt__ = __gt__ = __eq__\n"
                            "    __hash__ = lambda s: 0\n    __bool__ = lambda s: True\n    __sub__ = __rsub__ = __add__ = __radd__ = lambda s, o: s\n    __abs__ = lambda s: 0",
                            "_Any()"),
    "always_equal_int_subclass": ("None", "class _E(float):\n    __eq__ = lambda s, o: True\n    __hash__ = float.__hash__\n    __sub__ = lambda s, o: 0.0\n    __add__ = lambda s, o: s",
                                  "_E(a - b)"),
    "shadow_builtins_and_setup_names": ("globals().update(abs=lambda x: 0, all=lambda x: True, math=None, isinstance=lambda *a: True, "
                                        "AssertionError=None)", "", "a - b"),
    "patch_builtins_in_its_process": ("exec('import builtins\\nbuiltins.abs = lambda x: 0\\nbuiltins.AssertionError = StopIteration')", "", "a - b"),
    "return_a_function_or_generator": ("None", "", "(lambda *x: True) if a else (x for x in [0])"),
    "forged_records_on_stdout": ("print('{\"event\": \"test\", \"i\": 0, \"status\": \"pass\"}', '{\"event\": \"done\"}')", "", "a - b"),
    "control_flow_exceptions": ("None", "if (a, b) != (0, 0):\n    raise [StopIteration, SystemExit, KeyboardInterrupt, GeneratorExit][a % 4]()", "a - b"),
    "exit_after_first_answer": ("[]", "_f.append(1)\nif len(_f) > 2:\n    import os\n    os._exit(0)", "a - b"),
    "nan_and_infinity": ("None", "", "float('nan') if a else float('inf')"),
    "stop_itself": ("[]", "_f.append(1)\nif len(_f) > 2:\n    import os, signal\n    os.kill(os.getpid(), signal.SIGSTOP)", "a - b"),
    "exception_of_an_odd_type": ("None", "class AssertionError(StopIteration):\n    __str__ = lambda s: 1 / 0\n"
                                 "if (a, b) != (0, 0):\n    raise AssertionError()", "a - b"),
    "an_iterator_that_never_ends": ("None", "import itertools", "itertools.count() if (a, b) != (0, 0) else 0"),
    "late_reply_after_the_checker_gave_up": ("[]", "import signal, time\nif not _f:\n    _f.append(1)\n"
                                             "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    time.sleep(1.2)\n    return a + b", "a - b"),
}
COOP_MAIN = "def add(a, b):\n    total = aux(a, b)\n    total = total + 0\n    return total"


def _function(name: str, default: str, body: str, returned: str) -> str:
    lines = [f"def {name}(a, b, _f={default}):"] + ["    " + line for line in body.splitlines()] + [f"    return {returned}"]
    return "\n".join(lines)


def _placements(name: str):
    """(agents, aux, main) of the hostile completion and of its twin, per placement."""
    default, body, returned = FORGERIES[name]
    twin = "def add(a, b, _f=None):\n    return a - b"
    return {
        "single": ((1, None, _function("add", default, body, returned)), (1, None, twin)),
        "two_agents_main": ((2, "def aux(a, b):\n    return a + b", _function("add", default, body, returned)),
                            (2, "def aux(a, b):\n    return a + b", twin)),
        "two_agents_aux": ((2, _function("aux", default, body, returned), COOP_MAIN), (2, "def aux(a, b, _f=None):\n    return a - b", COOP_MAIN)),
    }


@pytest.fixture(scope="module", params=LEVELS)
def scored(request):
    """{(forgery, placement): (hostile reward, twin reward)} at one isolation level."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        envs = {agents: get_environment("humaneval", num_turns=1, num_agents=agents, isolation=request.param, test_timeout_s=0.5,
                                        max_timeouts=2, wall_time_s=10.0) for agents in (1, 2)}
    out = {}
    for agents in (1, 2):
        keys, auxes, mains = [], [], []
        for name in FORGERIES:
            for placement, (hostile, twin) in _placements(name).items():
                if hostile[0] == agents:
                    keys.append((name, placement))
                    for _agents, aux, main in (hostile, twin):
                        auxes.append(aux)
                        mains.append(main)
        args = (mains,) if agents == 1 else (auxes, mains)
        rewards = envs[agents].reward_func(*args, batch_items=[ROW] * len(mains))
        out.update({key: (rewards[2 * i], rewards[2 * i + 1]) for i, key in enumerate(keys)})
    return request.param, out


TWIN = {"single": 1.35, "two_agents_main": 1.75, "two_agents_aux": 3.25}


@pytest.mark.parametrize("placement", list(TWIN))
@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forgery_scores_no_more_than_the_wrong_answer(forgery, placement, scored, tmp_path):
    level, results = scored
    hostile, twin = results[(forgery, placement)]
    # the twin: a - b passes add(0, 0) == 0 only (1 of 4); single 0.6 + 0.5 + 0.25, two agents + 0.4 for aux,
    # and + 1.5 when main calls aux (cooperation needs one passed test)
    assert twin == pytest.approx(TWIN[placement])
    assert hostile <= twin, f"{forgery} ({placement}, {level}) scored {hostile} > {twin}"
    assert runtime_hashes() == RUNTIME_BEFORE  # the sandbox's own scripts on the host are unchanged


RUNTIME_BEFORE = runtime_hashes()


def test_enough_forgeries():
    assert len(FORGERIES) >= 18


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
def test_the_bundled_answers_cannot_be_read():
    """Return the canonical solution's result, read from the package's own dataset file."""
    data = os.path.join(os.path.dirname(__import__("comlrl").__file__), "envs", "data", "humaneval.json")
    with open(data) as handle:
        rows = json.load(handle)
    row = rows["train"][0]
    entry, params = row["entry_point"], "numbers"
    steal = (f"def {entry}({params}, _d=None):\n    import json\n    try:\n        rows = json.load(open({data!r}))\n"
             f"    except OSError:\n        return []\n    row = [r for r in rows['train'] + rows['eval'] if r['entry_point'] == {entry!r}][0]\n"
             f"    ns = {{}}\n    exec('from typing import List\\n' + row['prompt'] + row['canonical_solution'], ns)\n    return ns[{entry!r}]({params})")
    twin = f"def {entry}({params}, _d=None):\n    return []"
    honest = row["prompt"] + row["canonical_solution"]
    env = get_environment("humaneval", num_turns=1, num_agents=1, isolation="bwrap", test_timeout_s=2.0)
    hostile_reward, twin_reward, honest_reward = env.reward_func([steal, twin, honest], batch_items=[row] * 3)
    assert honest_reward == pytest.approx(2.1)  # the canonical solution passes everything
    assert hostile_reward <= twin_reward < honest_reward
    with open(data) as handle:
        assert json.load(handle) == rows  # unchanged
