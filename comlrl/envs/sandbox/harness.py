"""The candidate side of a sandboxed job: load the candidate's code, then answer the checker's calls.

Started by ``comlrl.envs.sandbox`` as ``python -I -S -B harness.py REQUEST_FD REPLY_FD`` inside the
isolation (bubblewrap: its own user, PID, network, IPC and mount namespaces; or none). Standard
library only; it imports nothing of comlrl but ``wire.py`` beside it. It never sees a test: the
asserts run in the checker process, which calls into this one over the two pipes and gets back
plain data only (``wire.py``), so nothing the candidate does here can decide a pass.

Steps, all before any candidate code runs:

1. read the job (``wire``-encoded dict: code, seed_math, limits, deny_read, allow_read, drop_root)
   from stdin;
2. close every inherited descriptor but stdio and the two pipes;
3. with ``drop_root`` (bubblewrap), when started as root (a root trainer's sandbox), drop to
   uid/gid 65534 with no supplementary groups; refuse to go on as root;
4. create ``home`` and ``tmp`` in the working directory;
5. lower the resource limits (CPU seconds, address space, file size, processes, open files, no
   core dumps; soft = hard, so they cannot be raised again);
6. install the audit hook (``Guard``): a first, in-process fence against obvious misuse (sockets,
   process creation, signals, ctypes, writes outside the working directory). It is not what
   contains the candidate -- the namespaces and the unprivileged uid are -- and it can be switched
   off from Python; the security tests do exactly that.

Then ``exec`` the code in fresh globals (``{"math": math}`` with ``seed_math``), reply
``("loaded", {name: value or reference}, {name: module name})`` or ``("load_error", type, message)``,
and serve requests until ``("exit",)`` or end of input:

    ("call", seq, handle, args, kwargs, budget_s) -> ("return", seq, value, mutated args, mutated kwargs)
    ("next", seq, handle, (), {}, budget_s)       -> ("return", seq, value, [], {}) | ("stop", seq)
    ("iter", seq, handle, (), {}, budget_s)       -> ("return", seq, iterator reference, [], {})
    ("len" | "bool", seq, handle, (), {}, budget_s) -> ("return", seq, int | bool, [], {})
    any of them                                   -> ("raise", seq, type name, message)
                                                   | ("timeout", seq) | ("error", seq, message)

Each request runs under a ``budget_s`` alarm that raises ``TestTimeout`` (a BaseException, so
``except Exception`` in candidate code does not swallow it). Functions, iterators, other iterables
and any other object that is not plain data travel as references kept in a table here; lists, dicts, sets and bytearrays passed as
arguments come back after the call, so the checker can mirror in-place mutation.
"""

from __future__ import annotations

import os
import _signal as signal  # the C module: the signal wrapper imports enum, ~5 ms of every start
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire  # noqa: E402

sys.path.pop(0)

import resource  # noqa: E402

NOBODY = 65534
MESSAGE_CAP = 300
MAX_HANDLES = 4096

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
    """Raised by the per-request alarm."""


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


class Guard:
    """The audit hook (see the module docstring): defence in depth only."""

    def __init__(self, workdir: str, deny_read: list, allow_read: list):
        self.workdir = os.path.realpath(workdir)
        self.deny_read = [os.path.realpath(p) for p in deny_read]
        self.allow_read = [os.path.realpath(p) for p in allow_read] + [self.workdir]
        self.pid = os.getpid()

    def _real(self, path: object) -> str | None:
        if isinstance(path, int):
            return None
        try:
            path = os.fsdecode(path)
        except TypeError:
            return None
        return os.path.realpath(path)  # relative to the current directory, wherever the code moved it

    def _check_write(self, event: str, path: object) -> None:
        real = self._real(path)
        if real is not None and not _under(real, self.workdir):
            raise PermissionError(f"sandbox: {event} outside the working directory is not allowed ({real})")

    def _check_read(self, event: str, path: object) -> None:
        real = self._real(path)
        if real is None:
            return
        if _under(real, "/proc") and not (_under(real, "/proc/self") or _under(real, f"/proc/{self.pid}")):
            raise PermissionError(f"sandbox: {event} of another process's /proc entry is not allowed")
        if any(_under(real, p) for p in self.deny_read) and not any(_under(real, p) for p in self.allow_read):
            raise PermissionError(f"sandbox: {event} of {real} is not allowed")

    def __call__(self, event: str, args: tuple) -> None:
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


# ----------------------------------------------------------------------------- set-up


