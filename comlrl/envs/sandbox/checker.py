"""The checker side of a sandboxed job: run the asserts against proxies of the candidate, decide pass/fail.

Started by ``comlrl.envs.sandbox`` as ``python -I -S -B checker.py REQUEST_FD REPLY_FD``, as the
trainer's user but in a process of its own (its own session, resource limits, a clean environment),
beside -- never inside -- the candidate's sandbox. Standard library only, plus ``wire.py`` and
``protocol.py``.

It reads the job (``wire``-encoded) from stdin:

    {"tests": [str], "entry_points": [str], "pre": [(call, expected) or None] or None, "setup": str,
     "seed_math": bool, "test_timeout_s": float, "max_timeouts": int, "load_timeout_s": float, "limits": {...},
     "style": "assert" | "unittest"}

waits for the candidate's load reply and builds the asserts' globals: builtins, ``math`` with
``seed_math``, the trusted ``setup`` (the task's imports: the test module's own names), then, for
each entry point the candidate defined, a proxy (``RemoteFunction`` ...) that calls over the pipes
(or the plain value the name holds). Nothing else the candidate defines is visible to the asserts,
and an entry point never replaces a name of the test module. Each assert then runs here with a
per-test alarm, exactly as the original reward: after ``max_timeouts`` timeouts the rest are
skipped; with ``pre`` (the trainer's split of ``assert name(args) == expected``) ``name(args)`` and
``expected`` are first evaluated on their own. A ``"unittest"`` job (class-level tasks): ``setup``
is the test module, ``tests`` its test ids, each run as unittest runs it and its outcome recorded
here (``unittest_runner.py``); tests use the candidate's objects through proxies (attributes by
``getattr`` / ``setattr`` / ``delattr``, methods as references).

Every reply is checked against the request it answers (``protocol.py``; ``Link.interpret``): its id
and request, a reply kind that request allows, and a value of the right type (an iterator for
``iter``, an int >= 0 for ``len``, a bool for ``bool``, None for ``setattr`` and ``delattr``,
mutated arguments that are the arguments passed). Anything else is a protocol violation: the assert
at hand fails and the candidate is asked nothing more. A candidate's exception becomes an exception of the same builtin type (else a new
``Exception`` subclass of that name), never StopIteration, SystemExit or KeyboardInterrupt, so
nothing it sends is control flow here: only the answer ``end`` to a ``next`` ends an iteration.
What crosses is decoded by ``wire.decode`` (plain data within size and depth limits) while the
assert's alarm runs. Results go to stdout as ``wire`` frames of dicts:
``{"event": "load" | "test" | "candidate" | "done", ...}``. (It imports neither ``re`` nor ``json``:
starting fast is part of the sandbox's cost.)
"""

from __future__ import annotations

import builtins
import os
import resource
import _signal as signal  # the C module: the signal wrapper imports enum, ~5 ms of every start
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402
import wire  # noqa: E402

sys.path.pop(0)

