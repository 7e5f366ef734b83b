"""Op trace: every aten op a forward runs, with what a checkpoint policy and a roofline need to know of it.

``trace(fn, *args, model=...)`` runs ``fn(*args)`` once under a ``TorchDispatchMode`` and returns one
``OpRecord`` per op call, in order. The ops are the ones PyTorch's selective checkpointing asks its policy
about (every op except ``torch.utils.checkpoint.SAC_IGNORED_OPS``: detach and metadata queries), and each
record's ``key`` counts calls of one op the way that policy's cache does ("addmm#2" is the third addmm), so
a set of keys is a policy both labkit's and PyTorch's selective checkpoints can apply.

Per op: the innermost module; FLOPs by PyTorch's own formulas (``torch.utils.flop_counter``; 0 for ops it
does not count, such as softmax or GELU); the bytes of its distinct input and output storages (the fewest
bytes it must read and write); the bytes of the new storages it creates (what keeping its output costs;
0 for a view or an in-place op); whether a later op writes into its output (``mutated``: then keeping it
would keep a buffer that changes); and, with ``time=True``, the median seconds of replaying the op alone on
copies of its arguments (labkit.instruments.timing's rules), right after it runs: the copies of one op at a time
are all the trace adds to the forward's own memory.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import SAC_IGNORED_OPS
from torch.utils.flop_counter import flop_registry

from labkit.instruments.tensors import check_callable, cuda_devices, module_stack, op_name, tensor_storages
from labkit.instruments.timing import benchmark

__all__ = ["OpRecord", "trace", "op_key"]


@dataclass(frozen=True)
class OpRecord:
    """One op call of a traced forward."""

    key: str  # "addmm#2": the op and how many calls of it came before, in this forward
    op: str  # "addmm"
    module: str  # innermost module fqn ("" outside any, or when no model was given)
    flops: int  # FLOPs by torch.utils.flop_counter's formulas; 0 for ops it does not count
    bytes_moved: int  # bytes of the distinct storages it reads and writes: its inputs and its outputs
    output_bytes: int  # bytes of the new storages it creates: what keeping its output costs (0: view, in-place)
    elements: int  # elements of its tensor outputs
    is_view: bool  # its outputs alias an input (view, transpose, split, ...)
    in_place: bool  # it writes into an argument (add_, relu_, ...)
    random: bool  # it draws from a random generator (dropout, bernoulli, ...)
    seconds: float | None  # median seconds of replaying it alone; None when not timed
    is_output: bool = False  # it made (a storage of) the traced function's output, which its caller keeps anyway
    mutated: bool = False  # a later op of the trace writes into its output (nn.Dropout's mask: empty_like, then
    # bernoulli_ into it): keeping that output would keep a buffer that changes after it is kept

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (0 when it moves no bytes)."""
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0


def op_key(name: str, count: int) -> str:
    """The key of the `count`-th (from 0) call of op `name` in a forward: "addmm#2"."""
    return f"{name}#{count}"


def is_random(func: Any) -> bool:
    """True for ops that draw from a generator (tagged nondeterministic_seeded by PyTorch)."""
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


def _nbytes(storages: list[torch.UntypedStorage]) -> int:
    return sum(st.nbytes() for st in storages)