def close_inherited(keep: set) -> None:
    """Close every descriptor but stdio and ``keep`` (bubblewrap may leave its own open)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def drop_privileges() -> None:
    """As root (uid 0 inside a root trainer's bubblewrap namespace): become 65534, no groups."""
    if os.geteuid() != 0 and os.getuid() != 0:
        return
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    if 0 in os.getresuid() or 0 in os.getresgid():
        raise SystemExit("sandbox: could not leave uid 0")


def set_limits(limits: dict) -> None:
    """Soft = hard for each limit, never above the current hard limit."""
    names = {
        "cpu_time_s": resource.RLIMIT_CPU, "memory_bytes": resource.RLIMIT_AS, "file_size_bytes": resource.RLIMIT_FSIZE,
        "max_processes": resource.RLIMIT_NPROC, "max_open_files": resource.RLIMIT_NOFILE, "core_bytes": resource.RLIMIT_CORE,
    }
    for key, which in names.items():
        value = limits.get(key)
        if value is None:
            continue
        value = int(-(-value // 1))
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing


# ----------------------------------------------------------------------------- the server


def _message(exc: BaseException) -> str:
    try:
        return str(exc)[:MESSAGE_CAP]
    except BaseException:  # a hostile __str__
        return "<the exception's message could not be read>"


class Server:
    """Holds the candidate's objects and answers the checker's requests (see the module docstring)."""

    def __init__(self, request_fd: int, reply_fd: int):
        self.request_fd = request_fd
        self.reply_fd = reply_fd
        self.objects = []
        self.handles = {}
        self.armed = False

    def _alarm(self, signum: int, frame: object) -> None:
        if self.armed:
            self.armed = False
            raise TestTimeout("test execution timed out")

    def as_ref(self, obj: object) -> wire.Ref:
        """A reference for an object that is not plain data: a function, iterator, iterable or other."""
        kind = type(obj)
        if hasattr(kind, "__next__") and hasattr(kind, "__iter__"):
            letter = b"i"
        elif callable(obj):
            letter = b"f"
        elif hasattr(kind, "__iter__"):
            letter = b"r"
        else:
            letter = b"o"
        handle = self.handles.get(id(obj))
        if handle is None:
            if len(self.objects) >= MAX_HANDLES:
                raise wire.WireError(f"more than {MAX_HANDLES} objects handed out")
            handle = len(self.objects)
            self.objects.append(obj)
            self.handles[id(obj)] = handle
        return wire.Ref(letter, handle)

    def lookup(self, kind: bytes, handle: int) -> object:
        if handle >= len(self.objects):
            raise wire.WireError(f"no object {handle}")
        return self.objects[handle]

    def send(self, message: tuple) -> None:
        try:
            payload = wire.encode(message, self.as_ref)
        except BaseException as exc:  # noqa: BLE001 - an unencodable or hostile value: say so instead
            payload = wire.encode(("error", message[1], f"the reply could not be sent: {_message(exc)}"))
        wire.write_frame(self.reply_fd, payload)

    def load(self, code: str, seed_math: bool) -> bool:
        env = {}
        if seed_math:
            import math

            env["math"] = math
        try:
            exec(code, env)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the code did not load
            self.send(("load_error", 0, type(exc).__name__[:80], _message(exc)))
            return False
        values, modules = {}, {}
        for name, value in list(env.items()):
            if not isinstance(name, str) or (name.startswith("__") and name.endswith("__")):
                continue
            if isinstance(value, type(sys)):
                modules[name] = str(getattr(value, "__name__", ""))
                continue
            try:
                wire.encode(value, self.as_ref, max_bytes=1 << 20)
            except BaseException:  # noqa: BLE001 - not plain data and no function: the checker never sees it
                continue
            values[name] = value
        self.send(("loaded", 0, values, modules))
        return True

    def _invoke(self, op: str, target: object, args: tuple, kwargs: dict) -> object:
        if op == "call":
            return target(*args, **kwargs)
        if op == "next":
            return next(target)
        if op == "iter":
            return iter(target)
        if op == "len":
            return len(target)
        if op == "bool":
            return bool(target)
        raise wire.WireError(f"unknown request {op!r}")

    def answer(self, op: str, seq: int, target: object, args: tuple, kwargs: dict, budget: float) -> None:
        """Run one request under its alarm and build the reply (the alarm also covers the reply's
        encoding, so a value that is slow to write times out too)."""
        signal.setitimer(signal.ITIMER_REAL, max(float(budget), 0.001))
        self.armed = True
        try:
            try:
                value = self._invoke(op, target, args, kwargs)
            except StopIteration:
                if op != "next":
                    raise
                reply = ("stop", seq)
            else:
                mutated = [(i, a) for i, a in enumerate(args) if isinstance(a, (list, dict, set, bytearray))]
                kw_mutated = {k: a for k, a in kwargs.items() if isinstance(a, (list, dict, set, bytearray))}
                reply = ("return", seq, value, mutated, kw_mutated)
            payload = wire.encode(reply, self.as_ref)
        except TestTimeout:
            payload = wire.encode(("timeout", seq))
        except wire.WireError as exc:
            payload = wire.encode(("error", seq, _message(exc)))
        except BaseException as exc:  # noqa: BLE001 - the candidate's own error, reported as such
            payload = wire.encode(("raise", seq, type(exc).__name__[:80], _message(exc)))
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        wire.write_frame(self.reply_fd, payload)

    def serve(self) -> None:
        signal.signal(signal.SIGALRM, self._alarm)
        while True:
            try:
                message = wire.decode(wire.read_frame(self.request_fd), make_ref=self.lookup)
            except (wire.ChannelClosed, OSError):
                return
            if message[0] == "exit":
                return
            op, seq, handle, args, kwargs, budget = message
            try:
                target = self.lookup(b"", handle)
            except wire.WireError as exc:
                wire.write_frame(self.reply_fd, wire.encode(("error", seq, _message(exc))))
                continue
            self.answer(op, seq, target, args, kwargs, budget)


def main() -> None:
    request_fd, reply_fd = int(sys.argv[1]), int(sys.argv[2])
    job = wire.decode(sys.stdin.buffer.read())
    close_inherited({request_fd, reply_fd})
    if job.get("drop_root"):
        drop_privileges()
    for name in ("home", "tmp"):
        os.makedirs(name, mode=0o700, exist_ok=True)
    set_limits(job.get("limits", {}))
    server = Server(request_fd, reply_fd)
    sys.addaudithook(Guard(os.getcwd(), job.get("deny_read", []), job.get("allow_read", [])))
    try:
        if server.load(job["code"], job.get("seed_math", False)):
            server.serve()
    except (wire.ChannelClosed, OSError):
        pass  # the checker has gone: nothing is left to answer
    sys.stdout.flush()
    os._exit(0)  # no atexit handlers or lingering threads of the candidate


if __name__ == "__main__":
    main()