GRACE_S = 0.5
MAX_PROXIES = 1 << 16
MAX_EXCEPTION_TYPES = 256
"""Exception classes made for the candidate's own exception names (more are plain ``Exception``)."""
CONTROL_FLOW = (StopIteration, StopAsyncIteration)


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException, as in the candidate)."""


class CandidateGone(BaseException):
    """The candidate exited, stopped answering, or broke the protocol: it is asked nothing more.

    A BaseException, so that no ``except Exception`` and no C-level fallback of the assert's code
    (a length hint swallowing TypeError, ``getattr``'s default swallowing AttributeError) can turn it
    into anything but the end of the assert."""


_DYNAMIC = {}


def remote_exception(name: str, message: str) -> Exception:
    """An exception standing for the candidate's: the builtin ``Exception`` type of that name, else
    a new ``Exception`` subclass called ``name`` -- so a candidate's StopIteration, SystemExit or
    KeyboardInterrupt is an ordinary error here, never control flow of the asserts."""
    kind = getattr(builtins, name, None)
    exc = None
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, CONTROL_FLOW):
        try:
            exc = kind(message) if message else kind()
        except Exception:  # noqa: BLE001 - a builtin that takes other arguments (UnicodeDecodeError ...)
            exc = None
    if exc is None:
        kind = _DYNAMIC.get(name)
        if kind is None and len(_DYNAMIC) < MAX_EXCEPTION_TYPES:
            kind = _DYNAMIC[name] = type(name, (Exception,), {"__module__": "sandbox"})
        exc = (kind or Exception)(message)
    exc.sandbox_message = message
    return exc


# ----------------------------------------------------------------------------- proxies


OWN = frozenset(("_sbx_link", "_sbx_handle", "_sbx_name"))  # a proxy's own attributes; any other name is the candidate's


class Remote:
    """An object kept by the candidate; every use is a request over the pipes.

    Only requests that send nothing of the test's but its inputs: a call, ``next``, ``iter``, ``len``,
    ``bool``, and reading, setting (to a value the test gives) and deleting an attribute by name.
    Equality, ordering, hashing, ``in``, ``str`` and ``isinstance`` are the checker's own (identity;
    ``in`` iterates here), so an expected value never reaches the candidate."""

    __slots__ = tuple(sorted(OWN))
    _sbx_kind = b"o"

    def __init__(self, link: Link, handle: int, name: str = ""):
        self._sbx_link = link
        self._sbx_handle = handle
        self._sbx_name = name

    def __repr__(self) -> str:
        return f"<sandboxed {type(self).__name__} {self._sbx_name or self._sbx_handle}>"

    def __bool__(self) -> bool:
        return self._sbx_link.request("bool", self._sbx_handle)

    def __len__(self) -> int:
        return self._sbx_link.request("len", self._sbx_handle)

    def __getattr__(self, name: str) -> object:
        if name.startswith("_sbx_"):  # a slot not yet set: never the candidate's
            raise AttributeError(name)
        return self._sbx_link.request("getattr", self._sbx_handle, (name,))

    def __setattr__(self, name: str, value: object) -> None:
        if name in OWN:
            object.__setattr__(self, name, value)
        else:
            self._sbx_link.request("setattr", self._sbx_handle, (name, value))

    def __delattr__(self, name: str) -> None:
        if name in OWN:
            raise AttributeError(f"{name} of a sandboxed object cannot be deleted")
        self._sbx_link.request("delattr", self._sbx_handle, (name,))


class RemoteFunction(Remote):
    """A function, a class or a bound method of the candidate: calling it is a ``call``."""

    __slots__ = ()
    _sbx_kind = b"f"

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._sbx_link.request("call", self._sbx_handle, args, kwargs)


class RemoteIterator(Remote):
    __slots__ = ()
    _sbx_kind = b"i"

    def __iter__(self) -> RemoteIterator:
        return self

    def __next__(self) -> object:
        return self._sbx_link.request("next", self._sbx_handle)


class RemoteIterable(Remote):
    __slots__ = ()
    _sbx_kind = b"r"

    def __iter__(self) -> object:
        return self._sbx_link.request("iter", self._sbx_handle)


PROXIES = {cls._sbx_kind: cls for cls in (Remote, RemoteFunction, RemoteIterator, RemoteIterable)}
PLAIN_MUTABLE = (list, dict, set)


def mirror(old: object, new: object) -> None:
    """Copy the candidate's post-call state of a mutable argument into the checker's own object."""
    if isinstance(old, list):
        old[:] = new
    else:
        old.clear()
        old.update(new)


def _valid_text(value: object, cap: int) -> bool:
    return type(value) is str and len(value) <= cap


class Link:
    """The checker's end of the two pipes: numbered requests, each reply checked against its request."""

    VALUE_CHECKS = {
        "call": lambda link, value: True,
        "next": lambda link, value: True,
        "iter": lambda link, value: type(value) is RemoteIterator and value._sbx_link is link,
        "len": lambda link, value: type(value) is int and 0 <= value <= sys.maxsize,
        "bool": lambda link, value: type(value) is bool,
        "getattr": lambda link, value: True,
        "setattr": lambda link, value: value is None,
        "delattr": lambda link, value: value is None,
    }
    """op -> whether a ``value`` reply holds a valid answer to it (see protocol.REQUESTS)."""

    def __init__(self, request_fd: int, reply_fd: int):
        self.request_fd = request_fd
        self.reply_fd = reply_fd
        self.rid = 0
        self.deadline = None
        self.dead = None  # why the candidate can answer no more
        self.violated = False
        self.proxies = {}

    def make_ref(self, kind: bytes, handle: int) -> Remote:
        """One proxy per reference, so ``is`` works on what the candidate returns twice."""
        proxy = self.proxies.get((kind, handle))
        if proxy is None:
            if len(self.proxies) >= MAX_PROXIES:
                raise wire.WireError(f"more than {MAX_PROXIES} references")
            proxy = self.proxies[(kind, handle)] = PROXIES[kind](self, handle)
        return proxy

    def as_ref(self, obj: object) -> wire.Ref | None:
        if isinstance(obj, Remote) and obj._sbx_link is self:
            return wire.Ref(obj._sbx_kind, obj._sbx_handle)
        return None

    def fail(self, why: str) -> None:
        self.dead = self.dead or why
        raise CandidateGone(self.dead)

    def violation(self, why: str) -> None:
        """A reply that is no valid answer: the assert at hand fails, nothing more is asked."""
        if not self.dead:
            self.violated = True
        self.fail(f"protocol violation: {why}")

    @staticmethod
    def _unalarmed(function, *args):
        """``function(*args)`` with SIGALRM held back: a frame is read or written whole or not at all."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            return function(*args)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def receive(self, rid: int, op: str, deadline: float) -> tuple:
        """The reply to request ``rid`` (``op``); late replies to earlier requests that timed out
        here are skipped. The frame is decoded under the assert's alarm."""
        while True:
            try:
                frame = self._unalarmed(wire.read_frame, self.reply_fd, deadline)
            except wire.ChannelClosed:
                self.fail("exited")
            except wire.WireError as exc:
                self.violation(str(exc))
            try:
                message = wire.decode(frame, make_ref=self.make_ref)
            except wire.WireError as exc:
                self.violation(str(exc))
            if not (type(message) is tuple and len(message) >= 3 and type(message[1]) is int):
                self.violation("a reply that is not (kind, request id, request, ...)")
            if 0 < message[1] < rid:
                continue
            if message[1] != rid or message[2] != op:
                self.violation(f"a reply to another request than #{rid} ({op})")
            return message

    def request(self, op: str, handle: int, args: tuple = (), kwargs: dict | None = None) -> object:
        if self.dead:
            raise CandidateGone(self.dead)
        kwargs = dict(kwargs or {})
        budget = self.deadline - time.monotonic()
        if budget <= 0:
            raise TestTimeout("test execution timed out")
        self.rid += 1
        try:
            payload = wire.encode((op, self.rid, handle, tuple(args), kwargs, budget), self.as_ref)
        except wire.WireError as exc:
            raise TypeError(f"cannot pass this argument to the sandboxed candidate: {exc}") from None
        try:
            self._unalarmed(wire.write_frame, self.request_fd, payload, self.deadline + GRACE_S)
        except TimeoutError:
            self.fail("unresponsive: it stopped reading its requests")  # a frame may be half written
        except wire.ChannelClosed:
            self.fail("exited")
        try:
            reply = self.receive(self.rid, op, self.deadline + GRACE_S)
        except TimeoutError:
            raise TestTimeout("test execution timed out") from None
        return self.interpret(op, reply, args, kwargs)

    def interpret(self, op: str, reply: tuple, args: tuple = (), kwargs: dict | None = None) -> object:
        """What ``reply`` means as the answer to ``op``, or a protocol violation."""
        kind = reply[0]
        if kind not in protocol.REQUESTS[op] or len(reply) != 3 + protocol.REPLY_FIELDS[kind]:
            shown = kind[:20] if type(kind) is str else f"a {type(kind).__name__}"
            self.violation(f"{shown!r} is not an answer to {op!r}")
        if kind == "value":
            value, mutated, kw_mutated = reply[3:]
            if op != protocol.LOAD and not self.VALUE_CHECKS[op](self, value):
                self.violation(f"a {type(value).__name__} is not an answer to {op!r}")
            self._mirror(args, kwargs or {}, mutated, kw_mutated)
            return value
        if kind == "end":
            raise StopIteration
        if kind == "timeout":
            raise TestTimeout("test execution timed out")
        if kind == "raised":
            name, message = reply[3:]
            if not (_valid_text(name, protocol.NAME_CAP) and name.isidentifier() and _valid_text(message, protocol.MESSAGE_CAP)):
                self.violation("an exception's name or message out of bounds")
            raise remote_exception(name, message)
        if not _valid_text(reply[3], protocol.MESSAGE_CAP):
            self.violation("an unsendable reason out of bounds")
        raise TypeError(f"the sandboxed candidate's value could not be sent: {reply[3]}")

    def _mirror(self, args: tuple, kwargs: dict, mutated: object, kw_mutated: object) -> None:
        """Apply the candidate's in-place changes to the arguments passed: each must name a list,
        dict or set argument once and hold a value of the same plain type."""
        if type(mutated) is not list or type(kw_mutated) is not dict:
            self.violation("mutated arguments that are not a list and a dict")
        changes = []
        for item in mutated:
            if not (type(item) is tuple and len(item) == 2 and type(item[0]) is int and 0 <= item[0] < len(args)):
                self.violation("a mutated argument that was not passed")
            changes.append((item[0], args[item[0]], item[1]))
        changes += [(key, kwargs.get(key), value) for key, value in kw_mutated.items()]
        if len({key for key, _, _ in changes}) != len(changes):
            self.violation("an argument mutated twice")
        for key, old, new in changes:
            plain = next((kind for kind in PLAIN_MUTABLE if isinstance(old, kind)), None)
            if plain is None or type(new) is not plain or (isinstance(key, str) and key not in kwargs):
                self.violation("a mutated argument of another type than the one passed")
        for _, old, new in changes:
            mirror(old, new)


