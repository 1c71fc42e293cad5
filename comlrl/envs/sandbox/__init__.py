"""Run model-generated code and its asserts in a contained subprocess, never in the trainer.

```python
from comlrl.envs.sandbox import Sandbox, TestJob

sandbox = Sandbox()                       # limits: SandboxLimits(); isolation: the strongest available
report = sandbox.run(TestJob(code="def f(x):\\n    return x + 1", tests=["assert f(1) == 2"]))
report.passed, report.total              # 1, 1
reports = sandbox.run_many(jobs)          # a batch in parallel, one worker per CPU core
```

Each job runs ``python -I -S -B harness.py`` (an isolated interpreter without site-packages) with:

- a fresh temporary working directory (removed afterwards) as its cwd, ``HOME`` and ``TMPDIR``;
- an environment of ``PATH``, ``HOME``, ``TMPDIR`` and ``LANG`` only (no ``*_KEY``/``*_TOKEN`` or any
  other variable of the trainer);
- CPU-time, address-space, file-size, process-count and open-file limits, no core dumps;
- the harness's audit hook: no sockets, no process creation, no signals to other processes, no
  ctypes, no writes or deletions outside its directory, no reads of the user's home or of other
  processes' ``/proc`` entries;
- OS isolation where available (``isolation.py``): bubblewrap (read-only file system, hidden home,
  private ``/tmp``, new PID and network namespaces), else util-linux ``unshare`` (network and PID
  namespaces), else none (then the audit hook alone keeps sockets closed: the weaker guarantee);
- a wall-clock limit after which the whole process group is killed; every run ends by killing
  whatever is left of the group;
- stdout and stderr capped (``max_output_bytes`` each, the rest read and dropped).

The report counts only asserts the harness reported as passed; a child that exits, crashes or is
killed before reporting a test leaves it failed. What the sandbox does not protect against: a
candidate deliberately forging the harness's result records (it runs in the harness's process), and
on machines without namespaces, code that escapes the audit hook through a route it does not cover.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from comlrl.envs.sandbox.isolation import command_prefix, resolve_isolation

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed job."""

    wall_time_s: float = 60.0
    """Wall-clock seconds before the job's whole process group is killed."""
    cpu_time_s: float = 60.0
    """CPU seconds (RLIMIT_CPU) of the child."""
    memory_bytes: int = 1 << 30
    """Address space (RLIMIT_AS) of the child: 1 GiB."""
    file_size_bytes: int = 16 << 20
    """Largest file the child may write (RLIMIT_FSIZE): 16 MiB."""
    max_processes: int = 32
    """RLIMIT_NPROC (enforced by the kernel for non-root users; root relies on the audit hook and
    the PID namespace)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_output_bytes: int = 64 << 10
    """Bytes of stdout and of stderr kept (the rest is read and dropped)."""

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "cpu_time_s", "memory_bytes", "file_size_bytes", "max_processes", "max_open_files", "max_output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}.")


@dataclass(frozen=True)
class TestJob:
    """One candidate program and the asserts to run against it."""

    __test__ = False  # not a pytest test class

    code: str
    """The candidate program, executed once before the asserts."""
    tests: Sequence[str]
    """Assert statements, each run on its own against the program's globals."""
    test_timeout_s: float = 10.0
    """Alarm per assert."""
    max_timeouts: int = 3
    """Skip the remaining asserts after this many timed out."""
    pre_evaluate: bool = False
    """Evaluate ``name(args)`` and ``expected`` of an ``assert name(args) == expected`` before the assert
    (the original code reward's semantics)."""
    seed_math: bool = False
    """Start the code's globals with ``math`` (the original level-feedback runner)."""


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
    """The harness ran to its end (every assert it was allowed to run reported)."""
    termination: Optional[str] = None
    """Why the child stopped early: "wall_timeout", "signal <n>", "exit <n>", or None."""
    isolation: str = "none"
    stdout: str = ""
    stderr: str = ""
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


