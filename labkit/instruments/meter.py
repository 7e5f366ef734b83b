"""Live-memory meter: bytes of live tensor storages over time, tagged by phase.

The same idea as PyTorch's MemTracker (torch/distributed/_tools/mem_tracker.py),
which the tests hold it against: a ``TorchDispatchMode`` registers each new
output storage with ``weakref.ref(storage, on_free)``; the callback fires when
the storage is freed. Bytes are exact ``nbytes`` (MemTracker rounds CUDA blocks
up to 512 B); on CUDA the allocator's own peak is recorded beside it.

Phases (tagged automatically; ``meter.phase(name)`` overrides):
  forward    outside the autograd engine
  backward   inside the engine (``_current_graph_task_id() != -1``), grad mode off
  recompute  inside the engine with grad mode on: how both torch.utils.checkpoint
             variants and a hand-written recompute rerun the forward
  optimizer  inside ``optimizer.step`` (global step pre/post hooks)

Compiled code: torch.compile runs its compiled graphs only where no dispatch mode is active (under one it runs
the function eagerly), so a compiled region is called with the modes of its thread set aside and its graphs run
inside them again (labkit.instruments.compiled: ``outside_meters``, ``metered_backend``): the graphs' ops are seen
as any others, and every storage is counted until it is freed, wherever that happens.
"""
from __future__ import annotations

import contextlib
import pickle
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.instruments.tensors import check_callable, check_not_meta, op_name, tensor_storages

__all__ = ["Event", "Lifetime", "MemoryMeter", "measure_peak", "active_meter", "entered_meters"]

_ENTERED: list[MemoryMeter] = []  # meters inside their region, innermost last


def active_meter() -> MemoryMeter | None:
    """The innermost meter whose region is running, or None."""
    return _ENTERED[-1] if _ENTERED else None


def entered_meters() -> list[MemoryMeter]:
    """Every meter whose region is running, outermost first."""
    return list(_ENTERED)


