"""What crosses between the grader and a submission's box: framed messages, and values the grader can read safely.

Messages are length-prefixed JSON (``send``/``receive``), at most ``MESSAGE_BYTES`` each. The grader sends the box
trusted values with pickle (the box may unpickle what the grader made); the box answers with ``encode``d values
only, which ``decode`` rebuilds from JSON into plain data, tensors and an allowlist of the kit's dataclasses, never
running code of the box's choosing. Anything else the box returns arrives as an ``Opaque`` stand-in that names
its type, so a checker fails it the way it fails any wrong value.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import select
import struct
import time
from collections import Counter
from typing import Any

import numpy as np
import torch

from labkit.instruments.harness import Difference
from labkit.instruments.ops import OpRecord
from labkit.instruments.roofline import Ceilings
from labkit.models.gpt import GPTConfig
from labkit.models.mlp import MLPConfig
from labkit.plans.plan import BlockCosts, Option, Profile, Step
from labkit.plans.situation import SchemeCost, Situation

__all__ = ["MESSAGE_BYTES", "WireError", "Opaque", "Record", "send", "receive", "encode", "decode"]

MESSAGE_BYTES = 64 * 2**20  # one message at most: a submission cannot make the grader hold more
_HEADER = struct.Struct("!Q")
DEPTH = 40  # nesting the decoder follows at most
# the kit's dataclasses a submission may return, by "module:qualname" (rebuilt field by field)
ALLOWED: dict[str, type] = {f"{c.__module__}:{c.__qualname__}": c for c in (
    Difference, OpRecord, Ceilings, Step, Option, BlockCosts, Profile, SchemeCost, Situation, GPTConfig, MLPConfig)}


class WireError(ValueError):
    """A message or value that breaks the protocol: the submission's box is not to be trusted further."""


@dataclasses.dataclass(frozen=True)
class Opaque:
    """A value the box returned that the grader does not rebuild: its type's name and a short repr."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return f"<{self.type_name} {self.text}>"


class Record:
    """Another dataclass the box returned (the lab's own, a student's): its type's name and its fields, read-only."""

    def __init__(self, type_name: str, fields: dict[str, Any]) -> None:
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"{self._type} has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self._type} is read-only here")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and (self._type, self._fields) == (other._type, other._fields)

    def __hash__(self) -> int:  # the fields' values where they hash (records that differ then hash apart)
        return hash((self._type, *sorted((k, _hash_or_name(v)) for k, v in self._fields.items())))

    def __repr__(self) -> str:
        return f"{self._type}({', '.join(f'{k}={v!r}' for k, v in self._fields.items())})"


def _hash_or_name(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return "tensor"
    try:
        return hash(value)
    except TypeError:
        return type(value).__name__


def send(fd: int, message: dict) -> None:
    """Write one framed message."""
    data = json.dumps(message, allow_nan=False).encode()
    if len(data) > MESSAGE_BYTES:
        raise WireError(f"a message of {len(data):,} B is over the limit of {MESSAGE_BYTES:,} B")
    _write(fd, _HEADER.pack(len(data)) + data)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError("the other side did not finish its message in time")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, deadline: float | None = None) -> dict:
    """Read one framed message (EOFError when the pipe closed; WireError when it breaks the protocol; TimeoutError
    past `deadline`, a time.monotonic())."""
    (size,) = _HEADER.unpack(_read(fd, _HEADER.size, deadline))
    if size > MESSAGE_BYTES:
        raise WireError(f"a message of {size:,} B is over the limit of {MESSAGE_BYTES:,} B")
    try:
        message = json.loads(_read(fd, size, deadline))
    except ValueError as e:
        raise WireError(f"not a JSON message ({e})") from None
    if not isinstance(message, dict):
        raise WireError(f"a message must be a JSON object, got {type(message).__name__}")
    return message


# ---------------------------------------------------------------- values
def _float(x: float) -> Any:
    return x if math.isfinite(x) else {"float": repr(x)}


def encode(value: Any, depth: int = 0) -> Any:
    """A JSON-able form of `value` (run in the box: whatever it cannot encode becomes an Opaque stand-in)."""
    if depth > DEPTH:
        return {"opaque": ["deep", "nested too deeply"]}
    if value is None or isinstance(value, (bool, str)) or (isinstance(value, int) and type(value) in (int, bool)):
        return value if not isinstance(value, int) or abs(value) < 2**62 else {"int": str(value)}
    if type(value) is float:
        return _float(value)
    if type(value) in (list, tuple, set, frozenset):
        return {type(value).__name__: [encode(v, depth + 1) for v in value]}
    if type(value) is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if type(value) is np.ndarray and value.dtype != object:  # a numpy array comes back as a tensor
        return encode(torch.from_numpy(np.ascontiguousarray(value)), depth)
    if type(value) is torch.Tensor and not value.is_meta:  # a meta tensor has no data: an Opaque naming it
        t = value.detach().to("cpu").contiguous()
        flat = t.reshape(-1)
        raw = (flat.to(torch.uint8) if t.dtype == torch.bool else flat.view(torch.uint8)).numpy().tobytes()
        return {"tensor": [str(t.dtype).removeprefix("torch."), list(t.shape), base64.b64encode(raw).decode()]}
    kind = f"{type(value).__module__}:{type(value).__qualname__}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
        return {"object": [kind, fields]} if kind in ALLOWED else {"record": [type(value).__name__[:60], fields]}
    try:
        text = repr(value)[:80]
    except Exception:  # noqa: BLE001  (a repr that raises is the submission's; say so)
        text = "(its repr raised)"
    return {"opaque": [type(value).__name__[:60], text]}


