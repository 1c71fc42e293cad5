"""``Sandbox``: one job = a contained candidate process and a checker process, joined by two pipes.

The trainer starts both, hands each its half of the job on stdin (the code to the candidate, the
asserts to the checker), closes its copies of the pipes, and reads four streams until the checker
ends or the wall-clock limit passes: the checker's result lines (trusted, parsed with caps), its
stderr (diagnostics), and the candidate's stdout and stderr (capped, the rest read and dropped).
Then both process groups are killed; under bubblewrap that ends the candidate's PID namespace and
every process in it. Nothing the candidate writes is parsed by the trainer.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import re
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence, Tuple

from comlrl.envs.sandbox import wire
from comlrl.envs.sandbox.isolation import (
    RUNTIME_DIR, RUNTIME_MOUNT, WORKDIR, bwrap_command, describe_isolation, interpreter, resolve_isolation, seccomp_pipe,
    user_namespaces,
)
from comlrl.envs.sandbox.jobs import LINE_CAP, MESSAGE_CAP, SandboxLimits, TestJob, TestReport, TestResult, parse_results

HARNESS = os.path.join(RUNTIME_DIR, "harness.py")
CHECKER = os.path.join(RUNTIME_DIR, "checker.py")
PATH = "/usr/local/bin:/usr/bin:/bin"
FLUSH_S = 0.5
"""Seconds the candidate's stdout and stderr are still read after the checker is done."""
FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602
LOCK_FLAGS = 0x10 | 0x20  # FS_IMMUTABLE_FL | FS_APPEND_FL


