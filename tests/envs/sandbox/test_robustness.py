"""The trainer survives anything the candidate sends: junk, depth, size and non-UTF-8 on every channel.

Each hostile ``add`` writes garbage to the reply pipe named in its ``sys.argv`` (brackets, a deep
or oversized frame, invalid UTF-8, replies out of sequence, a 3 MiB error message), returns values
that cannot be sent, or floods its stdout and stderr. All of them and their wrong twins are scored
in one ``reward_func`` batch per isolation level: the call must return, each hostile reward must be
no higher than its twin's, and the sandbox's scripts on the host must be unchanged. Then the caps
are checked where the text goes next: the report, and the feedback prompt of the next turn.
"""

from __future__ import annotations

import warnings

import pytest

from comlrl.envs import get_environment
from comlrl.envs.sandbox import Sandbox, SandboxLimits, TestJob

from tests.helpers.sandbox_attacks import FRAME, LEVELS, ROW, runtime_hashes

EMPTY = b"l\\x00\\x00\\x00\\x00"
JUNK = {
    "brackets_on_every_argv_fd": "for fd in sys.argv[1:]:\n    try:\n        os.write(int(fd), b'[' * 200000 + b'\\n')\n    except OSError:\n        pass",
    "deep_nesting_frame": "send(b'l\\x00\\x00\\x00\\x01' * 100000 + b'N')",
    "oversized_frame_header": "send(b'', length=0xFFFFFFF0)",
    "frame_longer_than_its_data": "send(b'N', length=64)\nos.close(REPLY)",
    "invalid_utf8_in_a_string": f"send(t(s(b'value'), i(1), s(b'call'), s(b'\\xff\\xfe\\x80'), {EMPTY!r}, b'd\\x00\\x00\\x00\\x00'))",
    "reply_out_of_sequence": f"send(t(s(b'value'), i(999), s(b'call'), i(3), {EMPTY!r}, b'd\\x00\\x00\\x00\\x00'))",
    "two_million_items": "send(b'l' + struct.pack('>I', 2000000) + b'N' * 2000000)",
    "unhashable_set_member": f"send(t(s(b'value'), i(1), s(b'call'), b'S\\x00\\x00\\x00\\x01' + {EMPTY!r}, {EMPTY!r}, b'd\\x00\\x00\\x00\\x00'))",
    "trailing_bytes": f"send(t(s(b'value'), i(1), s(b'call'), i(3), {EMPTY!r}, b'd\\x00\\x00\\x00\\x00') + b'extra')",
    "forged_3_mib_error_message": "send(t(s(b'raised'), i(1), s(b'call'), s(b'ValueError'), s(b'x' * (3 << 20))))",
    "hostile_exception_name": "send(t(s(b'raised'), i(1), s(b'call'), s(b'Bad\\nName\\x1b[2J' * 1000), s('\\ud800 \\x1b[31mred\\x00'.encode('utf-8', 'surrogatepass'))))",
    "stdout_onto_the_reply_fd": "os.dup2(REPLY, 1)\nprint('{\"event\": \"test\", \"i\": 0, \"status\": \"pass\"}')",
    "close_the_reply_fd": "os.close(REPLY)",
}
# name -> (statements run at call, returned expression): values and errors that cannot be sent as they are
VALUES = {
    "raise_a_3_mib_message": ("raise ValueError('x' * (3 << 20))", "a - b"),
    "exception_with_a_hostile_name_and_str": ("E = type('\\x1b[2J' * 50, (Exception,), {'__str__': lambda s: 1 / 0})\nraise E()", "a - b"),
    "return_nesting_100000_deep": ("v = []\nfor _ in range(100000):\n    v = [v]", "v"),
    "return_a_shared_reference_explosion": ("v = [0]\nfor _ in range(60):\n    v = [v, v]", "v"),
    "return_a_20_mib_string": ("", "'x' * (20 << 20)"),
    "return_a_self_containing_list": ("v = []\nv.append(v)", "v"),
    "non_utf8_floods_on_stdout_and_stderr": ("import os\nfor _ in range(32):\n    os.write(1, b'\\xff\\xfe\\x80' * 100000)\n    os.write(2, b'\\xc3' * 300000)",
                                             "a - b"),
}


