"""Every message between the grader, a judge and a box's worker, written once and checked at both ends.

Three conversations, each its own table of ops and the fields each op carries (name -> the types it may have):

- REQUESTS / ANSWERS: the grader asks a judge (judge.py, a process per job slot) to grade one submission, one JSON
  line each way.
- TO_BOX / FROM_BOX: the judge and the worker in the box (worker.py): framed JSON (wire.py). The worker forwards
  what an exercise's child says inside a "child" message.
- FROM_CHILD: what an exercise's child (or the race's) says, inside "child"; the student's code runs in that
  process, so the judge reads nothing from it that this table does not allow.

``make(table, op, **fields)`` builds a message the sender's side is held to; ``checked(table, message, ops)`` is
the receiver's: a message of another op than those expected there, a field missing, unknown or of another type is a
``MessageError`` naming it, never a KeyError deep in the code that reads it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ANY = object  # a field of any JSON value (an encoded value: wire.decode reads it)
NUMBER = (int, float)
MAYBE_INT = (int, type(None))

Table = Mapping[str, Mapping[str, Any]]

REQUESTS: Table = {  # the grader's request, one per submission
    "grade": {"job": dict, "limits": dict, "cpus": (int, type(None)), "argv": list, "env": (dict, type(None)),
              "cwd": (str, type(None)), "race": (dict, type(None))},
}
ANSWERS: Table = {  # the judge's answer to one request
    "graded": {"outcomes": dict, "ended": str, "race": (dict, type(None))},
}
TO_BOX: Table = {
    "start": {"exercise": dict},  # fork a child that loads the program, for this exercise
    "call": {"name": str, "args": str},  # call the student's function (pickled arguments, the judge's own)
    "returned": {"value": str},  # a checker's callback's value (pickled)
    "end": {},  # the remote check is done
    "race": {"plans": dict, "reference": dict, "seconds": NUMBER},  # the leaderboard's race, in a child of its own
    "quit": {},
}
FROM_BOX: Table = {
    "child": {"message": dict},  # what the running child said (FROM_CHILD)
    "ended": {"how": str, "status": MAYBE_INT, "seconds": NUMBER},  # how the child ended
}
FROM_CHILD: Table = {
    "loaded": {"errors": dict},  # the program ran; exercise -> the error its cell raised
    "result": {"value": ANY, "after": list},  # a call's value (wire.encode) and its arguments after it
    "raised": {"type": str, "message": str, "where": str, "stub": (list, type(None))},
    "callback": {"handle": int, "args": ANY},  # the student's code called a checker's callable
    "tried": {"what": list},  # after a remote check: what the audit hook saw
    "verdict": {"status": str, "message": str},  # a local check's
    "raced": {"peaks": dict},  # the race's figures per budget
    "unraced": {"why": str},
}


class MessageError(ValueError):
    """A message its table does not allow: an op not expected here, a field missing, unknown or of another type."""


def make(table: Table, op: str, **fields: Any) -> dict:
    """The message `op` with `fields`, held to `table` before it is sent (a bug of the sender's fails here)."""
    return checked(table, {"op": op, **fields}, [op])


def checked(table: Table, message: Any, ops: Iterable[str] | None = None) -> dict:
    """`message` when it is one of `table`'s ops (of `ops` when given) with exactly its fields, each of its types;
    else a MessageError naming what is wrong."""
    if not isinstance(message, dict):
        raise MessageError(f"a message is a JSON object, not {type(message).__name__}")
    op = message.get("op")
    wanted = set(table) if ops is None else set(ops)
    if op not in wanted or op not in table:
        raise MessageError(f"op {str(op)[:40]!r} where {', '.join(sorted(wanted))} was expected")
    fields = table[op]
    given = set(message) - {"op"}
    if given - set(fields) or set(fields) - given:
        extra, missing = sorted(given - set(fields)), sorted(set(fields) - given)
        raise MessageError(f"{op}: " + "; ".join(
            ([f"unknown field {', '.join(x[:40] for x in extra)}"] if extra else []) +
            ([f"missing field {', '.join(missing)}"] if missing else [])))
    for name, kind in fields.items():
        value = message[name]
        if kind is not ANY and (not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind))):
            raise MessageError(f"{op}: field {name} is a {type(value).__name__}, not {_names(kind)}")
    return message


def _kinds(kind: Any) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: Any) -> str:
    return " or ".join("null" if k is type(None) else k.__name__ for k in _kinds(kind))
