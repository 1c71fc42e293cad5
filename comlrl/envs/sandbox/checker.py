"""The checker side of a sandboxed job: run the asserts against proxies of the candidate, decide pass/fail.

Started by ``comlrl.envs.sandbox`` as ``python -I -S -B checker.py REQUEST_FD REPLY_FD``, as the
trainer's user but in a process of its own (its own session, resource limits, a clean environment),
beside -- never inside -- the candidate's sandbox. Standard library only, plus ``wire.py``.

It reads the job (``wire``-encoded) from stdin:

    {"tests": [str], "pre": [(call, expected) or None] or None, "setup": str, "seed_math": bool,
     "test_timeout_s": float, "max_timeouts": int, "load_timeout_s": float, "limits": {...}}

waits for the candidate's ``("loaded", values, modules)``, builds the test globals -- builtins,
``math`` with ``seed_math``, the trusted ``setup`` (the task prompt's imports), then every other
name the candidate defined: functions, iterators and iterables as proxies (``RemoteFunction`` ...)
that call over the pipes, plain data as copies, modules only from ``SAFE_MODULES``, imported here.
A candidate's name never replaces a builtin or a setup name, so it cannot redefine ``abs`` or
``math`` for the asserts. Each assert then runs here with a per-test alarm, exactly as the original
reward: after ``max_timeouts`` timeouts the rest are skipped; with ``pre`` (the trainer's split of
``assert name(args) == expected``) ``name(args)`` and ``expected`` are first evaluated on their own.

What crosses from the candidate is decoded by ``wire.decode`` (plain data within size and depth
limits); its exceptions become exceptions of the same builtin type (else a new ``Exception``
subclass of that name) with the message capped; a reply that is malformed, out of sequence or too
large means the candidate is broken: the test at hand and the rest are not run. Results go to
stdout as ``wire`` frames of dicts: ``{"event": "load" | "test" | "candidate" | "done", ...}``.
(It imports neither ``re`` nor ``json``: starting fast is part of the sandbox's cost.)
"""

from __future__ import annotations

import builtins
import os
import resource
import _signal as signal  # the C module: the signal wrapper imports enum, ~5 ms of every start
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire  # noqa: E402

sys.path.pop(0)

MESSAGE_CAP = 300
NAME_CAP = 80
GRACE_S = 0.5
CONTROL = {code: "?" for code in list(range(0, 9)) + list(range(11, 32)) + [127]}
SAFE_MODULES = frozenset((
    "math", "cmath", "string", "re", "itertools", "functools", "operator", "collections", "heapq", "bisect",
    "statistics", "fractions", "decimal", "random", "typing", "copy", "json", "datetime", "textwrap",
    "unicodedata", "numbers", "array", "struct", "enum", "dataclasses", "hashlib", "collections.abc",
))


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException, as in the candidate)."""


class CandidateGone(Exception):
    """The candidate exited, or broke the protocol: it can answer nothing more."""


def clean(text: object, cap: int = MESSAGE_CAP) -> str:
    """``text`` as a capped, valid-UTF-8 string without control characters (newline and tab kept)."""
    text = text if isinstance(text, str) else repr(text)
    return text[:cap].encode("utf-8", "replace").decode("utf-8").translate(CONTROL)


_DYNAMIC = {}


CONTROL_FLOW = (StopIteration, StopAsyncIteration)


def remote_exception(name: object, message: object) -> Exception:
    """An exception standing for the candidate's: the builtin ``Exception`` type of that name, else
    a new ``Exception`` subclass called ``name`` -- so a candidate's StopIteration, SystemExit or
    KeyboardInterrupt is an ordinary error here, never control flow of the asserts. Its message is
    the candidate's, capped."""
    name = name if isinstance(name, str) and name.isidentifier() and len(name) <= NAME_CAP else "Exception"
    message = clean(message)
    kind = getattr(builtins, name, None)
    exc = None
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, CONTROL_FLOW):
        try:
            exc = kind(message) if message else kind()
        except Exception:  # noqa: BLE001 - a builtin that takes other arguments (UnicodeDecodeError ...)
            exc = None
    if exc is None:
        kind = _DYNAMIC.setdefault(name, type(name, (Exception,), {"__module__": "sandbox"}))
        exc = kind(message)
    exc.sandbox_message = message
    return exc


# ----------------------------------------------------------------------------- proxies


class Remote:
    """An object kept by the candidate; every use is a request over the pipes.

    Only requests that send nothing of the test's own values are offered: a call (its arguments
    are the test's inputs, as in any call), ``next``, ``iter``, ``len`` and ``bool``. Equality,
    ordering, hashing, ``in`` and ``str`` are the checker's own (identity; ``in`` iterates here),
    so an expected value never reaches the candidate."""

    __slots__ = ("_link", "_handle", "_name")
    kind = b"o"

    def __init__(self, link: Link, handle: int, name: str = ""):
        self._link = link
        self._handle = handle
        self._name = name

    def __repr__(self) -> str:
        return f"<sandboxed {type(self).__name__} {self._name or self._handle}>"

    def __bool__(self) -> bool:
        value = self._link.request("bool", self._handle)
        if type(value) is not bool:
            raise TypeError("__bool__ should return bool")
        return value

    def __len__(self) -> int:
        value = self._link.request("len", self._handle)
        if type(value) is not int or value < 0:
            raise TypeError("__len__ should return a non-negative int")
        return value


