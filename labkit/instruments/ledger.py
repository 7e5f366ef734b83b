"""Saved-tensor ledger: what autograd keeps alive for backward, tensor by tensor.

Rule A (attribution): a ``TorchDispatchMode`` sits *below* autograd, so it
sees each aten op after autograd has decided what to save. Autograd packs an
op's *inputs* before the op runs and its *outputs* just after. A pack is
therefore either an output of the op the mode saw last, or an input of the op
it sees next; the entry stays pending until that next op arrives and decides it.

Rule B (no leaks): the pack hook returns ``t.detach()``, never ``t``. A saved
output (relu's, softmax's) refers to its own grad_fn; a node holding that very
tensor makes a reference cycle through C++ that Python's collector cannot see,
and the whole graph would outlive the measurement (the warning in
``torch.autograd.graph.saved_tensors_hooks``). A detached alias shares the
storage and version counter, so backward gets the same bytes.

Rule C (nesting): only the innermost pair of saved-tensor hooks is called. A
ledger inside another passes each pack to every enclosing ledger, so each
sees what its region saves (what a checkpoint inside a ledger drops, no
ledger sees, as none is kept).

Rule D (wrapper subclasses): a saved DTensor is counted by the plain tensors it holds, its local shard on this
rank, as the meter counts one (labkit.instruments.tensors): a wrapper's own storage is a stand-in of the global
size, not memory. A saved tensor whose bytes cannot be read (a wrapper subclass without ``__tensor_flatten__``)
is refused with a TypeError, never guessed.
"""
from __future__ import annotations

import contextlib
import html
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from labkit.instruments.tensors import (
    check_callable, check_not_meta, module_stack, op_name, plain_tensors, tensor_storages,
)

__all__ = ["SavedTensor", "LedgerTable", "Ledger", "saved_tensors"]

_ACTIVE: list[Ledger] = []  # entered ledgers, outermost first; Rule C
_DETACHING = [False]  # True while _pack detaches: the watchers ignore that op (it is ours, not the model's)


def _is_param_like(t: torch.Tensor) -> bool:
    """An nn.Parameter, or a view of one (w.t() saved by addmm). Inputs that require grad are not."""
    while t is not None:
        if isinstance(t, nn.Parameter):
            return True
        t = t._base
    return False


# ---------------------------------------------------------------- records and the table
@dataclass(frozen=True)
class SavedTensor:
    """One storage autograd saved: the op that saved it, the op that made it, where."""

    op: str  # the op whose backward node holds it, e.g. "addmm"
    producer: str  # the op that created its storage; "external" if made outside
    module: str  # innermost module fqn when model= was given, else ""
    shape: tuple[int, ...]  # a DTensor's: its local shard's (Rule D)
    dtype: torch.dtype
    bytes: int  # nbytes of the whole storage (a saved view keeps all of it alive)


@dataclass
class LedgerTable:
    """Saved bytes grouped by (module, op); prints as text or HTML."""

    rows: list[tuple[str, str, int, int]]  # (module, op, count, bytes)
    total: int

    def _cells(self) -> list[tuple[str, str, str, str]]:
        cells = [(m or "-", op, str(n), f"{b:,}") for m, op, n, b in self.rows]
        return cells + [("total", "", str(sum(r[2] for r in self.rows)), f"{self.total:,}")]

    def __str__(self) -> str:
        head = ("module", "op", "count", "bytes")
        cells = [head, *self._cells()]
        w = [max(len(c[i]) for c in cells) for i in range(4)]
        fmt = lambda c: f"{c[0]:<{w[0]}}  {c[1]:<{w[1]}}  {c[2]:>{w[2]}}  {c[3]:>{w[3]}}"  # noqa: E731
        lines = [fmt(c) for c in cells]
        lines.insert(1, "-" * len(lines[0]))
        lines.insert(len(lines) - 1, "-" * len(lines[0]))
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        td = lambda c, tag="td": "".join(  # noqa: E731
            f'<{tag} style="text-align:{a}">{html.escape(x)}</{tag}>'
            for x, a in zip(c, ("left", "left", "right", "right"))
        )
        body = [f"<tr>{td(c)}</tr>" for c in self._cells()]
        body[-1] = body[-1].replace("<tr>", '<tr style="font-weight:bold">', 1)
        return f"<table><tr>{td(('module', 'op', 'count', 'bytes'), 'th')}</tr>{''.join(body)}</table>"


