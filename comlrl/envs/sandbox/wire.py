"""The plain-data wire format between the checker and the sandboxed candidate (standard library only).

Both ends import this file: the checker and the candidate harness run it as the top-level module
``wire`` (their scripts put this directory on ``sys.path``); the trainer imports it as
``comlrl.envs.sandbox.wire``. It imports nothing of comlrl.

Values: None, bool, int, float, complex, str, bytes, and list / tuple / dict / set / frozenset of
values; dict keys / items / values views, range, deque, Fraction and Decimal, rebuilt as themselves
from their plain contents; and *references* (``Ref``: a kind letter and a handle number) that stand
for objects kept on the other side (a function, an iterator, an iterable, any other object).
Nothing else can be written, so nothing else can be read: the decoder builds builtin and standard
library objects from plain data only, and never calls anything of the sender's.

Encoding (big-endian): one tag byte, then

    N T F            None, True, False
    i <u32 n> <n>    int, signed two's complement
    f <8>  c <16>    float, complex (IEEE 754 doubles: exact, NaN and -0.0 kept)
    s <u32 n> <n>    str, UTF-8 with surrogates passed through
    b <u32 n> <n>    bytes
    l t S Z <u32 n>  list, tuple, set, frozenset of n values
    d <u32 n>        dict of n key, value pairs
    K I V Q <u32 n>  dict keys / items / values view, deque of n values
    g q x <u32 n>    range (start, stop, step), Fraction (numerator, denominator), Decimal (its str)
    R <kind> <u32>   a reference

A frame on a pipe is ``<u32 length> <encoded value>``. ``decode`` is iterative (no recursion, so
no ``RecursionError`` however deep the input) and checks every limit before it allocates: nesting
depth, item count, string and integer size, declared counts against the bytes left, and trailing
bytes; any violation raises ``WireError``. Sets and dicts are rebuilt one member at a time, so a
receiver's alarm can stop a rebuild that colliding hashes make quadratic.
"""

from __future__ import annotations

import os
import select
import struct
import sys
import time

TYPE_CHECKING = False  # typing is for readers only: importing it would cost every job ~14 ms of start-up
if TYPE_CHECKING:
    from typing import Callable

MAX_DEPTH = 200
MAX_ITEMS = 1 << 20
MAX_FRAME = 16 << 20
MAX_INT_BYTES = 1 << 16
REF_KINDS = (b"f", b"i", b"r", b"o")  # function, iterator, iterable, any other object

_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")
_C128 = struct.Struct(">dd")


def _fraction(items: list) -> object:
    import fractions

    numerator, denominator = items
    if type(numerator) is not int or type(denominator) is not int:
        raise TypeError("a Fraction is two ints")
    return fractions.Fraction(numerator, denominator)


def _decimal(items: list) -> object:
    import decimal

    (text,) = items
    if type(text) is not str:
        raise TypeError("a Decimal is one str")
    return decimal.Decimal(text)


def _range(items: list) -> range:
    if len(items) != 3 or any(type(i) is not int for i in items):
        raise TypeError("a range is three ints")
    return range(*items)


def _deque(items: list) -> object:
    import collections

    return collections.deque(items)


def _set(items: list) -> set:
    """A set built one member at a time (see ``_dict``)."""
    out = set()
    add = out.add
    for item in items:
        add(item)
    return out


def _dict(pairs) -> dict:
    """A dict built one key at a time: members whose hashes collide make each insertion cost the
    members before it, and one C call building it whole could not be interrupted by the receiver's
    alarm (200,000 colliding ints take minutes); between insertions it can."""
    out = {}
    for key, value in pairs:
        out[key] = value
    return out


def _pairs(items: list) -> dict:
    for pair in items:
        if type(pair) is not tuple or len(pair) != 2:
            raise TypeError("an items view holds pairs")
    return _dict(items)


# tag -> (values per item, builder from the list of values)
_CONTAINERS = {
    b"l": (1, list), b"t": (1, tuple), b"S": (1, _set), b"Z": (1, lambda items: frozenset(_set(items))),
    b"d": (2, lambda items: _dict(zip(items[0::2], items[1::2]))),
    b"K": (1, lambda items: _dict(zip(items, [None] * len(items))).keys()), b"I": (1, lambda items: _pairs(items).items()),
    b"V": (1, lambda items: dict(enumerate(items)).values()), b"Q": (1, _deque), b"g": (1, _range),
    b"q": (1, _fraction), b"x": (1, _decimal),
}
_VIEWS = (type({}.keys()), type({}.items()), type({}.values()))