class RemoteFunction(Remote):
    __slots__ = ()
    kind = b"f"

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._link.request("call", self._handle, args, kwargs)


class RemoteIterator(Remote):
    __slots__ = ()
    kind = b"i"

    def __iter__(self) -> RemoteIterator:
        return self

    def __next__(self) -> object:
        return self._link.request("next", self._handle)


class RemoteIterable(Remote):
    __slots__ = ()
    kind = b"r"

    def __iter__(self) -> object:
        return self._link.request("iter", self._handle)


PROXIES = {cls.kind: cls for cls in (Remote, RemoteFunction, RemoteIterator, RemoteIterable)}


def mirror(old: object, new: object) -> None:
    """Copy the candidate's post-call state of a mutable argument into the checker's own object."""
    if isinstance(old, (list, bytearray)) and isinstance(new, (list, bytes)) and isinstance(old, list) == isinstance(new, list):
        old[:] = new
    elif isinstance(old, dict) and isinstance(new, dict) or isinstance(old, set) and isinstance(new, set):
        old.clear()
        old.update(new)


class Link:
    """The checker's end of the two pipes: numbered requests, replies checked and decoded."""

    def __init__(self, request_fd: int, reply_fd: int):
        self.request_fd = request_fd
        self.reply_fd = reply_fd
        self.seq = 0
        self.deadline = None
        self.dead = None  # why the candidate can answer no more

    def make_ref(self, kind: bytes, handle: int) -> Remote:
        return PROXIES[kind](self, handle)

    def as_ref(self, obj: object) -> wire.Ref | None:
        if isinstance(obj, Remote) and obj._link is self:
            return wire.Ref(obj.kind, obj._handle)
        return None

    def fail(self, why: str) -> None:
        self.dead = self.dead or why
        raise CandidateGone(self.dead)

    def receive(self, seq: int, deadline: float) -> tuple:
        """The reply numbered ``seq`` (older replies, left by a timed-out request, are skipped)."""
        while True:
            try:
                message = wire.decode(wire.read_frame(self.reply_fd, deadline), make_ref=self.make_ref)
            except wire.ChannelClosed:
                self.fail("exited")
            except wire.WireError as exc:
                self.fail(f"protocol error: {exc}")
            if not (isinstance(message, tuple) and len(message) >= 2 and isinstance(message[0], str) and type(message[1]) is int):
                self.fail("protocol error: a malformed reply")
            if message[1] < seq:
                continue
            if message[1] > seq:
                self.fail("protocol error: a reply out of sequence")
            return message

    def request(self, op: str, handle: int, args: tuple = (), kwargs: dict | None = None) -> object:
        if self.dead:
            raise CandidateGone(self.dead)
        kwargs = dict(kwargs or {})
        budget = self.deadline - time.monotonic()
        if budget <= 0:
            raise TestTimeout("test execution timed out")
        self.seq += 1
        seq = self.seq
        try:
            payload = wire.encode((op, seq, handle, tuple(args), kwargs, budget), self.as_ref)
        except wire.WireError as exc:
            raise TypeError(f"cannot pass this argument to the sandboxed candidate: {exc}") from None
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            try:
                wire.write_frame(self.request_fd, payload, self.deadline + GRACE_S)
            except TimeoutError:
                self.fail("unresponsive: it stopped reading its requests")  # a frame may be half written
            except wire.ChannelClosed:
                self.fail("exited")
            try:
                reply = self.receive(seq, self.deadline + GRACE_S)
            except TimeoutError:
                raise TestTimeout("test execution timed out") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return self.interpret(reply, args, kwargs)

    def interpret(self, reply: tuple, args: tuple, kwargs: dict) -> object:
        kind = reply[0]
        if kind == "return" and len(reply) == 5 and isinstance(reply[3], list) and isinstance(reply[4], dict):
            for item in reply[3]:
                if isinstance(item, tuple) and len(item) == 2 and type(item[0]) is int and 0 <= item[0] < len(args):
                    mirror(args[item[0]], item[1])
            for key, value in reply[4].items():
                if key in kwargs:
                    mirror(kwargs[key], value)
            return reply[2]
        if kind == "stop" and len(reply) == 2:
            raise StopIteration
        if kind == "timeout" and len(reply) == 2:
            raise TestTimeout("test execution timed out")
        if kind == "raise" and len(reply) == 4:
            raise remote_exception(reply[2], reply[3])
        if kind == "error" and len(reply) == 3:
            raise TypeError(clean(reply[2]))
        self.fail("protocol error: an unknown reply")


# ----------------------------------------------------------------------------- the job


def emit(record: dict) -> None:
    """One result record, as a frame on stdout (the trainer reads nothing else from here)."""
    wire.write_frame(1, wire.encode(record))


