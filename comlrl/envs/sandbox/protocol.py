"""The typed protocol between the checker and the sandboxed candidate (standard library only).

Both ends import this file next to ``wire.py`` (the checker and the harness run it as the top-level
module ``protocol``; the trainer imports it as ``comlrl.envs.sandbox.protocol``). It says which
requests exist, which replies answer each of them and how long an error's name and message may be.
The checker asks; the candidate answers; the checker alone decides what an answer means, and a
reply that is not one of the answers its request allows is a protocol violation, never control
flow (``checker.py`` turns it into a failed assert and stops talking to the candidate).

Messages (``wire`` values; ``rid`` numbers the checker's requests, 0 is the load):

    request  (op, rid, handle, args, kwargs, budget_s)       op in REQUESTS; args of getattr / delattr:
                                                            (name,), of setattr: (name, value)
    reply    (kind, rid, op, *fields)                       kind in REQUESTS[op]; fields per REPLY_FIELDS
    load     ("value", 0, "load", {entry point: value})    | ("raised", 0, "load", name, message)
    end      ("exit", rid)                                  the checker is done

Replies, and what each carries:

    value       value, mutated positional arguments [(index, value)], mutated keyword arguments {name: value}
    end         nothing (the iterator is exhausted: only an answer to ``next``)
    raised      the exception's type name (an identifier of at most NAME_CAP characters, else
                "Exception") and its message (a str of at most MESSAGE_CAP characters)
    timeout     nothing (the request's budget ran out in the candidate)
    unsendable  why the value could not be written (a str of at most MESSAGE_CAP characters)

What a ``value`` must be depends on the request: a ``call``, a ``next`` or a ``getattr`` (an
attribute of a candidate object, by name) may return anything the wire carries; ``iter`` an
iterator reference; ``len`` an int >= 0; ``bool`` a bool; ``setattr`` and ``delattr`` (an attribute
set to a value the test gives, or deleted) None (``checker.py``, ``Link.VALUE_CHECKS``). A request
kind is one entry here, one handler in the harness (``Server.OPS``), one value check and one proxy
method in the checker.
"""

from __future__ import annotations

MESSAGE_CAP = 300
"""Characters of an exception message (or an unsendable reason) a reply may carry."""
NAME_CAP = 80
"""Characters of an exception type name a reply may carry."""
LOAD = "load"
"""The pseudo-request the candidate's first reply answers (rid 0): loading its code."""

REQUESTS = {
    "call": ("value", "raised", "timeout", "unsendable"),
    "next": ("value", "end", "raised", "timeout", "unsendable"),
    "iter": ("value", "raised", "timeout", "unsendable"),
    "len": ("value", "raised", "timeout"),
    "bool": ("value", "raised", "timeout"),
    "getattr": ("value", "raised", "timeout", "unsendable"),
    "setattr": ("value", "raised", "timeout"),
    "delattr": ("value", "raised", "timeout"),
    LOAD: ("value", "raised"),
}
"""op -> the reply kinds that answer it."""

REPLY_FIELDS = {"value": 3, "end": 0, "raised": 2, "timeout": 0, "unsendable": 1}
"""reply kind -> how many fields follow (kind, rid, op)."""


def exception_name(exc: BaseException) -> str:
    """The name a reply gives ``exc``'s type: its ``__name__`` when that is a short identifier,
    else ``"Exception"`` (a candidate may name its classes anything)."""
    name = getattr(type(exc), "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() and len(name) <= NAME_CAP else "Exception"


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, at most MESSAGE_CAP characters (a ``__str__`` that fails or returns no str:
    a fixed text)."""
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return "<the exception's message could not be read>"
    return str.__str__(text)[:MESSAGE_CAP] if isinstance(text, str) else "<the exception's message is not text>"