class WireError(ValueError):
    """Data that is not a well-formed value within the limits (or a value that cannot be written)."""


class ChannelClosed(EOFError):
    """The other end closed its pipe."""


class Ref:
    """A reference to an object kept by the other side: ``kind`` (one of ``REF_KINDS``) and ``handle``."""

    __slots__ = ("kind", "handle")

    def __init__(self, kind: bytes, handle: int):
        self.kind = kind
        self.handle = handle

    def __repr__(self) -> str:
        return f"Ref({self.kind!r}, {self.handle})"


# ----------------------------------------------------------------------------- encoding


def encode(value: object, as_ref: Callable[[object], Ref | None] | None = None, max_bytes: int = MAX_FRAME,
           max_depth: int = MAX_DEPTH) -> bytes:
    """``value`` as bytes. ``as_ref(obj)`` may turn an object of any other type into a ``Ref`` (else
    ``WireError``); subclasses of the plain types are written as the plain type."""
    out = []
    size = [0]

    def put(chunk: bytes) -> None:
        size[0] += len(chunk)
        if size[0] > max_bytes:
            raise WireError(f"the value is larger than {max_bytes} bytes")
        out.append(chunk)

    def walk(v: object, depth: int) -> None:
        if depth > max_depth:
            raise WireError(f"the value is nested deeper than {max_depth} levels")
        scalar = _scalar_frame(v)
        if scalar is not None:
            put(scalar)
        elif isinstance(v, dict):
            items = list(dict.items(v))
            put(b"d" + _U32.pack(len(items)))
            for key, item in items:
                walk(key, depth + 1)
                walk(item, depth + 1)
        elif isinstance(v, (list, tuple, set, frozenset)):
            tag = b"l" if isinstance(v, list) else b"t" if isinstance(v, tuple) else b"Z" if isinstance(v, frozenset) else b"S"
            items = list(v)
            put(tag + _U32.pack(len(items)))
            for item in items:
                walk(item, depth + 1)
        elif isinstance(v, Ref):
            put(b"R" + v.kind + _U32.pack(v.handle))
        elif _rebuilt(v) is not None:
            tag, items = _rebuilt(v)
            put(tag + _U32.pack(len(items)))
            for item in items:
                walk(item, depth + 1)
        else:
            ref = as_ref(v) if as_ref is not None else None
            if not isinstance(ref, Ref):
                raise WireError(f"a {type(v).__name__} cannot cross the sandbox boundary")
            put(b"R" + ref.kind + _U32.pack(ref.handle))

    walk(value, 0)
    return b"".join(out)


def _scalar_frame(v: object) -> bytes | None:
    """The frame of a None, bool, int, float, complex, str or bytes value (subclasses written as the
    plain type); None for every other value."""
    if v is None:
        return b"N"
    if v is True or v is False:
        return b"T" if v else b"F"
    if isinstance(v, int):
        v = int.__index__(v)
        raw = v.to_bytes((v.bit_length() + 8) // 8 or 1, "big", signed=True)
        if len(raw) > MAX_INT_BYTES:
            raise WireError(f"an int of {len(raw)} bytes is larger than {MAX_INT_BYTES}")
        return b"i" + _U32.pack(len(raw)) + raw
    if isinstance(v, float):
        return b"f" + _F64.pack(float.__float__(v))
    if isinstance(v, complex):
        return b"c" + _C128.pack(v.real, v.imag)
    if isinstance(v, str):
        raw = str.__str__(v).encode("utf-8", "surrogatepass")
        return b"s" + _U32.pack(len(raw)) + raw
    if isinstance(v, (bytes, bytearray)):
        raw = bytes(v)
        return b"b" + _U32.pack(len(raw)) + raw
    return None


def _rebuilt(v: object) -> tuple[bytes, list] | None:
    """(tag, items) for the builtin and standard-library types the other side rebuilds as they are:
    dict views, range, deque, Fraction, Decimal (None for anything else)."""
    if isinstance(v, _VIEWS):
        return (b"K", list(v)) if isinstance(v, _VIEWS[0]) else (b"I", list(v)) if isinstance(v, _VIEWS[1]) else (b"V", list(v))
    if isinstance(v, range):
        return b"g", [v.start, v.stop, v.step]
    modules = sys.modules
    if "collections" in modules and isinstance(v, modules["collections"].deque):
        return b"Q", list(v)
    if "fractions" in modules and isinstance(v, modules["fractions"].Fraction):
        return b"q", [v.numerator, v.denominator]
    if "decimal" in modules and isinstance(v, modules["decimal"].Decimal):
        return b"x", [str(v)]
    return None


# ----------------------------------------------------------------------------- decoding


class _Cursor:
    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview):
        self.data = data
        self.pos = 0

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.data):
            raise WireError("the value ends early")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def left(self) -> int:
        return len(self.data) - self.pos