@dataclass(frozen=True, slots=True)
class Event:
    """One allocation or free: live bytes just after it."""

    index: int
    live_bytes: int
    phase: str  # forward | backward | recompute | optimizer | a user name
    op: str  # the allocating op, or "free"
    delta: int  # +bytes allocated / -bytes freed


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One storage's life in a meter's region (MemoryMeter(lifetimes=True)): counted from event `start` (-1: alive
    before the region) until event `end` (None: still alive after it), its bytes, the op that made it ("track":
    tracked at entry), the phase then, and the innermost module whose forward was running (None: none, as in
    backward outside a recomputation, or the optimizer's step). At every event i, the bytes of the lifetimes
    with start <= i < end are the meter's live bytes after it."""

    start: int
    end: int | None
    nbytes: int
    op: str
    phase: str
    module: str | None


# Higher-order operators whose body is one op passed to them (torch/_prims/rng_prims.py: a compiled graph of a
# checkpoint with a random op calls them): their outputs are that op's, so counting them is exact. Any other one
# runs a subgraph whose intermediates this mode would not see: refused, naming it.
_ONE_OP_HOPS = ("run_and_save_rng_state", "run_with_rng_state")


class _Watcher(TorchDispatchMode):
    supports_higher_order_operators = True

    def __init__(self, meter: MemoryMeter) -> None:
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if isinstance(func, torch._ops.HigherOrderOperator) and func.name() not in _ONE_OP_HOPS:
            raise NotImplementedError(
                f"MemoryMeter: higher-order operator {func.name()} runs a subgraph whose tensors the meter cannot "
                f"see; it counts only {', '.join(_ONE_OP_HOPS)} (one op each)")
        out = func(*args, **(kwargs or {}))
        for st in tensor_storages(out):
            self.meter._register(st, op_name(func))
        return out


class MemoryMeter:
    """Context manager measuring live tensor bytes (see module doc for the phases)."""

    def __init__(self, *track: Any, history: bool = False, device: torch.device | str | None = None,
                 lifetimes: bool = False) -> None:
        """track: modules, optimizers, tensors (or lists of them) alive before entry, counted from the start.
        device: count only storages on it ("cuda" is the current GPU), as a budget of one device's memory does
        (a step that offloads to the host); None: every device. lifetimes: record each storage's life
        (``lifetimes``), named by the tracked modules' names."""
        self._track = _flatten_track(track)
        self.history = history
        self.device = None if device is None else torch.device(device)
        self.timeline: list[Event] = []
        self.baseline = 0  # bytes of the tracked objects at entry
        self.live = 0
        self.peak = 0
        self.peak_phase = ""
        self.phase_peaks: dict[str, int] = {}
        self.allocator_peak: int | None = None  # CUDA only: max_memory_allocated() - allocated at entry
        self.cuda_snapshot: Any = None  # CUDA and history=True: torch.cuda.memory._snapshot()
        self.result: Any = None
        self._blocks: dict[int, list] = {}  # StorageImpl address -> [weakref, nbytes]
        self._overrides: list[str] = []
        self._in_optimizer = 0
        self._recording = False
        self._used = False
        self._cuda_base = 0
        self._record_lives = lifetimes
        self._lives: dict[int, list] = {}  # StorageImpl address -> [start, end, nbytes, op, phase, module]
        self._done: list[list] = []  # lives ended
        self._names: dict[int, str] = {}  # id(module) -> its name in a tracked module
        self._running: list[str] = []  # the modules whose forward is running, innermost last
        self._track_modules: list[nn.Module] = []  # until entry: the tracked modules, for their names
        self._stack: contextlib.ExitStack | None = None
        self._lock = threading.RLock()

    # -- bookkeeping
    def _current_phase(self) -> str:
        if self._overrides:
            return self._overrides[-1]
        if self._in_optimizer:
            return "optimizer"
        if torch._C._current_graph_task_id() != -1:
            return "recompute" if torch.is_grad_enabled() else "backward"
        return "forward"

    def _register(self, st: torch.UntypedStorage, op: str) -> None:
        key = st._cdata
        if key in self._blocks or st.device.type == "meta" or not self._counts(st.device):
            return
        ref = weakref.ref(st, lambda _ref, key=key: self._on_free(key))
        self._blocks[key] = [ref, st.nbytes()]
        self._change(st.nbytes(), op)
        self._begin(key, st.nbytes(), op)

    def _begin(self, key: int, nbytes: int, op: str) -> None:
        if self._record_lives and nbytes:
            start = len(self.timeline) - 1 if self._recording else -1
            module = self._running[-1] if self._running else None
            self._lives[key] = [start, None, nbytes, op, self._current_phase() if self._recording else "track", module]

    def _end(self, key: int) -> None:
        life = self._lives.pop(key, None)
        if life is not None:
            life[1] = len(self.timeline) - 1
            self._done.append(life)

    @property
    def lifetimes(self) -> list[Lifetime]:
        """Every storage's life in the region, in the order they began (MemoryMeter(lifetimes=True))."""
        if not self._record_lives:
            raise ValueError("MemoryMeter: lifetimes are recorded only by MemoryMeter(..., lifetimes=True)")
        lives = sorted([*self._done, *self._lives.values()], key=lambda v: v[0])
        return [Lifetime(*v) for v in lives]

    def _counts(self, device: torch.device) -> bool:
        if self.device is None:
            return True
        if device.type != self.device.type:
            return False
        index = self.device.index
        if index is None and device.type == "cuda":
            index = torch.cuda.current_device()
        return index is None or device.index == index

    def _on_free(self, key: int) -> None:
        block = self._blocks.pop(key, None)
        if block is not None and self._recording:
            self._change(-block[1], "free")
            self._end(key)

    def _change(self, delta: int, op: str) -> None:
        if not self._recording or delta == 0:
            return
        with self._lock:  # a collective's worker thread (gloo's) can free a storage while the main thread runs
            self.live += delta
            phase = self._current_phase()
            self.timeline.append(Event(len(self.timeline), self.live, phase, op, delta))
            if self.live > self.phase_peaks.get(phase, -1):
                self.phase_peaks[phase] = self.live
            if self.live > self.peak:
                self.peak, self.peak_phase = self.live, phase

    def _resized(self, st: torch.UntypedStorage) -> None:
        block = self._blocks.get(st._cdata)
        if block is not None and block[1] != st.nbytes():
            delta, block[1] = st.nbytes() - block[1], st.nbytes()
            self._change(delta, "resize_")
            self._end(st._cdata)  # one life ends (if it had one: not at 0 bytes) and another, of the new
            self._begin(st._cdata, st.nbytes(), "resize_")  # size, begins (unless it is 0 bytes now)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Tag everything inside with `name` instead of the automatic phase."""
        self._overrides.append(name)
        try:
            yield
        finally:
            self._overrides.pop()

    def dump_snapshot(self, path: str) -> None:
        """Write the CUDA allocator's snapshot of the region (a meter with history=True on CUDA) as
        torch.cuda.memory._dump_snapshot writes one, for PyTorch's own viewer: drop the file on
        https://pytorch.org/memory_viz to see every allocation of the step, with the code that made it."""
        if self.cuda_snapshot is None:
            raise ValueError("MemoryMeter.dump_snapshot: no CUDA snapshot; it is taken by MemoryMeter(..., "
                             "history=True) around work on a CUDA device")
        with open(path, "wb") as f:
            pickle.dump(self.cuda_snapshot, f)

    # -- context
    def __enter__(self) -> MemoryMeter:
        if self._used:
            raise RuntimeError(
                "MemoryMeter: a meter measures one region and was already entered; create a new MemoryMeter() for another."
            )
        self._used = True
        with contextlib.ExitStack() as stack:
            for st in _tracked_storages(self._track):
                self._register(st, "track")
            self._track_modules = [m for m in self._track if isinstance(m, nn.Module) and self._record_lives]
            self._track = []  # registered by storage: a meter kept after its region holds no model alive
            self.baseline = self.peak = self.live = sum(b[1] for b in self._blocks.values())
            stack.callback(self._blocks.clear)  # drops the weakrefs, so no callback fires after exit
            self._install_optimizer_hooks(stack)
            self._install_resize_hook(stack)
            if self._record_lives:
                self._install_module_hooks(stack)
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                self._enter_cuda(stack)
            self._recording = True
            stack.callback(setattr, self, "_recording", False)
            stack.enter_context(_Watcher(self))
            _ENTERED.append(self)
            stack.callback(_ENTERED.remove, self)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        stack.close()  # type: ignore[union-attr]

    def _install_optimizer_hooks(self, stack: contextlib.ExitStack) -> None:
        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            self._in_optimizer += 1

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            self._in_optimizer -= 1

        stack.callback(register_optimizer_step_pre_hook(pre).remove)
        stack.callback(register_optimizer_step_post_hook(post).remove)

    def _install_module_hooks(self, stack: contextlib.ExitStack) -> None:
        """Global forward hooks keep the stack of running modules, each named as the tracked module that holds it
        names it (an untracked one: by its class)."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        for obj in self._track_modules:
            self._names.update({id(m): n or type(obj).__name__ for n, m in obj.named_modules()})
        self._track_modules = []  # names by id only: no module kept alive

        def pre(module: nn.Module, args: Any) -> None:
            self._running.append(self._names.get(id(module), type(module).__name__))

        def post(module: nn.Module, args: Any, out: Any) -> None:
            if self._running:
                self._running.pop()

        stack.callback(register_module_forward_pre_hook(pre).remove)
        stack.callback(register_module_forward_hook(post, always_call=True).remove)

    def _install_resize_hook(self, stack: contextlib.ExitStack) -> None:
        # UntypedStorage.resize_ bypasses dispatch (FSDP frees params this way); MemTracker patches it too
        original = torch.UntypedStorage.resize_

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = original(st, size)
            self._resized(st)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        stack.callback(setattr, torch.UntypedStorage, "resize_", original)

    def _enter_cuda(self, stack: contextlib.ExitStack) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._cuda_base = torch.cuda.memory_allocated()
        if self.history:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
            stack.callback(torch.cuda.memory._record_memory_history, enabled=None)

        def leave() -> None:
            torch.cuda.synchronize()
            self.allocator_peak = torch.cuda.max_memory_allocated() - self._cuda_base
            if self.history:
                self.cuda_snapshot = torch.cuda.memory._snapshot()

        stack.callback(leave)


def _flatten_track(track: Any) -> list[Any]:
    out: list[Any] = []
    for obj in track:
        if isinstance(obj, (list, tuple)):
            out.extend(_flatten_track(obj))
        elif isinstance(obj, (nn.Module, torch.optim.Optimizer, torch.Tensor)):
            if isinstance(obj, nn.Module):
                check_not_meta(obj, "MemoryMeter")
            out.append(obj)
        elif obj is not None:
            raise TypeError(
                f"MemoryMeter: cannot track {type(obj).__name__}; "
                "track takes nn.Module, torch.optim.Optimizer, torch.Tensor, or lists of them."
            )
    return out


def _tracked_storages(track: list[Any]) -> Iterator[torch.UntypedStorage]:
    for obj in track:
        if isinstance(obj, torch.Tensor):
            yield from tensor_storages(obj)
        elif isinstance(obj, nn.Module):
            tensors = [*obj.parameters(), *obj.buffers()]
            yield from tensor_storages(tensors, [p.grad for p in obj.parameters() if p.grad is not None])
        else:
            yield from tensor_storages(list(obj.state.values()))


def measure_peak(fn: Callable[..., Any], *args: Any, track: Any = (), **kwargs: Any) -> MemoryMeter:
    """Run fn(*args, **kwargs) inside a MemoryMeter(*track) and return it (the output is in .result)."""
    check_callable(fn, "measure_peak")
    track = track if isinstance(track, (list, tuple)) else (track,)
    with MemoryMeter(*track) as meter:
        meter.result = fn(*args, **kwargs)
    return meter
