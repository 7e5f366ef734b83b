"""Inside a graded process: what a student's answer may not change, watched and put back.

`arm()` runs before any student code and notes every object a checker relies on: the functions and classes of
labkit's modules (the top-level package included), torch's and Python's modules a check or the grader's worker
calls, and sys hooks (the worker runs no IPython kernel: nothing of one is watched). `verify()` runs after the
checker: whatever changed is put back and named, and the worker turns that into a `tampered` verdict;
`leftovers()` names what the student's code left running (threads, torch modes). Code in the same process can
defeat any such watch if it studies it: the grader decides what it can outside the box (docs/design.md,
"Grading a class"), and this guard is the last wall of what it cannot.
"""
from __future__ import annotations

import sys
import types
from typing import Any

MARK = "[labkit grade] put back, changed by an answer:"
_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.autograd", "torch.testing", "torch.utils.checkpoint",
            "torch.random", "torch.utils", "numpy", "math", "builtins", "os", "importlib", "contextlib", "functools",
            "copy", "dataclasses", "traceback", "json", "pickle", "base64", "io", "select", "signal")
_SYS = ("displayhook", "meta_path", "path_hooks")
_CLASSES_OF = ("contextlib", "functools", "copy", "dataclasses", "traceback", "io", "json")  # their classes too
_state: dict[str, Any] = {}


_EMPTY = object()  # an empty closure cell


def _function_parts(f: Any) -> tuple:
    """What a function runs: its code, defaults, and what its closure cells hold (a wrapper's wrapped function)."""
    return (f.__code__, f.__defaults__, f.__kwdefaults__, *(_cell(c) for c in (f.__closure__ or ())))


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def _modules() -> list[types.ModuleType]:
    """The modules watched: labkit's and those of _MODULES, as imported now."""
    return [m for n, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)
            and (n == "labkit" or n.startswith("labkit.") or n in _MODULES)]


def _watched(modules: list[types.ModuleType]) -> dict[tuple, tuple[Any, Any]]:
    """(where, name) -> (object, restore) for everything watched now in `modules` and beyond."""
    found: dict[tuple, tuple[Any, Any]] = {}
    classes = []
    for module in modules:
        for name, value in list(vars(module).items()):
            found[(module.__name__, name)] = (value, module)
            if isinstance(value, types.FunctionType) and (value.__module__ or "").startswith("labkit"):
                # labkit's own functions (the checkers' wrappers above all): code, defaults and closure. Not
                # torch's: their closures cache state (dynamo's disable wrappers fill theirs on first call)
                found[(module.__name__, name, "code")] = (_function_parts(value), value)
            elif isinstance(value, type) and ((getattr(value, "__module__", "") or "").startswith("labkit") or
                                              (module.__name__ in _CLASSES_OF and value.__module__ == module.__name__)):
                classes.append(value)  # labkit's classes, and those of the stdlib modules a checker's context uses
    import torch

    for cls in classes + [torch.Tensor, torch._C.TensorBase, torch.nn.Module, torch.autograd.Function]:
        where = f"{cls.__module__}.{cls.__qualname__}"
        # one added shadows a base's; __slotnames__ is copyreg's cache, written by the first copy.deepcopy
        found[(where, "(its attributes)")] = (frozenset(vars(cls)) - {"__slotnames__"}, ("keys", cls))
        for name, value in list(vars(cls).items()):
            found[(where, name)] = (value, cls)
    for name in _SYS:
        found[("sys", name)] = (getattr(sys, name), sys)
    for module in modules:  # a module swapped for another in sys.modules
        found[("sys.modules", module.__name__)] = (sys.modules.get(module.__name__), ("modules",))
    found[("sys", "gettrace")] = (sys.gettrace(), "trace")
    found[("sys", "getprofile")] = (sys.getprofile(), "profile")
    return found


def arm() -> None:
    """Note what is watched; run once, before any student code."""
    # the kit's modules are what a checker relies on: importing this module imported them (labkit's __init__)
    _state["modules"] = _modules()
    _state["watched"] = _watched(_state["modules"])


def _rewrapped(key: tuple, now: Any, before: Any) -> bool:
    """torch._dynamo, imported on first use, wraps torch.manual_seed around the original: not an answer's doing."""
    return key == ("torch", "manual_seed") and getattr(now, "__wrapped__", None) is before


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, frozenset):
        return a == b
    if type(a) is tuple and type(b) is tuple:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a is b


def _put_back(key: tuple, value: Any, owner: Any) -> None:
    if owner == "trace":
        sys.settrace(value)
    elif owner == "profile":
        sys.setprofile(value)
    elif isinstance(owner, tuple) and owner[0] == "modules":
        sys.modules[key[1]] = value
    elif isinstance(owner, tuple) and owner[0] == "keys":
        for name in set(vars(owner[1])) - value - {"__slotnames__"}:
            delattr(owner[1], name)
    elif len(key) == 3:  # a function's code, defaults, keyword defaults and closure
        owner.__code__, owner.__defaults__, owner.__kwdefaults__ = value[:3]
        for cell, held in zip(owner.__closure__ or (), value[3:]):
            if held is not _EMPTY:
                cell.cell_contents = held
    else:
        setattr(owner, key[1], value)


def verify(quiet: bool = False) -> list[str]:
    """Put back whatever changed since arm(); print one line naming it (unless `quiet`; nothing when all is as it
    was); the names of what changed."""
    before: dict = _state.get("watched") or {}
    now = _watched(_state.get("modules") or [])
    changed = []
    for key, (value, owner) in before.items():
        base = key[:2]  # the attribute; (module, name, "code") is its function's code and defaults
        if base in now and base in before and _rewrapped(base, now[base][0], before[base][0]):
            continue
        if key not in now or not _same(now[key][0], value):
            changed.append(".".join(str(k) for k in key[:2]))
            try:
                _put_back(key, value, owner)
            except Exception:  # noqa: BLE001  (a read-only attribute: reported all the same)
                pass
    if changed and not quiet:
        print(MARK, ", ".join(sorted(set(changed))[:8]))
    return changed


def leftovers(threads: int) -> list[str]:
    """What the student's code left behind that a checker does not: threads beyond the `threads` there were,
    torch function or dispatch modes still active (they can rewrite any op a check runs)."""
    import threading

    import torch

    found = []
    if threading.active_count() > threads:
        found.append(f"{threading.active_count() - threads} thread(s) started")
    if torch._C._len_torch_function_stack():
        found.append("a TorchFunctionMode left active")
    if torch._C._len_torch_dispatch_stack():
        found.append("a TorchDispatchMode left active")
    return found