def _scalar(tag: bytes, cur: _Cursor, make_ref: Callable[[bytes, int], object] | None) -> object:
    if tag == b"N":
        return None
    if tag == b"T":
        return True
    if tag == b"F":
        return False
    if tag == b"f":
        return _F64.unpack(cur.take(8))[0]
    if tag == b"c":
        real, imag = _C128.unpack(cur.take(16))
        return complex(real, imag)
    if tag in (b"i", b"s", b"b"):
        n = cur.u32()
        if tag == b"i" and not 0 < n <= MAX_INT_BYTES:
            raise WireError(f"an int of {n} bytes is out of range")
        raw = cur.take(n)
        if tag == b"i":
            return int.from_bytes(raw, "big", signed=True)
        if tag == b"b":
            return bytes(raw)
        try:
            return str(raw, "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise WireError("a str is not valid UTF-8") from None
    if tag == b"R":
        kind, handle = cur.take(1), cur.u32()
        if kind not in REF_KINDS or make_ref is None:
            raise WireError("a reference is not allowed here")
        return make_ref(kind, handle)
    raise WireError(f"unknown tag {tag!r}")


def _build(builder: Callable[[list], object], items: list) -> object:
    try:
        return builder(items)
    except (TypeError, ValueError, ArithmeticError) as error:  # an unhashable key, a zero denominator ...
        raise WireError(f"a malformed container: {error}") from None


def decode(data: bytes, make_ref: Callable[[bytes, int], object] | None = None, max_depth: int = MAX_DEPTH,
           max_items: int = MAX_ITEMS) -> object:
    """The value in ``data`` (see the module docstring); ``make_ref(kind, handle)`` builds the object
    a reference stands for (None: references are refused)."""
    cur = _Cursor(memoryview(bytes(data)))
    stack = []  # [container type, items, items still expected]
    count = 0
    result = None
    while True:
        count += 1
        if count > max_items:
            raise WireError(f"more than {max_items} values")
        tag = cur.take(1).tobytes()
        container = _CONTAINERS.get(tag)
        if container is not None:
            n = cur.u32() * container[0]
            if n > cur.left():
                raise WireError("a container declares more items than the data holds")
            if n:
                if len(stack) >= max_depth:
                    raise WireError(f"nested deeper than {max_depth} levels")
                stack.append([container[1], [], n])
                continue
            value = _build(container[1], [])
        else:
            value = _scalar(tag, cur, make_ref)
        while True:  # hand the finished value to its container, closing every container it completes
            if not stack:
                result = value
                break
            top = stack[-1]
            top[1].append(value)
            top[2] -= 1
            if top[2]:
                break
            stack.pop()
            value = _build(top[0], top[1])
        if not stack:
            break
    if cur.left():
        raise WireError("trailing bytes after the value")
    return result


# ----------------------------------------------------------------------------- frames on pipes


def write_frame(fd: int, payload: bytes, deadline: float | None = None) -> None:
    """Write one frame (blocking, or until ``deadline`` on ``time.monotonic()``: TimeoutError)."""
    data = memoryview(_U32.pack(len(payload)) + payload)
    while data:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise TimeoutError("the other end is not reading")
        try:
            data = data[os.write(fd, data[:65536]):]
        except BlockingIOError:
            continue
        except BrokenPipeError:
            raise ChannelClosed("the other end closed the pipe") from None


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks = []
    while n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("no answer in time")
        try:
            chunk = os.read(fd, min(n, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise ChannelClosed("the other end closed the pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None, max_frame: int = MAX_FRAME) -> bytes:
    """One frame's payload. A frame over ``max_frame`` bytes raises ``WireError`` (the stream is then
    out of step: the caller stops using it)."""
    n = _U32.unpack(_read_exact(fd, 4, deadline))[0]
    if n > max_frame:
        raise WireError(f"a message of {n} bytes is larger than {max_frame}")
    return _read_exact(fd, n, deadline)