class Sandbox:
    """Runs ``TestJob``s in contained subprocesses (see the module docstring)."""

    def __init__(self, limits: Optional[SandboxLimits] = None, isolation: str = "auto", workers: Optional[int] = None):
        self.limits = limits or SandboxLimits()
        self.isolation = resolve_isolation(isolation)
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer or None, got {workers!r}.")
        self.workers = workers or _cpu_count()
        self.python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)

    def run_many(self, jobs: Sequence[TestJob]) -> List[TestReport]:
        """Every job, ``workers`` at a time; reports in job order."""
        jobs = list(jobs)
        if len(jobs) <= 1 or self.workers == 1:
            return [self.run(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(jobs))) as pool:
            return list(pool.map(self.run, jobs))

    def run(self, job: TestJob) -> TestReport:
        workdir = tempfile.mkdtemp(prefix="comlrl-sandbox-")
        try:
            return self._run_in(workdir, job)
        finally:
            _remove_tree(workdir)

    # ------------------------------------------------------------------ one job
    def _run_in(self, workdir: str, job: TestJob) -> TestReport:
        home, tmp = os.path.join(workdir, "home"), os.path.join(workdir, "tmp")
        os.mkdir(home)
        os.mkdir(tmp)
        real_home = os.path.expanduser("~")
        keep = [sys.base_prefix, os.path.dirname(self.python), os.path.dirname(HARNESS)]
        prefix = command_prefix(self.isolation, workdir=workdir, keep_visible=keep, hide=[real_home])
        read_fd, write_fd = os.pipe()
        command = [*prefix, self.python, "-I", "-S", "-B", HARNESS, str(write_fd)]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8"}
        started = time.monotonic()
        try:
            child = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,),
                cwd=workdir, env=env, start_new_session=True, close_fds=True,
            )
        finally:
            os.close(write_fd)
        payload = self._payload(job, workdir, real_home, keep)
        try:
            child.stdin.write(json.dumps(payload).encode())
            child.stdin.close()
        except OSError:
            pass  # the child died at once; its exit status tells why
        streams, timed_out = self._collect(child, read_fd, started)
        report = self._report(job, streams, timed_out, child)
        report.isolation = self.isolation
        report.duration_s = time.monotonic() - started
        return report

    def _payload(self, job: TestJob, workdir: str, real_home: str, keep: Sequence[str]) -> Dict[str, object]:
        limits = self.limits
        return {
            "code": job.code, "tests": list(job.tests), "pre_evaluate": job.pre_evaluate, "seed_math": job.seed_math,
            "test_timeout_s": job.test_timeout_s, "max_timeouts": job.max_timeouts, "workdir": workdir,
            "deny_read": [real_home] if real_home not in ("/", "") else [], "allow_read": list(keep),
            "limits": {
                "cpu_time_s": limits.cpu_time_s, "memory_bytes": limits.memory_bytes, "file_size_bytes": limits.file_size_bytes,
                "max_processes": limits.max_processes, "max_open_files": limits.max_open_files, "core_bytes": 0,
            },
        }

    def _collect(self, child: subprocess.Popen, read_fd: int, started: float):
        """Read stdout, stderr and the result pipe until they close or the wall limit passes; then
        kill what is left of the process group."""
        cap = self.limits.max_output_bytes
        buffers = {"stdout": bytearray(), "stderr": bytearray(), "results": bytearray()}
        caps = {"stdout": cap, "stderr": cap, "results": 4 << 20}
        selector = selectors.DefaultSelector()
        selector.register(child.stdout, selectors.EVENT_READ, "stdout")
        selector.register(child.stderr, selectors.EVENT_READ, "stderr")
        results = os.fdopen(read_fd, "rb", buffering=0)
        selector.register(results, selectors.EVENT_READ, "results")
        deadline = started + self.limits.wall_time_s
        timed_out = False
        try:
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                for key, _ in selector.select(timeout=min(remaining, 1.0)):
                    chunk = os.read(key.fileobj.fileno(), 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    buffer = buffers[key.data]
                    if len(buffer) < caps[key.data]:
                        buffer.extend(chunk[: caps[key.data] - len(buffer)])
        finally:
            selector.close()
            _kill_group(child)
            for stream in (child.stdout, child.stderr, results):
                stream.close()
        return buffers, timed_out

    def _report(self, job: TestJob, streams, timed_out: bool, child: subprocess.Popen) -> TestReport:
        report = TestReport(total=len(job.tests))
        report.stdout = streams["stdout"].decode("utf-8", "replace")
        report.stderr = streams["stderr"].decode("utf-8", "replace")
        by_index: Dict[int, TestResult] = {}
        for line in streams["results"].decode("utf-8", "replace").splitlines():
            record = _parse(line)
            if record is None:
                continue
            event = record.get("event")
            if event == "load":
                report.loaded = bool(record.get("ok"))
                if not report.loaded:
                    report.load_error = f"{record.get('error_type')}: {record.get('error_message')}"
            elif event == "test" and isinstance(record.get("i"), int) and 0 <= record["i"] < report.total:
                status = record.get("status")
                if status in ("pass", "fail", "timeout") and record["i"] not in by_index:
                    by_index[record["i"]] = TestResult(status, record.get("error_type"), record.get("error_message"))
            elif event == "done":
                report.completed = True
        if not report.loaded:
            by_index = {}
        report.results = [by_index.get(i, TestResult("not run")) for i in range(report.total)]
        if timed_out:
            report.termination = "wall_timeout"
        elif not report.completed:
            code = child.returncode
            report.termination = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return report


def _parse(line: str) -> Optional[dict]:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _kill_group(child: subprocess.Popen) -> None:
    """SIGKILL the child's process group (it leads its own session), then reap the child."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a child that survives SIGKILL
        pass


def _remove_tree(path: str) -> None:
    """Remove a job's directory even if the candidate made parts of it read-only (never follows links)."""
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            target = os.path.join(root, name)
            if not os.path.islink(target):
                try:
                    os.chmod(target, 0o700)
                except OSError:
                    pass
    shutil.rmtree(path, ignore_errors=True)


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


__all__ = ["Sandbox", "SandboxLimits", "TestJob", "TestReport", "TestResult"]