def error_fields(exc: BaseException) -> dict:
    message = getattr(exc, "sandbox_message", None)
    return {"error_type": clean(type(exc).__name__, NAME_CAP), "error_message": clean(message if message is not None else str(exc))}


def set_limits(limits: dict) -> None:
    for key, which in (("memory_bytes", resource.RLIMIT_AS), ("cpu_time_s", resource.RLIMIT_CPU), ("core_bytes", resource.RLIMIT_CORE)):
        if limits.get(key) is not None:
            value = int(-(-limits[key] // 1))
            hard = resource.getrlimit(which)[1]
            resource.setrlimit(which, (value, value) if hard == resource.RLIM_INFINITY or value <= hard else (hard, hard))


def wait_loaded(link: Link, timeout_s: float) -> tuple | None:
    """The candidate's load reply: (values, modules), or None after emitting why it did not load."""
    try:
        message = link.receive(0, time.monotonic() + timeout_s)
    except (CandidateGone, TimeoutError) as exc:
        emit({"event": "candidate", "state": link.dead or f"no load reply ({exc})"})
        return None
    if message[0] == "loaded" and len(message) == 4 and isinstance(message[2], dict) and isinstance(message[3], dict):
        return message[2], message[3]
    if message[0] == "load_error" and len(message) == 4:
        exc = remote_exception(message[2], message[3])
    else:
        exc = remote_exception("SandboxError", "the candidate's names could not be sent: " + clean(message[-1]))
    emit({"event": "load", "ok": False, **error_fields(exc)})
    return None


def test_globals(job: dict, values: dict, modules: dict) -> dict:
    """Builtins, ``math`` (seed_math), the trusted setup, then the candidate's own names."""
    env = {"__builtins__": builtins}
    if job.get("seed_math"):
        import math

        env["math"] = math
    exec(job.get("setup") or "", env)
    protected = set(env) | set(dir(builtins))
    for name, value in values.items():
        if isinstance(name, str) and name.isidentifier() and name not in protected:
            if isinstance(value, Remote):
                value._name = name
            env[name] = value
    for name, module in modules.items():
        if isinstance(name, str) and name.isidentifier() and name not in protected and module in SAFE_MODULES:
            env[name] = __import__(module, fromlist=["_"])
    return env


def run_assert(test: str, env: dict, pieces: tuple | None) -> None:
    """``pieces``: None, or the (call, expected) sources of an ``assert call == expected`` that the
    original reward evaluates on their own first (split by the trainer, with its regular expression)."""
    if pieces:
        eval(pieces[0], env)
        eval(pieces[1], env)
    exec(test, env)


class Alarm:
    """SIGALRM -> TestTimeout while armed (never between tests)."""

    def __init__(self) -> None:
        self.armed = False
        signal.signal(signal.SIGALRM, self._fire)

    def _fire(self, signum: int, frame: object) -> None:
        if self.armed:
            self.armed = False
            raise TestTimeout("test execution timed out")

    def start(self, seconds: float) -> None:
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def stop(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def run_tests(job: dict, env: dict, link: Link) -> None:
    timeouts, limit = 0, int(job.get("max_timeouts", 3))
    seconds = float(job.get("test_timeout_s", 10.0))
    alarm = Alarm()
    for index, test in enumerate(job["tests"]):
        if timeouts >= limit or link.dead:
            break
        record = {"event": "test", "i": index}
        link.deadline = time.monotonic() + seconds
        try:
            alarm.start(seconds)
            run_assert(test, env, job["pre"][index] if job.get("pre") else None)
            alarm.stop()
            record["status"] = "pass"
        except TestTimeout as exc:
            alarm.stop()
            timeouts += 1
            record.update(status="timeout", **error_fields(exc))
        except BaseException as exc:  # noqa: BLE001 - the assert failed, however
            alarm.stop()
            record.update(status="fail", **error_fields(exc))
        if link.dead:  # the candidate went away during this test: it is not run, nor are the rest
            emit({"event": "candidate", "state": link.dead})
            return
        emit(record)


def main() -> None:
    request_fd, reply_fd = int(sys.argv[1]), int(sys.argv[2])
    job = wire.decode(sys.stdin.buffer.read())
    set_limits(job.get("limits", {}))
    os.set_blocking(request_fd, False)
    os.set_blocking(reply_fd, False)
    link = Link(request_fd, reply_fd)
    loaded = wait_loaded(link, float(job.get("load_timeout_s", 60.0)))
    if loaded is not None:
        try:
            env = test_globals(job, *loaded)
        except BaseException as exc:  # noqa: BLE001 - the trusted setup itself failed: nothing can pass
            emit({"event": "load", "ok": False, **error_fields(exc)})
        else:
            emit({"event": "load", "ok": True})
            run_tests(job, env, link)
    try:
        wire.write_frame(request_fd, wire.encode(("exit",)), time.monotonic() + 0.05)
    except (OSError, TimeoutError, wire.ChannelClosed):
        pass
    emit({"event": "done"})
    os._exit(0)


if __name__ == "__main__":
    main()