# ---------------------------------------------------------------- the ledger
class _OpWatcher(TorchDispatchMode):
    """Remembers the last op, the producer of each storage, and settles pending packs."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        self.ledger = ledger

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if _DETACHING[0]:
            return func(*args, **kwargs)
        name = op_name(func)
        inputs = tensor_storages(args, kwargs)
        self.ledger._settle(name, inputs)
        out = func(*args, **kwargs)
        outs = tensor_storages(out)
        mutates = func._schema.is_mutable
        in_ids = {id(st) for st in inputs}
        for st in outs:
            # a view (expand, t) keeps its base's producer; an in-place op (bernoulli_, div_) rewrites it
            if mutates or id(st) not in in_ids:
                self.ledger._producer[st] = name
        self.ledger._last = (name, {id(st) for st in outs})
        return out


@dataclass
class _Pending:
    tensor_meta: tuple[tuple[int, ...], torch.dtype, int]
    storage: torch.UntypedStorage
    module: str
    prev_op: str  # last op seen when packed
    is_prev_output: bool
    prev_saves_outputs: bool  # prev op's backward node has _saved_result* slots


class Ledger:
    """Context manager recording every tensor autograd saves inside it (see module doc)."""

    def __init__(self, model: nn.Module | None = None, exclude: Any = ()) -> None:
        """model: attribute entries to its submodules, drop its buffers; exclude: tensors to leave out."""
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"Ledger: model must be an nn.Module or None, got {type(model).__name__}.")
        if model is not None:
            check_not_meta(model, "Ledger")
        self.model = model
        self.entries: list[SavedTensor] = []
        self.result: Any = None
        self._skip = WeakIdKeyDictionary()
        for st in tensor_storages(list(_flatten_tensors(exclude, "Ledger(exclude=...)"))):
            self._skip[st] = True
        self._seen = WeakIdKeyDictionary()
        self._producer = WeakIdKeyDictionary()
        self._pending: list[_Pending] = []
        self._last: tuple[str, set[int]] = ("external", set())
        self._modules: list[str] = []
        self._stack: contextlib.ExitStack | None = None
        self._used = False

    # -- context
    def __enter__(self) -> Ledger:
        if self._used:
            raise RuntimeError("Ledger: a ledger records one region; create a new Ledger() for another.")
        self._used = True
        if self.model is not None:  # a DTensor parameter or buffer: its local shard's storage (Rule D)
            for st in tensor_storages(list(self.model.buffers()), list(self.model.parameters())):
                self._skip[st] = True
        with contextlib.ExitStack() as stack:
            stack.enter_context(module_stack(self.model, self._modules))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(_pack, _unpack))
            stack.enter_context(_OpWatcher(self))
            _ACTIVE.append(self)
            stack.callback(_ACTIVE.remove, self)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._settle(None, [])
        finally:
            stack, self._stack = self._stack, None
            stack.close()  # type: ignore[union-attr]
            self._producer = WeakIdKeyDictionary()

    # -- Rule A
    def _note(self, t: torch.Tensor) -> None:
        """Queue one pack; its op is settled when the next op arrives (Rule A)."""
        if _is_param_like(t):
            return
        node = t.grad_fn
        saves_outputs = node is not None and any(a.startswith("_saved_result") for a in dir(node))
        prev, outs = self._last
        for part in plain_tensors(t):  # Rule D
            if part.layout != torch.strided:
                continue
            st = _storage(part)
            if st in self._skip:
                continue
            self._pending.append(
                _Pending((tuple(part.shape), part.dtype, st.nbytes()), st, self._modules[-1] if self._modules else "",
                         prev, id(st) in outs, saves_outputs)
            )

    def _settle(self, next_op: str | None, next_inputs: list[torch.UntypedStorage]) -> None:
        """Give each pending pack its op: the previous op (an output) or next_op (an input)."""
        ins = {id(st) for st in next_inputs}
        out_saves: set[int] = set()  # storages already settled as prev's output save
        for p in self._pending:
            key = id(p.storage)
            if not p.is_prev_output:
                op = next_op or p.prev_op
            elif key not in ins or next_op is None:
                op = p.prev_op
            else:
                # both an output of prev and an input of next: the first pack of it is prev's
                # own output save when prev's node keeps results (relu, _softmax, ...)
                first = key not in out_saves
                op = p.prev_op if (p.prev_saves_outputs and first) else next_op
            if op == p.prev_op and p.is_prev_output:
                out_saves.add(key)
            self._record(p, op)
        self._pending.clear()

    def _record(self, p: _Pending, op: str) -> None:
        if p.storage in self._seen:
            return
        self._seen[p.storage] = True
        shape, dtype, nbytes = p.tensor_meta
        producer = self._producer.get(p.storage, "external")
        self.entries.append(SavedTensor(op, producer, p.module, shape, dtype, nbytes))

    # -- results
    @property
    def total_bytes(self) -> int:
        """Bytes of all distinct saved storages."""
        return sum(e.bytes for e in self.entries)

    def by_op(self) -> dict[str, int]:
        """Saved bytes per saving op."""
        return _group(self.entries, lambda e: e.op)

    def by_module(self) -> dict[str, int]:
        """Saved bytes per innermost module fqn ("" = outside any submodule)."""
        return _group(self.entries, lambda e: e.module)

    def table(self) -> LedgerTable:
        """Rows grouped by (module, op) with count and bytes, in order of first appearance."""
        rows: dict[tuple[str, str], list[int]] = {}
        for e in self.entries:
            r = rows.setdefault((e.module, e.op), [0, 0])
            r[0] += 1
            r[1] += e.bytes
        return LedgerTable([(m, op, n, b) for (m, op), (n, b) in rows.items()], self.total_bytes)


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    """The storage of a strided tensor autograd saved, refused when it holds no bytes to read; Rule D."""
    st = t.untyped_storage()
    try:
        st.data_ptr()
    except RuntimeError as e:  # a wrapper's stand-in storage, which holds no bytes
        raise TypeError(f"Ledger: autograd saved a tensor of type {type(t).__name__}, a subclass whose bytes "
                        "cannot be read (a wrapper subclass without __tensor_flatten__); the ledger counts a "
                        "wrapper by the plain tensors it holds, so give the subclass __tensor_flatten__, or "
                        "measure outside it") from e
    return st


def _pack(t: torch.Tensor) -> torch.Tensor:
    """The ledgers' pack hook: every entered ledger notes t (Rule C); a detached alias is stored (Rule B).

    A module-level function, so that the graph, which keeps its hooks, keeps no ledger alive.
    """
    for ledger in _ACTIVE:
        ledger._note(t)
    _DETACHING[0] = True
    try:
        return t.detach()
    finally:
        _DETACHING[0] = False


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _group(entries: Iterable[SavedTensor], key: Callable[[SavedTensor], str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in entries:
        out[key(e)] = out.get(key(e), 0) + e.bytes
    return out


def _flatten_tensors(obj: Any, who: str) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _flatten_tensors(v, who)
    elif isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        for v in obj:
            yield from _flatten_tensors(v, who)
    elif obj is not None:
        raise TypeError(f"{who}: expected tensors or iterables of tensors, got {type(obj).__name__}.")


def saved_tensors(fn: Callable[..., Any], *args: Any, model: nn.Module | None = None,
                  exclude: Any = (), **kwargs: Any) -> Ledger:
    """Run fn(*args, **kwargs) inside a Ledger and return it (the output is in .result)."""
    check_callable(fn, "saved_tensors")
    with Ledger(model=model, exclude=exclude) as ledger:
        ledger.result = fn(*args, **kwargs)
    return ledger
