"""Which device a piece of work runs on, so that it is timed with that device's clock.

A training step handed to ``benchmark`` is nearly always a closure: ``lambda: step(model, x)``, a function made by
another (``train_step(model, opt, x, loss)``), a ``functools.partial``, a bound method. Its tensors are not among
its arguments, and a search that looks at the arguments alone finds none and times CUDA work with the host
clock, which returns before the kernels finish (the fourth rule of labkit/instruments/timing.py). So the search
goes where a closure keeps its tensors:

- a function's closure cells, default arguments, and the globals its code names (a notebook's ``lambda: f(x)``
  reads ``x`` from the notebook's globals), nested functions' code included;
- a ``functools.partial``'s function and arguments, a bound method's object, a callable object's attributes;
- modules (parameters and buffers), optimizers (their parameters and state), lists, tuples, sets and dicts.

It stops at Python modules and classes, a few levels down and after a few thousand objects (it then answers
from what it found so far); an object it cannot look into (its attributes raise) is passed over. Where it finds
nothing and CUDA is available, ``seen_in`` runs the work once and looks at the tensors its operations touch
(a ``TorchDispatchMode``). Work on a device other than the CPU and CUDA (``mps``, ``xpu``, ...) is refused,
naming the device: the kit has no honest clock for it. ``meta`` tensors hold no data and run no kernels, so
beside CPU or CUDA tensors they are passed over; work on ``meta`` alone is refused.
"""
from __future__ import annotations

import functools
import itertools
import types
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["found_device", "seen_in", "pick"]

DEPTH = 6  # levels of closures, attributes and containers followed from what was given
BUDGET = 5000  # objects looked at, at most; past it the search answers from what it has found


def _code_names(code: types.CodeType) -> Iterator[str]:
    """The global names `code` and the functions defined inside it read."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _inside(value: Any) -> Iterable[Any]:
    """What the search looks at next inside `value` (its tensors come out of `_tensors_of`)."""
    if isinstance(value, (types.ModuleType, type, str, bytes, int, float, complex, bool, type(None))):
        return ()
    if isinstance(value, functools.partial):
        return (value.func, *value.args, *value.keywords.values())
    if isinstance(value, types.MethodType):
        return (value.__self__, value.__func__)
    if isinstance(value, types.FunctionType):
        cells = [c.cell_contents for c in value.__closure__ or () if _filled(c)]
        names = [value.__globals__[n] for n in dict.fromkeys(_code_names(value.__code__)) if n in value.__globals__]
        return (*cells, *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values(), *names)
    if isinstance(value, torch.optim.Optimizer):
        return ([p for g in value.param_groups for p in g["params"]], list(value.state.values()))
    if isinstance(value, torch.nn.Module):
        return ()  # its parameters and buffers are its tensors; its submodules hold no others
    if isinstance(value, dict):
        return value.values()
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    return vars(value).values() if hasattr(value, "__dict__") else ()  # a callable object, a dataclass


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return False
    return True


def _tensors_of(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, torch.nn.Module):
        return (*value.parameters(), *value.buffers())
    return ()


def _refused(device: torch.device) -> ValueError:
    return ValueError(f"the work to time runs on device {str(device)!r}, which labkit cannot time: it times "
                      "work on the CPU (host clock) and on CUDA (CUDA events). Run it on one of those, or "
                      "pass device='cpu' to time the host's side only")


def pick(devices: Iterable[torch.device]) -> torch.device | None:
    """CUDA if any of `devices` is CUDA (the first such), else CPU if any is, else None. Any other device is
    refused by name, but `meta` only where it is alone (a meta tensor beside real ones runs no kernel)."""
    seen: list[torch.device] = []
    meta: torch.device | None = None
    for d in devices:
        if d.type == "meta":
            meta = d
        elif d.type not in ("cpu", "cuda"):
            raise _refused(d)
        else:
            seen.append(d)
    if meta is not None and not seen:
        raise _refused(meta)
    return next((d for d in seen if d.type == "cuda"), seen[0] if seen else None)


def found_device(*values: Any) -> torch.device | None:
    """The device of the tensors reachable from `values` (see the module's docstring), None where none is."""
    devices: list[torch.device] = []
    looked: dict[int, Any] = {}  # id -> the object, held so that a freed temporary's id is not taken again
    level = list(values)
    for _ in range(DEPTH + 1):
        following: list[Any] = []
        for value in level:
            if id(value) in looked or len(looked) >= BUDGET:
                continue
            looked[id(value)] = value
            try:
                devices += [t.device for t in _tensors_of(value)]
                if not isinstance(value, torch.Tensor):
                    following += itertools.islice(_inside(value), max(0, BUDGET - len(looked) - len(following)) + 1)
            except Exception:  # an object whose attributes or items raise when read: passed over
                continue
        level = following
    return pick(devices)


class _Seen(TorchDispatchMode):
    """Records the device of every tensor an operation takes or makes."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: dict[torch.device, None] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                self.devices[t.device] = None
        return out


def seen_in(call: Callable[[], Any]) -> torch.device | None:
    """Run `call` once and return the device its operations ran on (as `pick` chooses), None if it ran none."""
    with _Seen() as seen:
        call()
    return pick(seen.devices)
