"""What a sandboxed job is and what comes back: limits, the job, its report, and the result parser."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from comlrl.envs.sandbox import protocol, wire
from comlrl.envs.sandbox.cleaning import clean_text

MESSAGE_CAP = protocol.MESSAGE_CAP
"""Characters kept of an error message (it reaches the next turn's feedback prompt)."""
NAME_CAP = protocol.NAME_CAP
"""Characters kept of an error type's name."""
LINE_CAP = 4096
"""Longest result frame read from the checker."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed job."""

    wall_time_s: float = 60.0
    """Wall-clock seconds before the job (checker and candidate) is killed."""
    cpu_time_s: float = 60.0
    """CPU seconds (RLIMIT_CPU) of the candidate process and of the checker."""
    memory_bytes: int = 1 << 30
    """Address space (RLIMIT_AS) of the candidate process: 1 GiB (the checker gets twice this)."""
    file_size_bytes: int = 16 << 20
    """Largest file the candidate may write (RLIMIT_FSIZE): 16 MiB."""
    disk_bytes: int = 64 << 20
    """Size of the candidate's private tmpfs (work dir, home, /tmp) under bubblewrap: 64 MiB."""
    max_processes: int = 32
    """RLIMIT_NPROC of the candidate (processes and threads of its uid in its user namespace)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE of the candidate."""
    max_output_bytes: int = 64 << 10
    """Bytes of the candidate's stdout and of its stderr kept (the rest is read and dropped)."""

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "cpu_time_s", "memory_bytes", "file_size_bytes", "disk_bytes", "max_processes",
                     "max_open_files", "max_output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}.")


@dataclass(frozen=True)
class TestJob:
    """One candidate program and the asserts to run against it.

    The ``code`` runs in the sandbox; the ``tests`` and the ``setup`` never enter it: they run in
    the checker, in globals that hold the builtins, the ``setup``'s names and, for each of the
    ``entry_points`` the code defines, a proxy that calls into the sandbox. No other name of the
    code is visible to the tests."""

    __test__ = False  # not a pytest test class

    code: str
    """The candidate program, executed once before the asserts (untrusted)."""
    tests: Sequence[str]
    """Assert statements, each run on its own in the checker against the entry points (trusted)."""
    test_timeout_s: float = 10.0
    """Alarm per assert."""
    max_timeouts: int = 3
    """Skip the remaining asserts after this many timed out."""
    pre_evaluate: bool = False
    """Evaluate ``name(args)`` and ``expected`` of an ``assert name(args) == expected`` before the assert
    (the original code reward's semantics)."""
    seed_math: bool = False
    """Start both the code's and the asserts' globals with ``math`` (the original level-feedback runner)."""
    setup: str = ""
    """Trusted code run in the asserts' globals first (the task prompt's imports): the test module's
    own names, never replaced by the candidate's."""
    entry_points: Sequence[str] = ()
    """The names of the code the tests call (a task's entry point): the only names of the code the
    asserts see. Required."""
    style: str = "assert"
    """"assert": each test is an assert statement. "unittest" (class-level tasks): ``setup`` is the
    test module and each test an id ``"TestClass.test_method"`` of it, run as unittest runs it."""

    def __post_init__(self) -> None:
        names = self.entry_points
        if isinstance(names, str) or not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(f"TestJob.entry_points must name the function(s) of the code the tests call, e.g. "
                             f"entry_points=('add',); got {names!r}. No other name of the code is visible to the tests.")
        object.__setattr__(self, "entry_points", tuple(names))
        if self.style not in ("assert", "unittest"):
            raise ValueError(f"TestJob.style must be 'assert' or 'unittest', got {self.style!r}.")
        if self.style == "unittest":
            bad = [t for t in self.tests if not (isinstance(t, str) and t.count(".") == 1 and all(p.isidentifier() for p in t.split(".")))]
            if bad or self.pre_evaluate:
                raise ValueError(f"A unittest TestJob's tests are ids 'TestClass.test_method' of the test module (its setup), "
                                 f"without pre_evaluate; got {bad[:3] or 'pre_evaluate=True'}.")


@dataclass
class TestResult:
    __test__ = False
    status: str  # "pass", "fail", "timeout" or "not run"
    error_type: Optional[str] = None
    error_message: Optional[str] = None


@dataclass
class TestReport:
    """What happened to one job."""

    __test__ = False

    total: int
    loaded: bool = False
    load_error: Optional[str] = None
    results: List[TestResult] = field(default_factory=list)
    completed: bool = False
    """The checker ran to its end with the candidate answering (every assert it was allowed to run reported)."""
    termination: Optional[str] = None
    """Why the job stopped early: "wall_timeout", "exit <n>" / "signal <n>" (the candidate), "candidate: <why>"
    (it broke the protocol), "checker exit <n>", or None."""
    isolation: str = "none"
    stdout: str = ""
    """The candidate's stdout (capped)."""
    stderr: str = ""
    """The candidate's stderr (capped)."""
    diagnostics: str = ""
    """The checker's stderr (capped): empty unless the checker itself failed."""
    duration_s: float = 0.0

    @property
    def passed(self) -> int:
        return sum(r.status == "pass" for r in self.results)

    @property
    def timeouts(self) -> int:
        return sum(r.status == "timeout" for r in self.results)

    def to_dict(self) -> Dict[str, object]:
        out = asdict(self)
        out.update(passed=self.passed, timeouts=self.timeouts)
        return out


def _text(value: object, cap: int) -> Optional[str]:
    """A field of a result record as one line of clean text (it may reach a prompt)."""
    return None if value is None else clean_text(value if isinstance(value, str) else repr(value), cap)


def _records(data: bytes) -> List[dict]:
    """The checker's result frames (``wire``), each within ``LINE_CAP`` and shallow; reading stops at
    the first frame that is cut off or malformed."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos:pos + 4], "big")
        if size > LINE_CAP or pos + 4 + size > len(data):
            break
        try:
            record = wire.decode(data[pos + 4:pos + 4 + size], max_depth=3, max_items=64)
        except wire.WireError:
            break
        pos += 4 + size
        if isinstance(record, dict):
            out.append(record)
    return out


def parse_results(data: bytes, tests: Sequence[str]) -> TestReport:
    """A report from the checker's output frames: load, per-test and end records; a test without a
    record is "not run"; the candidate's state, when it stopped answering, goes to ``termination``."""
    report = TestReport(total=len(tests))
    by_index: Dict[int, TestResult] = {}
    gone = None
    for record in _records(data):
        event = record.get("event")
        if event == "load":
            report.loaded = record.get("ok") is True
            if not report.loaded:
                report.load_error = f"{_text(record.get('error_type'), NAME_CAP)}: {_text(record.get('error_message'), MESSAGE_CAP)}"
        elif event == "test" and type(record.get("i")) is int and 0 <= record["i"] < report.total:
            status = record.get("status")
            if status in ("pass", "fail", "timeout") and record["i"] not in by_index:
                by_index[record["i"]] = TestResult(status, _text(record.get("error_type"), NAME_CAP),
                                                   _text(record.get("error_message"), MESSAGE_CAP))
        elif event == "candidate":
            gone = _text(record.get("state"), MESSAGE_CAP) or "gone"
        elif event == "done":
            report.completed = gone is None
    if not report.loaded:
        by_index = {}
    report.results = [by_index.get(i, TestResult("not run")) for i in range(report.total)]
    report.termination = None if gone is None else f"candidate: {gone}"
    return report
