"""The sandbox's child program: run one candidate's code and its asserts, report each outcome.

Started by ``comlrl.envs.sandbox`` as ``python -I -S -B harness.py RESULT_FD`` inside a fresh
temporary working directory (and, where the OS allows, a bubblewrap or unshare namespace). It uses
the standard library only and imports nothing of comlrl. Reads one JSON job from stdin:

    {"code": str, "tests": [str], "pre_evaluate": bool, "seed_math": bool,
     "test_timeout_s": float, "max_timeouts": int, "limits": {...}, "workdir": str,
     "deny_read": [str], "allow_read": [str]}

then, before any candidate code runs: lowers its resource limits (CPU seconds, address space, file
size, processes, open files, no core dumps; soft = hard so they cannot be raised again) and
installs an audit hook that refuses process creation, signals to other processes, sockets,
ctypes/cffi, writes or deletions outside the working directory, and reads of the denied paths
(the user's home, other processes' /proc entries). Results go to RESULT_FD as JSON lines
(``{"event": "load" | "test" | "done", ...}``) as they happen, so a candidate that crashes or
exits early leaves the tests it did not reach unreported (the parent counts them as failed).

Assert semantics follow the original task's reward: the code is executed once in fresh globals
(``{"math": math}`` when ``seed_math``), then each assert with a per-test alarm; after
``max_timeouts`` timed-out asserts the rest are skipped. With ``pre_evaluate`` an assert shaped
``assert name(args) == expected`` (a regular-expression split, as the original) first evaluates
``name(args)`` and ``expected`` separately (the candidate runs twice; an error in either fails it).
"""

import json
import math
import os
import re
import resource
import signal
import sys

ASSERT_SHAPE = re.compile(r"assert\s+(\w+)\(([^)]*)\)\s*==\s*(.+)")
MESSAGE_CAP = 300

PROCESS_EVENTS = {
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
    "os.startfile", "pty.spawn", "resource.setrlimit", "resource.prlimit",
}
SIGNAL_EVENTS = {"os.kill", "os.killpg", "signal.pthread_kill"}
PATH_WRITE_EVENTS = {
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.truncate", "shutil.rmtree",
    "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
}
TWO_PATH_EVENTS = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.copymode", "shutil.copystat"}
READ_EVENTS = {"os.listdir", "os.scandir"}
DENIED_MODULES = {"ctypes", "_ctypes", "cffi", "_cffi_backend", "_posixsubprocess", "_xxsubinterpreters", "_testcapi"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class TestTimeout(BaseException):
    """Raised by the per-assert alarm (a BaseException, so ``except Exception`` in candidate code
    cannot swallow it)."""


def _under(path, prefix):
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


class Guard:
    """The audit hook (see the module docstring)."""

    def __init__(self, workdir, deny_read, allow_read):
        self.workdir = os.path.realpath(workdir)
        self.deny_read = [os.path.realpath(p) for p in deny_read]
        self.allow_read = [os.path.realpath(p) for p in allow_read] + [self.workdir]
        self.pid = os.getpid()

    def _real(self, path):
        if isinstance(path, int):
            return None
        try:
            path = os.fsdecode(path)
        except TypeError:
            return None
        return os.path.realpath(os.path.join(self.workdir, path))

    def _check_write(self, event, path):
        real = self._real(path)
        if real is not None and not _under(real, self.workdir):
            raise PermissionError(f"sandbox: {event} outside the working directory is not allowed ({real})")

    def _check_read(self, event, path):
        real = self._real(path)
        if real is None:
            return
        if _under(real, "/proc") and not (_under(real, "/proc/self") or _under(real, f"/proc/{self.pid}")):
            raise PermissionError(f"sandbox: {event} of another process's /proc entry is not allowed")
        if any(_under(real, p) for p in self.deny_read) and not any(_under(real, p) for p in self.allow_read):
            raise PermissionError(f"sandbox: {event} of {real} is not allowed")

    def __call__(self, event, args):
        if event in PROCESS_EVENTS or event.startswith("socket.") or event.startswith("ctypes."):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event in SIGNAL_EVENTS:
            if not (event == "os.kill" and args and args[0] == self.pid):
                raise PermissionError(f"sandbox: {event} is not allowed")
        elif event == "open":
            path, _mode, flags = args
            if isinstance(flags, int) and flags & WRITE_FLAGS:
                self._check_write(event, path)
            else:
                self._check_read(event, path)
        elif event in PATH_WRITE_EVENTS:
            self._check_write(event, args[0])
        elif event in TWO_PATH_EVENTS:
            self._check_write(event, args[1])
            if event in ("os.rename", "shutil.move"):
                self._check_write(event, args[0])
        elif event in READ_EVENTS:
            self._check_read(event, args[0] if args else ".")
        elif event == "import" and args and str(args[0]).split(".")[0] in DENIED_MODULES:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")


def set_limits(limits):
    """Soft = hard for each limit, never above the current hard limit."""
    names = {
        "cpu_time_s": resource.RLIMIT_CPU, "memory_bytes": resource.RLIMIT_AS, "file_size_bytes": resource.RLIMIT_FSIZE,
        "max_processes": resource.RLIMIT_NPROC, "max_open_files": resource.RLIMIT_NOFILE, "core_bytes": resource.RLIMIT_CORE,
    }
    for key, which in names.items():
        value = limits.get(key)
        if value is None:
            continue
        value = int(math.ceil(value))
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing


class Reporter:
    def __init__(self, fd):
        self.fd = fd

    def send(self, record):
        data = (json.dumps(record) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            pass  # the candidate closed the channel: the parent counts unreported tests as failed


def _error(exc):
    return {"error_type": type(exc).__name__, "error_message": str(exc)[:MESSAGE_CAP]}


def _alarm(signum, frame):
    raise TestTimeout("test execution timed out")


def run_assert(test, env, pre_evaluate):
    if pre_evaluate:
        shape = ASSERT_SHAPE.search(test)
        if shape:
            eval(f"{shape.group(1)}({shape.group(2)})", env)
            eval(shape.group(3), env)
    exec(test, env)


def run(job, report):
    env = {"math": math} if job.get("seed_math") else {}
    try:
        exec(job["code"], env)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the code did not load
        report.send({"event": "load", "ok": False, **_error(exc)})
        return
    report.send({"event": "load", "ok": True})
    timeouts, limit = 0, int(job.get("max_timeouts", 3))
    seconds = float(job.get("test_timeout_s", 10.0))
    signal.signal(signal.SIGALRM, _alarm)
    for index, test in enumerate(job["tests"]):
        if timeouts >= limit:
            break
        record = {"event": "test", "i": index}
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            run_assert(test, env, bool(job.get("pre_evaluate")))
            signal.setitimer(signal.ITIMER_REAL, 0)
            record["status"] = "pass"
        except TestTimeout as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            timeouts += 1
            record.update(status="timeout", **_error(exc))
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            record.update(status="fail", **_error(exc))
        report.send(record)


def main():
    report = Reporter(int(sys.argv[1]))
    job = json.loads(sys.stdin.read())
    os.chdir(job["workdir"])
    set_limits(job.get("limits", {}))
    sys.addaudithook(Guard(job["workdir"], job.get("deny_read", []), job.get("allow_read", [])))
    run(job, report)
    report.send({"event": "done"})
    sys.stdout.flush()
    os._exit(0)  # no atexit handlers or lingering threads of the candidate


if __name__ == "__main__":
    main()
