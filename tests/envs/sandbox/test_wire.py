"""The pieces the sandbox's guarantees rest on, alone: the wire format, the result parser, the seccomp program.

``wire.decode`` is the only code that reads what a candidate sends; it must give back exactly what
an honest candidate encoded, and for anything else raise ``WireError`` -- never another exception,
never a recursion, never an allocation the data did not pay for.
"""

from __future__ import annotations

import math
import random
import signal
import struct

import pytest

from comlrl.envs.sandbox import seccomp, wire
from comlrl.envs.sandbox.jobs import parse_results

VALUES = [
    None, True, False, 0, -1, 127, 128, -129, 2 ** 200, -(3 ** 150), 0.1, -0.0, float("inf"), 1e-310, complex(1.5, -2),
    "", "héllo", "\ud800 lone surrogate", b"", b"\x00\xff", [], (), {}, set(), frozenset(),
    [1, [2, [3, (4, "x")]]], {"a": [1, 2], (1, 2): {frozenset({1}): None}}, {1, "a", (2, 3)},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_round_trip_is_exact(value):
    back = wire.decode(wire.encode(value))
    assert back == value and type(back) is type(value)


def test_nan_and_negative_zero_keep_their_bits():
    assert math.isnan(wire.decode(wire.encode(float("nan"))))
    assert math.copysign(1.0, wire.decode(wire.encode(-0.0))) == -1.0


def test_subclasses_travel_as_the_plain_type():
    class Loud(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    back = wire.decode(wire.encode([Loud(3), True]))
    assert type(back[0]) is int and back == [3, True] and back[0] != 4


def test_anything_else_is_refused_unless_made_a_reference():
    with pytest.raises(wire.WireError, match="cannot cross"):
        wire.encode(object())
    ref = wire.decode(wire.encode([len], as_ref=lambda obj: wire.Ref(b"f", 7)), make_ref=lambda kind, handle: (kind, handle))
    assert ref == [(b"f", 7)]
    with pytest.raises(wire.WireError, match="reference is not allowed"):
        wire.decode(wire.encode(wire.Ref(b"f", 1)))


def test_limits():
    deep = []
    for _ in range(wire.MAX_DEPTH):
        deep = [deep]
    assert wire.decode(wire.encode(deep)) == deep  # 200 levels: what both ends accept
    with pytest.raises(wire.WireError, match="deeper"):
        wire.encode([[deep]])
    with pytest.raises(wire.WireError, match="deeper"):
        wire.decode(b"l\x00\x00\x00\x01" * 100000 + b"N")  # 100000 levels: no RecursionError
    with pytest.raises(wire.WireError, match="more than"):
        wire.decode(b"l" + struct.pack(">I", 20) + b"N" * 20, max_items=10)
    with pytest.raises(wire.WireError, match="more items than the data holds"):
        wire.decode(b"l" + struct.pack(">I", 0xFFFFFFFF))  # no four-billion-slot list is made
    with pytest.raises(wire.WireError, match="larger than"):
        wire.encode("x" * 100, max_bytes=50)
    with pytest.raises(wire.WireError, match="int of"):
        wire.decode(b"i" + struct.pack(">I", wire.MAX_INT_BYTES + 1) + b"\x01" * (wire.MAX_INT_BYTES + 1))
    shared = [0]
    for _ in range(40):
        shared = [shared, shared]
    with pytest.raises(wire.WireError, match="larger than"):
        wire.encode(shared, max_bytes=1 << 20)  # 2**40 leaves behind 40 objects


@pytest.mark.parametrize("data", [b"", b"[" * 200000, b"\xff", b"s\x00\x00\x00\x02\xff\xfe", b"S\x00\x00\x00\x01l\x00\x00\x00\x00",
                                  b"NN", b"d\x00\x00\x00\x01N", b"R?\x00\x00\x00\x01"])
def test_junk_is_a_wire_error(data):
    with pytest.raises(wire.WireError):
        wire.decode(data, make_ref=lambda kind, handle: None)


def test_fuzz_only_wire_errors():
    rng = random.Random(19)
    seeds = [wire.encode(v) for v in VALUES]
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            if data and rng.random() < 0.7:
                data[rng.randrange(len(data))] = rng.randrange(256)
            else:
                data[rng.randrange(len(data) + 1):0] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        try:
            wire.decode(bytes(data), make_ref=lambda kind, handle: (kind, handle))
        except wire.WireError:
            pass


def test_result_parser_takes_only_whole_records():
    frame = lambda value: (lambda p: struct.pack(">I", len(p)) + p)(wire.encode(value))  # noqa: E731
    data = (frame({"event": "load", "ok": True}) + frame({"event": "test", "i": 0, "status": "pass"})
            + frame({"event": "test", "i": 0, "status": "fail"})  # a second record for test 0 is ignored
            + frame({"event": "test", "i": 9, "status": "pass"}) + frame(["not", "a", "dict"])
            + frame({"event": "test", "i": 1, "status": "fail", "error_type": "E" * 500, "error_message": "m" * 1000})
            + struct.pack(">I", 10 ** 6) + b"[" * 200)
    report = parse_results(data, ["t0", "t1", "t2"])
    assert report.loaded and [r.status for r in report.results] == ["pass", "fail", "not run"]
    assert len(report.results[1].error_type) == 80 and len(report.results[1].error_message) == 300
    assert not report.completed  # no "done" record
    assert parse_results(b"[" * 200000, ["t"]).results[0].status == "not run"


def test_members_with_colliding_hashes_are_rebuilt_interruptibly():
    """100,000 ints with one hash make a set quadratic to rebuild (minutes). The decoder builds sets
    and dicts one member at a time, so the receiver's alarm (the checker's per-assert alarm) stops it."""
    n = 100_000
    member = lambda k: b"i" + struct.pack(">I", 10) + (k * (2 ** 61 - 1)).to_bytes(10, "big", signed=True)  # noqa: E731
    members = b"".join(member(k) for k in range(n))
    frames = [b"S" + struct.pack(">I", n) + members, b"Z" + struct.pack(">I", n) + members, b"K" + struct.pack(">I", n) + members,
              b"d" + struct.pack(">I", n) + b"".join(member(k) + b"N" for k in range(n))]

    class Alarm(Exception):
        pass

    def fire(signum, frame):
        raise Alarm

    previous = signal.signal(signal.SIGALRM, fire)
    try:
        for frame in frames:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Alarm):
                wire.decode(frame)
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------- the seccomp program


def run_bpf(program: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """A cBPF interpreter for the four instructions the filter uses, on ``struct seccomp_data``
    (``arg0``: the low 32 bits of the first argument)."""
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    data = {0: nr, 4: arch, 16: arg0}
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc, pc = data[k], pc + 1
        elif code in (0x15, 0x35):
            hit = acc == k if code == 0x15 else acc >= k
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_seccomp_program_denies_the_list_and_allows_the_rest(machine):
    audit_arch, table, foreign = seccomp.ARCHES[machine]
    program = seccomp.program(machine)
    assert set(table) <= set(seccomp.DENIED) and len(set(table.values())) == len(table)
    for name, nr in table.items():
        assert run_bpf(program, audit_arch, nr) == 0x00050001, name  # EPERM
    allowed = set(range(0, 460)) - set(table.values())
    assert {run_bpf(program, audit_arch, nr) for nr in allowed} == {0x7FFF0000}
    # socket and socketpair, whatever the family (AF_UNIX 1, AF_INET 2, AF_NETLINK 16, AF_PACKET 17, AF_VSOCK 40 ...)
    assert {"socket", "socketpair"} <= set(table)
    for name in ("socket", "socketpair"):
        assert {run_bpf(program, audit_arch, table[name], arg0=family) for family in range(0, 64)} == {0x00050001}
    assert run_bpf(program, 0x40000003, 3) == 0x80000000  # i386 on x86-64 (or any other ABI): killed
    if foreign is not None:
        assert run_bpf(program, audit_arch, foreign | 1) == 0x80000000  # x32
    assert seccomp.program("riscv64") is None and seccomp.describe("riscv64").startswith("none")