def _hostile(name: str):
    if name in JUNK:
        payload = repr(FRAME + JUNK[name])
        return ("def add(a, b, _f=[]):\n    if not _f:\n        _f.append(1)\n"
                f"        exec({payload}, {{}})\n    return a - b")
    body, returned = VALUES[name]
    return "\n".join(["def add(a, b, _f=None):"] + ["    " + line for line in body.splitlines()] + [f"    return {returned}"])


TWIN = "def add(a, b, _f=None):\n    return a - b"
NAMES = list(JUNK) + list(VALUES)


@pytest.fixture(scope="module", params=LEVELS)
def scored(request):
    before = runtime_hashes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = get_environment("humaneval", num_turns=1, num_agents=1, isolation=request.param, test_timeout_s=0.5, max_timeouts=2,
                              wall_time_s=10.0)
    mains = [_hostile(name) for name in NAMES] + [TWIN]
    rewards = env.reward_func(mains, batch_items=[ROW] * len(mains))
    return request.param, dict(zip(NAMES, rewards)), rewards[-1], before


@pytest.mark.parametrize("name", NAMES)
def test_junk_from_the_candidate_scores_no_more_than_the_wrong_answer(name, scored):
    level, rewards, twin, before = scored
    assert twin == pytest.approx(1.35)  # 0.6 + 0.5 + 1/4: a - b passes add(0, 0) == 0 only
    assert rewards[name] <= twin, f"{name} ({level}) scored {rewards[name]} > {twin}"
    assert runtime_hashes() == before


def test_enough_junk():
    assert len(NAMES) >= 18


@pytest.mark.parametrize("level", LEVELS)
def test_caps_on_what_reaches_the_report(level):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sandbox = Sandbox(SandboxLimits(wall_time_s=10.0, max_output_bytes=4096), isolation=level)
    jobs = [TestJob(code=_hostile(name), tests=["assert add(1, 2) == 3"], test_timeout_s=1.0, entry_points=("add",))
            for name in ("forged_3_mib_error_message", "hostile_exception_name", "raise_a_3_mib_message",
                         "exception_with_a_hostile_name_and_str", "non_utf8_floods_on_stdout_and_stderr")]
    reports = sandbox.run_many(jobs)
    for report in reports:
        assert report.passed == 0
        for result in report.results:
            assert len(result.error_message or "") <= 300 and len(result.error_type or "") <= 80
            text = (result.error_type or "") + (result.error_message or "")
            assert not any(ord(c) < 32 and c not in "\n\t" for c in text) and "\x1b" not in text
            text.encode("utf-8")  # no lone surrogates left
        assert len(report.stdout) <= 4096 and len(report.stderr) <= 4096
    forged, named, raised, odd = (report.results[0] for report in reports[:4])
    # forged replies out of the protocol's bounds (a 3 MiB message, a name that is no identifier) are violations
    assert forged.error_type == named.error_type == "ProtocolViolation"
    assert forged.status == named.status == "fail"
    # what the honest harness sends of a huge or hostile exception is within them
    assert raised.error_type == "ValueError" and raised.error_message == "x" * 300
    assert odd.error_type == "Exception" and odd.error_message == "<the exception's message could not be read>"
    assert "\ufffd" in reports[4].stdout  # undecodable bytes were replaced, not fatal


@pytest.mark.parametrize("level", LEVELS)
def test_a_giant_error_stays_out_of_the_feedback_prompt(level):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = get_environment("humaneval", num_turns=2, num_agents=1, isolation=level, external_mode="level_feedback",
                              sandbox_slice="all", test_timeout_s=1.0)
    env.rows.add([ROW])
    main = _hostile("raise_a_3_mib_message")
    (prompt,) = env.external_transition(prompt=ROW["prompt"], agent_completions=[main], num_agents=1,
                                        prompt_history_per_agent=[[ROW["prompt"]]], response_history_per_agent=[[main]])
    diagnostics = prompt[prompt.index("Diagnostics"):]
    assert len(diagnostics) < 4 * 450  # four asserts, each one line with at most a 300-character message
    assert "Tests: 0/4 passed" in diagnostics  # it raises on every call
    assert diagnostics.count("-> ValueError: " + "x" * 300 + "\n") == 4