class Sandbox:
    """Runs ``TestJob``s: the code contained, the asserts in a separate checker (see the package docstring).

    ``isolation``: "auto" or "bwrap" (bubblewrap; refused with ``SandboxUnavailableError`` when it
    cannot contain code here) or "none" (explicit opt-out: no containment, a warning once per process).
    """

    def __init__(self, limits: Optional[SandboxLimits] = None, isolation: str = "auto", workers: Optional[int] = None):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer or None, got {workers!r}.")
        self.limits = limits or SandboxLimits()
        self.requested_isolation = isolation
        self.isolation = resolve_isolation(isolation)
        self.workers = workers or _cpu_count()
        self.python = interpreter()
        self._isolation_record = describe_isolation(self.isolation, isolation)

    def describe(self) -> Dict[str, object]:
        """The isolation actually in use, the limits and the parallelism, as plain JSON data (for
        the run record)."""
        return {**self._isolation_record, "limits": asdict(self.limits), "workers": self.workers}

    def run_many(self, jobs: Sequence[TestJob]) -> List[TestReport]:
        """Every job, ``workers`` at a time; reports in job order."""
        jobs = list(jobs)
        if len(jobs) <= 1 or self.workers == 1:
            return [self.run(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(jobs))) as pool:
            return list(pool.map(self.run, jobs))

    def run(self, job: TestJob) -> TestReport:
        """One job; the report counts only asserts the checker saw pass. When it returns, every
        process of the job is gone (under bubblewrap: the sandbox's PID namespace has ended). It
        never raises for what the job holds: a job that cannot be run (code too large to send, a
        process that cannot start) gets a report with no pass and the reason in ``termination``."""
        started = time.monotonic()
        try:
            report = self._run(job, started)
        except Exception as error:  # noqa: BLE001 - one job's failure must not cost the batch
            report = TestReport(total=len(job.tests), results=[TestResult("not run") for _ in job.tests])
            report.termination = f"sandbox error: {type(error).__name__}: {error}"[:MESSAGE_CAP]
            _warn_once(f"comlrl sandbox: a job could not be run ({report.termination}); it scores no test")
        report.isolation = self.isolation
        report.duration_s = time.monotonic() - started
        return report

    def _run(self, job: TestJob, started: float) -> TestReport:
        parts = _JobParts(None if self.isolation == "bwrap" else _make_workdir())
        try:
            candidate_job = wire.encode(self._candidate_job(job, parts.job_dir))  # before any process starts: too large -> refused
            request_r, request_w = parts.pipe()
            reply_r, reply_w = parts.pipe()
            candidate = parts.add(self._spawn_candidate(parts, request_r, reply_w))
            if job.style == "unittest":  # a test module's fixtures may write files: into a directory of the job's own
                parts.checker_dir = _make_workdir()
            checker = parts.add(self._spawn(["-I", "-S", "-B", CHECKER, str(request_w), str(reply_r)], (request_w, reply_r),
                                            parts.checker_dir or "/", {"PATH": PATH, "LANG": "C.UTF-8"}))
            parts.close_child_ends()
            _feed(candidate, candidate_job)
            _feed(checker, wire.encode(self._checker_job(job)))
            streams, timed_out = self._collect(parts, candidate, checker, started, len(job.tests))
            return self._report(job, streams, timed_out, candidate, checker)
        finally:
            parts.end()

    # ------------------------------------------------------------------ processes
    def _spawn(self, argv: List[str], fds: Tuple[int, ...], cwd: str, env: Dict[str, str], prefix: Sequence[str] = ()) -> subprocess.Popen:
        return subprocess.Popen([*prefix, self.python, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=fds, cwd=cwd, env=env, start_new_session=True, close_fds=True)

    def _spawn_candidate(self, parts: "_JobParts", request_r: int, reply_w: int) -> subprocess.Popen:
        fds: Tuple[int, ...] = (request_r, reply_w)
        if self.isolation == "bwrap":
            userns = parts.user_namespace() if os.geteuid() == 0 else None
            info_r, info_w = parts.pipe(child_end=1)
            parts.info_fd = info_r
            filter_fd = seccomp_pipe()
            if filter_fd is not None:
                parts.child_ends.append(filter_fd)
            fds += tuple(fd for fd in (info_w, userns, filter_fd) if fd is not None)
            prefix = bwrap_command(self.python, self.limits.disk_bytes, userns, info_fd=info_w, seccomp_fd=filter_fd)
            harness, cwd, spawn_cwd = RUNTIME_MOUNT + "/harness.py", WORKDIR, "/"
        else:
            prefix, harness, cwd, spawn_cwd = [], HARNESS, parts.job_dir, parts.job_dir
        env = {"PATH": PATH, "HOME": cwd + "/home", "TMPDIR": cwd + "/tmp", "LANG": "C.UTF-8"}
        return self._spawn(["-I", "-S", "-B", harness, str(request_r), str(reply_w)], fds, spawn_cwd, env, prefix)

    def _candidate_job(self, job: TestJob, job_dir: Optional[str]) -> Dict[str, object]:
        limits = self.limits
        home = os.path.realpath(os.path.expanduser("~"))
        return {
            "code": job.code, "exports": list(job.entry_points), "seed_math": job.seed_math, "drop_root": self.isolation == "bwrap",
            "deny_read": [home] if home not in ("/", "") and job_dir is not None else [],
            "allow_read": [os.path.realpath(sys.base_prefix), os.path.dirname(self.python), RUNTIME_DIR, RUNTIME_MOUNT],
            "limits": {"cpu_time_s": limits.cpu_time_s, "memory_bytes": limits.memory_bytes, "file_size_bytes": limits.file_size_bytes,
                       "max_processes": limits.max_processes, "max_open_files": limits.max_open_files, "core_bytes": 0},
        }

    def _checker_job(self, job: TestJob) -> Dict[str, object]:
        pre = [_pre_evaluation(test) for test in job.tests] if job.pre_evaluate else None
        return {
            "tests": list(job.tests), "entry_points": list(job.entry_points), "pre": pre, "style": job.style,
            "setup": needed_setup(job.setup, job.tests) if job.style == "assert" else job.setup, "seed_math": job.seed_math,
            "test_timeout_s": job.test_timeout_s, "max_timeouts": job.max_timeouts, "load_timeout_s": self.limits.wall_time_s + 1.0,
            "limits": {"memory_bytes": 2 * self.limits.memory_bytes, "cpu_time_s": self.limits.cpu_time_s, "core_bytes": 0},
        }

    def _collect(self, parts: "_JobParts", candidate: subprocess.Popen, checker: subprocess.Popen, started: float, tests: int):
        """Read the streams until the checker's result stream closes (then the candidate's, for at most
        ``FLUSH_S``) or the wall limit passes."""
        cap = self.limits.max_output_bytes
        caps = {"stdout": cap, "stderr": cap, "checker": LINE_CAP * (tests + 8), "diagnostics": 16 << 10, "info": 4096}
        buffers = {name: bytearray() for name in caps}
        selector = selectors.DefaultSelector()
        for stream, name in ((candidate.stdout, "stdout"), (candidate.stderr, "stderr"), (checker.stdout, "checker"),
                             (checker.stderr, "diagnostics")):
            selector.register(stream, selectors.EVENT_READ, name)
        if parts.info_fd is not None:
            selector.register(parts.info_fd, selectors.EVENT_READ, "info")
        deadline = started + self.limits.wall_time_s
        timed_out = False
        flush_deadline = None
        try:
            while True:
                streams = {key.data for key in selector.get_map().values()}
                if "checker" not in streams:  # the checker is done: let the candidate flush its output and exit
                    if not {"stdout", "stderr"} & streams:
                        break
                    flush_deadline = flush_deadline or time.monotonic() + FLUSH_S
                remaining = min(deadline, flush_deadline or deadline) - time.monotonic()
                if remaining <= 0:
                    timed_out = "checker" in streams
                    break
                for key, _ in selector.select(timeout=min(remaining, 1.0)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    buffer = buffers[key.data]
                    buffer.extend(chunk[: max(0, caps[key.data] - len(buffer))])
                    if key.data == "info" and parts.sandbox_pidfd is None:
                        parts.watch_sandbox(bytes(buffer))  # once the JSON is whole
        finally:
            selector.close()
        return buffers, timed_out

    def _report(self, job: TestJob, streams, timed_out: bool, candidate: subprocess.Popen, checker: subprocess.Popen) -> TestReport:
        report = parse_results(bytes(streams["checker"]), job.tests)
        report.stdout = streams["stdout"].decode("utf-8", "replace")
        report.stderr = streams["stderr"].decode("utf-8", "replace")
        report.diagnostics = streams["diagnostics"].decode("utf-8", "replace")
        if timed_out:
            report.completed = False
            report.termination = "wall_timeout"
        elif report.termination == "candidate: exited":
            code = _wait(candidate, 1.0)
            report.termination = report.termination if code is None else f"signal {-code}" if code < 0 else f"exit {code}"
        elif not report.completed and report.termination is None:
            report.termination = f"checker exit {_wait(checker, 1.0)}"
        return report


class _JobParts:
    """What one job holds -- pipes, processes, a user namespace, the sandbox's pid descriptor, a host
    directory -- and ``end()``, which kills and releases all of it whatever happened."""

    def __init__(self, job_dir: Optional[str]):
        self.job_dir = job_dir
        self.checker_dir: Optional[str] = None
        self.processes: List[subprocess.Popen] = []
        self.child_ends: List[int] = []
        self.own_ends: List[int] = []
        self.userns: Optional[int] = None
        self.info_fd: Optional[int] = None
        self.sandbox_pidfd: Optional[int] = None

    def pipe(self, child_end: int = -1) -> Tuple[int, int]:
        """A pipe; ``child_end`` (0: read end, 1: write end, -1: both) goes to a child and is closed
        here once the children have started."""
        read, write = os.pipe()
        ends = (read, write)
        for index, fd in enumerate(ends):
            (self.child_ends if child_end in (-1, index) else self.own_ends).append(fd)
        return ends

    def add(self, process: subprocess.Popen) -> subprocess.Popen:
        self.processes.append(process)
        return process

    def user_namespace(self) -> int:
        self.userns = user_namespaces().acquire()
        return self.userns

    def close_child_ends(self) -> None:
        for fd in self.child_ends:
            os.close(fd)
        self.child_ends = []

    def watch_sandbox(self, info: bytes) -> None:
        """Hold a pid descriptor of the sandbox's init (bubblewrap's ``--info-fd`` names it)."""
        try:
            pid = json.loads(info.decode())["child-pid"]
            self.sandbox_pidfd = os.pidfd_open(int(pid))
        except (ValueError, KeyError, TypeError, OSError, AttributeError):
            pass

    def end(self) -> None:
        for process in self.processes:
            _kill_group(process)
        if self.sandbox_pidfd is not None:  # the namespace's init: once it is gone, so is every process inside
            try:
                signal.pidfd_send_signal(self.sandbox_pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass
            select.select([self.sandbox_pidfd], [], [], 10.0)
            os.close(self.sandbox_pidfd)
        for fd in self.child_ends + self.own_ends:
            os.close(fd)
        self.child_ends = self.own_ends = []
        if self.userns is not None:
            user_namespaces().release(self.userns)
        for directory in (self.job_dir, self.checker_dir):
            if directory is not None:
                remove_tree(directory)


# ----------------------------------------------------------------------------- helpers


ASSERT_SHAPE = re.compile(r"assert\s+(\w+)\(([^)]*)\)\s*==\s*(.+)")
"""The original reward's split of ``assert name(args) == expected`` (its pre-evaluation)."""


def _pre_evaluation(test: str) -> Optional[Tuple[str, str]]:
    shape = ASSERT_SHAPE.search(test)
    return (f"{shape.group(1)}({shape.group(2)})", shape.group(3)) if shape else None


def needed_setup(setup: str, tests: Sequence[str]) -> str:
    """``setup`` without the import statements whose names no test mentions (``from typing import
    List`` costs the checker ~14 ms of CPU and no assert uses it); every other statement is kept."""
    try:
        tree = ast.parse(setup or "")
    except (SyntaxError, ValueError):
        return setup
    words = set(re.findall(r"[A-Za-z_]\w*", "\n".join(tests)))
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and all(alias.name != "*" for alias in node.names):
            bound = {(alias.asname or alias.name).split(".")[0] for alias in node.names}
            if not bound & words:
                continue
        keep.append(ast.get_source_segment(setup, node) or "")
    return "\n".join(keep)


def _feed(process: subprocess.Popen, data: bytes) -> None:
    try:
        process.stdin.write(data)
        process.stdin.close()
    except OSError:
        pass  # the process died at once; its exit status and the missing results tell why


def _wait(process: subprocess.Popen, timeout: float) -> Optional[int]:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process's group (it leads its own session), reap it, close its pipes."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _wait(process, 10.0)
    for stream in (process.stdin, process.stdout, process.stderr):
        try:
            stream.close()
        except OSError:
            pass


def _make_workdir() -> str:
    """A fresh host directory (mode 0700) for an uncontained (``none``) job."""
    return tempfile.mkdtemp(prefix="comlrl-sandbox-")


def _unlock(path: str) -> None:
    """Clear immutable / append-only flags and give directories rwx back, below ``path`` (no links followed)."""
    for root, dirs, files in os.walk(path):
        for name in [root] + [os.path.join(root, entry) for entry in dirs + files]:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                flags = bytearray(4)
                fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags)
                value = int.from_bytes(flags, "little")
                if value & LOCK_FLAGS:
                    fcntl.ioctl(fd, FS_IOC_SETFLAGS, (value & ~LOCK_FLAGS).to_bytes(4, "little"))
                if os.path.isdir(name):
                    os.fchmod(fd, 0o700)
            except OSError:
                pass
            finally:
                os.close(fd)


_removal_warned = threading.Event()
_warned_messages: set = set()


def _warn_once(message: str) -> None:
    """A RuntimeWarning, once per distinct message start (a broken machine fails every job alike)."""
    key = message[:60]
    if key not in _warned_messages:
        _warned_messages.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def remove_tree(path: str) -> bool:
    """Remove a job's directory whatever the candidate did to it (read-only modes, ``chattr +i`` /
    ``+a`` where the trainer may clear them); never follows links. False (and a warning once) if
    something is left."""
    for attempt in range(3):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return True
        _unlock(path)
    if not _removal_warned.is_set():
        _removal_warned.set()
        warnings.warn(f"comlrl sandbox: could not remove the job directory {path}", RuntimeWarning, stacklevel=2)
    return False


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)