# ----------------------------------------------------------------------------- the job


def emit(record: dict) -> None:
    """One result record, as a frame on stdout (the trainer reads nothing else from here)."""
    wire.write_frame(1, wire.encode(record))


def error_fields(exc: BaseException) -> dict:
    """The failed assert's error: type name and message, capped (the trainer cleans them)."""
    message = getattr(exc, "sandbox_message", None)
    name = type(exc).__name__
    return {"error_type": name[:protocol.NAME_CAP] if isinstance(name, str) else "Exception",
            "error_message": message if message is not None else protocol.exception_message(exc)}


def set_limits(limits: dict) -> None:
    for key, which in (("memory_bytes", resource.RLIMIT_AS), ("cpu_time_s", resource.RLIMIT_CPU), ("core_bytes", resource.RLIMIT_CORE)):
        if limits.get(key) is not None:
            value = int(-(-limits[key] // 1))
            hard = resource.getrlimit(which)[1]
            resource.setrlimit(which, (value, value) if hard == resource.RLIM_INFINITY or value <= hard else (hard, hard))


def wait_loaded(link: Link, entry_points: list, timeout_s: float) -> dict | None:
    """The entry points the candidate defined ({name: value}), or None after emitting why it did not load."""
    try:
        reply = link.receive(0, protocol.LOAD, time.monotonic() + timeout_s)
        exports = link.interpret(protocol.LOAD, reply)
        if type(exports) is not dict or not all(type(name) is str and name in entry_points for name in exports):
            link.violation("a load reply with names that are not the entry points")
        return exports
    except (CandidateGone, TimeoutError) as exc:
        if link.violated:
            emit({"event": "load", "ok": False, "error_type": "ProtocolViolation", "error_message": link.dead})
        emit({"event": "candidate", "state": link.dead or f"no load reply ({exc})"})
    except Exception as exc:  # noqa: BLE001 - the candidate's code raised while loading
        emit({"event": "load", "ok": False, **error_fields(exc)})
    return None


def test_globals(job: dict, exports: dict) -> dict:
    """Builtins, ``math`` (seed_math), the trusted setup (the test module's names), then a proxy (or
    the value) of each entry point the candidate defined that the test module does not define itself."""
    env = {"__builtins__": builtins}
    if job.get("style") == "unittest":
        env["__name__"] = "sandbox_tests"  # the test module's name (its TestCase classes' __module__)
    if job.get("seed_math"):
        import math

        env["math"] = math
    exec(job.get("setup") or "", env)
    own = set(env)
    for name in job["entry_points"]:
        if name in exports and name not in own:
            value = exports[name]
            if isinstance(value, Remote) and not value._sbx_name:
                value._sbx_name = name
            env[name] = value
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
        if not report_test(link, record):
            return


def report_test(link: Link, record: dict) -> bool:
    """Emit a test's record; False (a violation fails it; the rest are not run) when the candidate is gone."""
    if link.dead:
        if link.violated:
            emit(dict(record, status="fail", error_type="ProtocolViolation", error_message=link.dead))
        emit({"event": "candidate", "state": link.dead})
        return False
    emit(record)
    return True


def run_unittests(job: dict, env: dict, link: Link) -> None:
    """A ``style: "unittest"`` job (class-level tasks): ``unittest_runner.py`` beside this file."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import unittest_runner  # only these jobs pay for importing unittest
    sys.path.pop(0)
    unittest_runner.run(job, env, link, alarm=Alarm(), report=report_test, error_fields=error_fields, timeout_type=TestTimeout)


def main() -> None:
    request_fd, reply_fd = int(sys.argv[1]), int(sys.argv[2])
    job = wire.decode(sys.stdin.buffer.read())
    set_limits(job.get("limits", {}))
    os.set_blocking(request_fd, False)
    os.set_blocking(reply_fd, False)
    link = Link(request_fd, reply_fd)
    exports = wait_loaded(link, list(job["entry_points"]), float(job.get("load_timeout_s", 60.0)))
    if exports is not None:
        try:
            env = test_globals(job, exports)
        except BaseException as exc:  # noqa: BLE001 - the trusted setup itself failed: nothing can pass
            emit({"event": "load", "ok": False, **error_fields(exc)})
        else:
            emit({"event": "load", "ok": True})
            (run_unittests if job.get("style") == "unittest" else run_tests)(job, env, link)
    try:
        wire.write_frame(request_fd, wire.encode(("exit", link.rid + 1)), time.monotonic() + 0.05)
    except (OSError, TimeoutError, wire.ChannelClosed):
        pass
    emit({"event": "done"})
    os._exit(0)


if __name__ == "__main__":
    main()
