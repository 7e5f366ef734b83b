"""A student's function called in the box from outside it: the channel to the worker, the stand-in a checker calls,
and what comes back, rebuilt as data.

The judge (judge.py) runs a ``remote`` checker in its own process; each call of a student's function is a
``StudentFunction``, which sends the arguments into the box (pickled: the judge's own values) and reads back an encoded
value (wire.py), rebuilt here as plain data; an exception comes back as data too, a builtin one rebuilt as itself.
Every message goes through a ``Channel``, held to messages.py's tables both ways, with a deadline; a box that ends,
stalls or breaks the protocol is ``BoxGone``.
"""
from __future__ import annotations

import base64
import builtins
import pickle
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labkit.course.grade import messages, wire
from labkit.course.grade.watch import Watch
from labkit.stubs import stub_message

__all__ = ["BoxGone", "Channel", "StudentFunction"]


class BoxGone(BaseException):
    """The box died, stalled or broke the protocol while a check waited on it (a BaseException: the checkers'
    `except Exception` must not turn it into a student's error)."""


class Channel:
    """The pipes to the worker: one exercise's messages, each with a deadline."""

    def __init__(self, to_box: int, from_box: int, watch: Watch) -> None:
        self.to_box, self.from_box, self.watch = to_box, from_box, watch
        self.deadline = time.monotonic()
        self.ended: dict = {}  # the worker's report of how the last child ended

    def send(self, message: dict) -> None:
        """Send `message`, one of messages.TO_BOX (held to it here: a bug of this side's fails before it leaves)."""
        try:
            wire.send(self.to_box, messages.checked(messages.TO_BOX, message))
        except OSError as e:
            raise BoxGone(self.watch.why or f"the box closed its pipe ({e.strerror})") from None

    def receive(self) -> dict:
        """The worker's next message, one of messages.FROM_BOX; BoxGone when there is none in time or it breaks
        the protocol."""
        try:
            return messages.checked(messages.FROM_BOX, wire.receive(self.from_box, self.deadline))
        except (EOFError, OSError):
            raise BoxGone(self.watch.why or "the box ended") from None
        except TimeoutError:
            raise BoxGone("timeout") from None
        except wire.WireError as e:  # a MessageError too: not one of FROM_BOX
            raise BoxGone(f"the box broke the protocol ({e})") from None
        except messages.MessageError as e:
            raise BoxGone(f"the box broke the protocol ({e})") from None

    def from_child(self, ops: Iterable[str] | None) -> dict:
        """The next message of the exercise's child, one of `ops` of messages.FROM_CHILD (None: whatever it is,
        unread: a child that says anything more once its check is done has tampered); BoxGone("ended: ...") when the
        child ended instead, BoxGone naming the break when it says something else."""
        message = self.receive()
        if message["op"] == "ended":
            self.ended = message
            raise BoxGone(f"ended: {message['how']}")
        if ops is None:
            return message["message"]
        try:
            return messages.checked(messages.FROM_CHILD, message["message"], ops)
        except messages.MessageError as e:
            raise BoxGone(f"the box broke the protocol ({e})") from None


def _student_error(message: dict) -> Exception:
    """The exception the student's code raised in the box, rebuilt here as data (never unpickled)."""
    stub = message.get("stub")
    if isinstance(stub, list) and len(stub) == 2 and all(isinstance(s, str) for s in stub):
        return NotImplementedError(stub_message(*stub))
    name = str(message.get("type", "Exception"))[:60] or "Exception"
    builtin = getattr(builtins, name, None)  # a checker may expect one (a ValueError naming the bad budget)
    plain = type(name if name.isidentifier() else "Exception", (Exception,), {})  # the student's own, by name
    kind = builtin if isinstance(builtin, type) and issubclass(builtin, Exception) else plain
    try:
        error = kind(str(message.get("message", ""))[:2000])
    except Exception:  # noqa: BLE001  (a builtin that wants other arguments: the student's error as a plain one)
        error = plain(str(message.get("message", ""))[:2000])
    error.labkit_where = str(message.get("where", ""))[:200]
    return error


class StudentFunction:
    """One of the student's functions, called in the box: arguments pickled in, the value encoded back."""

    def __init__(self, name: str, channel: Channel) -> None:
        self.name, self.channel, self.calls = name, channel, 0
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        handles: dict[int, Callable[..., Any]] = {}

        def hold(v: Any) -> Any:  # a checker's callable stays here: the box calls back for it
            if callable(v) and not isinstance(v, (torch.nn.Module, type)):
                handles[len(handles)] = v
                return {"callback": len(handles) - 1}
            return v

        payload = ([hold(a) for a in args], {k: hold(v) for k, v in kwargs.items()})
        self.channel.send({"op": "call", "name": self.name, "args": base64.b64encode(pickle.dumps(payload)).decode()})
        while True:
            message = self.channel.from_child(("callback", "result", "raised"))
            op = message["op"]
            if op == "callback" and message["handle"] in handles:
                a, k = wire.decode(message["args"])
                value = handles[message["handle"]](*a, **k)
                self.channel.send({"op": "returned", "value": base64.b64encode(pickle.dumps(value)).decode()})
            elif op == "result":
                changed = _changed(args, message["after"])
                if changed is not None:
                    raise ValueError(f"{self.name} changed its argument {changed + 1} in place; a function checked "
                                     "here must leave its inputs as they were")
                return wire.decode(message["value"])
            elif op == "raised":
                raise _student_error(message)
            else:
                raise BoxGone("the box broke the protocol (a callback of no handle the checker gave)")


def _changed(args: tuple, after: Any) -> int | None:
    """The index of the first argument the box says the student's function changed (its encoding after the call
    differs from the checker's own argument's), or None. The checker's objects are never changed: a checker that
    reads its arguments after the call reads what it passed, whatever the box says."""
    if not isinstance(after, list) or len(after) != len(args):
        return None
    for i, (arg, encoded) in enumerate(zip(args, after)):
        if encoded is not None and isinstance(arg, (torch.Tensor, list)) and \
                _plain(encoded) != _plain(wire.encode(arg)):
            return i
    return None


def _plain(encoded: Any) -> Any:
    """An encoding with each stand-in's text dropped (a repr may hold an address, other in the box)."""
    if isinstance(encoded, dict):
        if set(encoded) == {"opaque"} and isinstance(encoded["opaque"], list):
            return {"opaque": encoded["opaque"][:1]}
        return {k: _plain(v) for k, v in encoded.items()}
    if isinstance(encoded, list):
        return [_plain(v) for v in encoded]
    return encoded