def _clone(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class _Tracer(TorchDispatchMode):
    def __init__(self, modules: list[str], time: Callable[[Callable[[], Any]], float] | None,
                 devices: list[int]) -> None:
        super().__init__()
        self.modules = modules
        self.time = time  # times a replay of one op; None: no timing
        self.devices = devices  # CUDA devices whose generators a random op's replays must leave as they were
        self.calls: list[dict[str, Any]] = []  # each call's record fields
        self.counts: dict[str, int] = {}
        self.made: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}  # a fresh storage -> its call

    def _written(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Mark mutated the earlier calls whose fresh storages this in-place op writes into (an argument its
        schema says it writes: `self` of add_, `out` of an out= overload)."""
        schema = func._schema
        named = {**{a.name: v for a, v in zip(schema.arguments, args)}, **kwargs}
        for a in schema.arguments:
            if a.alias_info is not None and a.alias_info.is_write:
                for st in tensor_storages(named.get(a.name)):
                    ref, call = self.made.get(st._cdata, (None, -1))
                    alive = ref() if ref is not None else None  # alive: that storage, not a later one at its address
                    if alive is not None and alive._cdata == st._cdata:
                        self.calls[call]["mutated"] = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        # copies of the arguments, replayed right after the op and dropped: one op's copies live at a time
        copies = (tree_map(_clone, args), tree_map(_clone, kwargs)) if self.time is not None else None
        inputs = tensor_storages(args, kwargs)
        out = func(*args, **kwargs)
        outs = tensor_storages(out)
        in_ids = {id(st) for st in inputs}
        fresh = [st for st in outs if id(st) not in in_ids]
        name = op_name(func)
        schema = getattr(func, "_schema", None)
        aliases = schema is not None and any(r.alias_info is not None for r in schema.returns)
        in_place = schema is not None and schema.is_mutable
        if in_place:
            self._written(func, args, kwargs)
        counter = flop_registry.get(getattr(func, "overloadpacket", None))
        flops = int(counter(*args, **kwargs, out_val=out)) if counter is not None else 0
        elements = sum(t.numel() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        count = self.counts.get(name, 0)
        self.counts[name] = count + 1
        fields = dict(key=op_key(name, count), op=name, module=self.modules[-1] if self.modules else "",
                      flops=flops, bytes_moved=_nbytes(inputs) + _nbytes(fresh), output_bytes=_nbytes(fresh),
                      elements=elements, is_view=aliases and not in_place, in_place=in_place, random=is_random(func),
                      mutated=False, _fresh=[weakref.ref(st) for st in fresh])  # weak: the trace keeps no more
        self.made.update({st._cdata: (ref, len(self.calls)) for st, ref in zip(fresh, fields["_fresh"])})
        if copies is not None:
            a, kw = copies
            # a random op's replays draw numbers: they leave the generators as the forward left them
            with torch.random.fork_rng(devices=self.devices) if fields["random"] else contextlib.nullcontext():
                fields["seconds"] = self.time(lambda: func(*a, **kw))
            del a, kw, copies
        self.calls.append(fields)
        return out


def _mark_outputs(calls: list[dict[str, Any]], result: Any) -> None:
    """Set is_output on the calls whose fresh storages hold the traced function's result (alive, so a
    weak reference that still resolves is that storage, never a later one at the same address)."""
    wanted = {st._cdata for st in tensor_storages(result)}
    for fields in calls:
        alive = (ref() for ref in fields.pop("_fresh"))
        fields["is_output"] = any(st is not None and st._cdata in wanted for st in alive)


def trace(fn: Callable[..., Any], *args: Any, model: nn.Module | None = None, time: bool = True,
          repeats: int = 5, **kwargs: Any) -> list[OpRecord]:
    """Run fn(*args, **kwargs) once and return its op calls in order (see the module doc).

    model: attribute each op to its innermost submodule (fqn relative to `model`). time: replay each op
    `repeats` times on copies of its arguments and record the median seconds (a view's replay times the
    view, which costs no bytes). The RNG is restored afterwards, so tracing does not change what runs next.
    """
    check_callable(fn, "trace")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"trace: repeats={repeats!r} must be an int >= 1")
    modules: list[str] = []
    devices = cuda_devices(args, kwargs)
    device = torch.device("cuda", devices[0]) if devices else torch.device("cpu")
    clock = (lambda replay: benchmark(replay, repeats=repeats, warmup=1, device=device).median) if time else None
    tracer = _Tracer(modules, clock, devices)
    with torch.random.fork_rng(devices=devices), module_stack(model, modules):
        with tracer:
            result = fn(*args, **kwargs)
        _mark_outputs(tracer.calls, result)
    return [OpRecord(**{"seconds": None, **fields}) for fields in tracer.calls]