PLAIN_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
                "bfloat16", "float32", "float64", "complex64", "complex128")  # the dtypes a tensor may come back in


def _dtype(name: Any) -> torch.dtype:
    if name not in PLAIN_DTYPES:
        raise WireError(f"{name!r:.40} is not a torch dtype a tensor comes back in ({', '.join(PLAIN_DTYPES)})")
    return getattr(torch, name)


def decode(data: Any, depth: int = 0) -> Any:
    """The value `encode` describes (run by the grader: only data, tensors and ALLOWED dataclasses come back)."""
    if depth > DEPTH:
        raise WireError("a value nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if not isinstance(data, dict) or len(data) != 1:
        raise WireError(f"not an encoded value: {str(data)[:60]}")
    (kind, body), = data.items()
    if kind == "int" and isinstance(body, str) and re.fullmatch(r"-?[0-9]{1,4300}", body):
        return int(body)
    if kind == "float" and body in ("inf", "-inf", "nan"):
        return float(body)
    if kind in ("list", "tuple", "set", "frozenset") and isinstance(body, list):
        items = [decode(v, depth + 1) for v in body]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](_hashable(items, kind))
    if kind == "dict" and isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body):
        pairs = [(decode(k, depth + 1), decode(v, depth + 1)) for k, v in body]
        _hashable([k for k, _ in pairs], "set")
        return dict(pairs)
    if kind == "dtype":
        return _dtype(body)
    if kind == "tensor" and isinstance(body, list) and len(body) == 3:
        return _tensor(*body)
    if kind == "object" and isinstance(body, list) and len(body) == 2 and body[0] in ALLOWED:
        return _object(body[0], body[1], depth)
    if kind == "record" and isinstance(body, list) and len(body) == 2 and isinstance(body[0], str) \
            and isinstance(body[1], dict) and all(isinstance(k, str) for k in body[1]):
        return Record(body[0][:60], {k[:60]: decode(v, depth + 1) for k, v in body[1].items()})
    if kind == "opaque" and isinstance(body, list) and len(body) == 2 and all(isinstance(s, str) for s in body):
        return Opaque(body[0][:60], body[1][:80])
    raise WireError(f"not an encoded value: {str(data)[:60]}")


COLLIDING = 64  # the most items of one set or dict's keys that may share a hash value


def _hashable(items: list, kind: str) -> list:
    """`items`, checked to be hashable where they make a set, and not crafted to share hash values (ints that
    differ by multiples of 2**61 - 1 do): Python's set and dict take time quadratic in such items."""
    if kind in ("set", "frozenset"):
        counts = Counter(_key(item) for item in items)
        if counts and max(counts.values()) > COLLIDING:
            raise WireError(f"a {kind} of {len(items):,} items, more than {COLLIDING} of one hash value")
    return items


def _key(value: Any) -> int:
    try:
        return hash(value)
    except TypeError:
        raise WireError(f"an unhashable {type(value).__name__} as a key or set member") from None


def _tensor(dtype_name: Any, shape: Any, raw: Any) -> torch.Tensor:
    dtype = _dtype(dtype_name)
    if not isinstance(shape, list) or not all(isinstance(n, int) and 0 <= n < 2**40 for n in shape):
        raise WireError(f"not a tensor's shape: {shape!r:.60}")
    data = base64.b64decode(raw) if isinstance(raw, str) else None
    numel = math.prod(shape)
    size = numel * (1 if dtype == torch.bool else torch.empty((), dtype=dtype).element_size())
    if data is None or len(data) != size:
        raise WireError(f"a {dtype} tensor of shape {shape} needs {size} bytes")
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    out = flat.to(torch.bool) if dtype == torch.bool else flat.view(dtype) if numel else torch.empty(0, dtype=dtype)
    return out.reshape(shape)


def _object(kind: str, fields: Any, depth: int) -> Any:
    cls = ALLOWED[kind]
    name = cls.__name__
    if not isinstance(fields, dict) or set(fields) != {f.name for f in dataclasses.fields(cls)}:
        raise WireError(f"a {name} with the wrong fields")
    values = {k: decode(v, depth + 1) for k, v in fields.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:  # the dataclass's own checks refuse it: a wrong value, as any other
        return Opaque(name, f"whose fields {name} refuses ({str(e)[:50]})")
