"""The candidate side of a sandboxed job: load the candidate's code, then answer the checker's calls.

Started by ``comlrl.envs.sandbox`` as ``python -I -S -B harness.py REQUEST_FD REPLY_FD`` inside the
isolation (bubblewrap: its own user, PID, network, IPC and mount namespaces; or none). Standard
library only; it imports nothing of comlrl but ``wire.py`` and ``protocol.py`` beside it. It never
sees a test: the asserts run in the checker process, which calls into this one over the two pipes
and gets back plain data only (``wire.py``), so nothing the candidate does here can decide a pass.

Steps, all before any candidate code runs:

1. read the job (``wire``-encoded dict: code, exports, seed_math, limits, deny_read, allow_read,
   drop_root) from stdin;
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

Then ``exec`` the code in fresh globals (``{"math": math}`` with ``seed_math``), answer the load
with the job's ``exports`` (the entry points the asserts call: only those names, as values or
references) or with the exception that stopped it, and serve the checker's requests until
``("exit", rid)`` or end of input, each with one of the replies ``protocol.py`` allows for it
(``Server.OPS``): a value, the end of an iteration (``next`` only), a raised exception, a timeout,
or a value that could not be sent.

Each request runs under a ``budget_s`` alarm that raises ``TestTimeout`` (a BaseException, so
``except Exception`` in candidate code does not swallow it). Functions, iterators, other iterables
and any other object that is not plain data (a class and its instances) travel as references kept
in a table here, whose attributes the checker may read, set and delete by name; lists,
dicts and sets passed as arguments come back after a call, so the checker can mirror in-place
mutation. None of this is trusted: the candidate's code runs in this process and can rewrite any
of it, which is why the checker checks every reply against the request it answers.
"""

from __future__ import annotations

import os
import _signal as signal  # the C module: the signal wrapper imports enum, ~5 ms of every start
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402
import wire  # noqa: E402

sys.path.pop(0)

import resource  # noqa: E402

NOBODY = 65534
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


class _Probe:
    def method(self) -> None:
        """Only here to name the type of bound methods (importing ``types`` would cost every job)."""


MethodType = type(_Probe().method)
MUTABLE = (list, dict, set)
"""Argument types whose state after a call goes back to the checker (which mirrors it); the checker
sends them as exactly these types (a reference to a candidate object is never one of them)."""


def _kind(obj: object) -> bytes:
    """The reference kind of an object that is not plain data."""
    kind = type(obj)
    if hasattr(kind, "__next__"):
        return b"i"
    if callable(obj):
        return b"f"
    return b"r" if hasattr(kind, "__iter__") else b"o"


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

    def as_ref(self, obj: object, kind: bytes | None = None) -> wire.Ref:
        """A reference for an object that is not plain data: a function, iterator, iterable or other.
        A bound method is new at every attribute read: it is known by its object and function, so
        calling ``obj.method`` in a loop hands out one reference, not one per call."""
        key = ("method", id(obj.__self__), id(obj.__func__)) if type(obj) is MethodType else id(obj)
        handle = self.handles.get(key)
        if handle is None:
            if len(self.objects) >= MAX_HANDLES:
                raise wire.WireError(f"more than {MAX_HANDLES} objects handed out")
            handle = len(self.objects)
            self.objects.append(obj)  # keeps it (and a method's object and function) alive: ids stay unique
            self.handles[key] = handle
        return wire.Ref(kind or _kind(obj), handle)

    def lookup(self, kind: bytes, handle: int) -> object:
        if handle >= len(self.objects):
            raise wire.WireError(f"no object {handle}")
        return self.objects[handle]

    def reply(self, *message: object) -> None:
        wire.write_frame(self.reply_fd, wire.encode(message))

    def load(self, code: str, seed_math: bool, exports: list) -> bool:
        env = {}
        if seed_math:
            import math

            env["math"] = math
        try:
            exec(code, env)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the code did not load
            self.reply("raised", 0, protocol.LOAD, protocol.exception_name(exc), protocol.exception_message(exc))
            return False
        values = {}
        for name in exports:
            if name in env:
                try:
                    wire.encode(env[name], self.as_ref, max_bytes=1 << 20)
                except BaseException:  # noqa: BLE001 - a value that cannot be sent: the asserts do not see it
                    continue
                values[name] = env[name]
        wire.write_frame(self.reply_fd, wire.encode(("value", 0, protocol.LOAD, values, [], {}), self.as_ref))
        return True

    # op -> how the candidate answers it (the reply kinds each may give are in protocol.REQUESTS)
    OPS = {
        "call": lambda target, args, kwargs: target(*args, **kwargs),
        "next": lambda target, args, kwargs: next(target),
        "iter": lambda target, args, kwargs: iter(target),
        "len": lambda target, args, kwargs: len(target),
        "bool": lambda target, args, kwargs: bool(target),
        "getattr": lambda target, args, kwargs: getattr(target, args[0]),
        "setattr": lambda target, args, kwargs: setattr(target, args[0], args[1]),
        "delattr": lambda target, args, kwargs: delattr(target, args[0]),
    }

    def answer(self, op: str, rid: int, target: object, args: tuple, kwargs: dict, budget: float) -> bytes:
        """Run one request under its alarm and build its reply (the alarm also covers the reply's
        encoding, so a value that is slow to write times out too)."""
        signal.setitimer(signal.ITIMER_REAL, max(float(budget), 0.001))
        self.armed = True
        try:
            try:
                value = self.OPS[op](target, args, kwargs)
            except StopIteration:
                if op != "next":
                    raise
                return wire.encode(("end", rid, op))
            mutated = [(i, a) for i, a in enumerate(args) if type(a) in MUTABLE]  # what the checker sent: plain types
            kw_mutated = {k: a for k, a in kwargs.items() if type(a) in MUTABLE}
            if op == "iter":  # whatever iter() returned is an iterator (it checks): say so
                value = self.as_ref(value, b"i")
            return wire.encode(("value", rid, op, value, mutated, kw_mutated), self.as_ref)
        except TestTimeout:
            return wire.encode(("timeout", rid, op))
        except wire.WireError as exc:
            return wire.encode(("unsendable", rid, op, protocol.exception_message(exc)))
        except BaseException as exc:  # noqa: BLE001 - the candidate's own error, reported as such
            return wire.encode(("raised", rid, op, protocol.exception_name(exc), protocol.exception_message(exc)))
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    def serve(self) -> None:
        signal.signal(signal.SIGALRM, self._alarm)
        while True:
            try:
                message = wire.decode(wire.read_frame(self.request_fd), make_ref=self.lookup)
            except (wire.ChannelClosed, OSError):
                return
            if message[0] == "exit":
                return
            op, rid, handle, args, kwargs, budget = message
            try:
                payload = self.answer(op, rid, self.lookup(b"", handle), args, kwargs, budget)
            except wire.WireError as exc:
                payload = wire.encode(("unsendable", rid, op, protocol.exception_message(exc)))
            wire.write_frame(self.reply_fd, payload)


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
        if server.load(job["code"], job.get("seed_math", False), list(job.get("exports", []))):
            server.serve()
    except (wire.ChannelClosed, OSError):
        pass  # the checker has gone: nothing is left to answer
    sys.stdout.flush()
    os._exit(0)  # no atexit handlers or lingering threads of the candidate


if __name__ == "__main__":
    main()
