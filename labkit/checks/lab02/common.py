"""What lab 02's checkers share: calling student code, comparing one step with the plain one, prerequisites."""
from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import torch

from labkit.checks.base import CheckFailure, Known, NotAttempted, refusing, trap
from labkit.checks.lab02 import hints as H
from labkit.checks.lab02.rig import first_mismatch, show


def lab_trap(ex: str, what: str, hint: str, known: Known = H.KNOWN_ERRORS) -> contextlib.AbstractContextManager[None]:
    """base.trap with this lab's known autograd errors."""
    return trap(ex, what, hint, known)


def need_function(ex: str, name: str, obj: Any) -> None:
    """A CheckFailure unless `obj` is a torch.autograd.Function subclass."""
    __tracebackhide__ = True
    if not (isinstance(obj, type) and issubclass(obj, torch.autograd.Function)):
        raise CheckFailure(ex, f"what was passed as {name}", "a torch.autograd.Function subclass",
                           f"{type(obj).__name__} {obj!r:.60}",
                           f"pass the class {name} you defined in the exercise cell (not an instance or its result)")


def same_step(ex: str, what: str, want: tuple[dict, torch.Tensor], got: tuple[dict, torch.Tensor],
              grad_hint: str, rng_hint: str) -> None:
    """A CheckFailure unless gradients and the next random numbers match the plain step's bitwise."""
    __tracebackhide__ = True
    (want_grads, want_next), (got_grads, got_next) = want, got
    name = first_mismatch(want_grads, got_grads)
    if name is not None:
        raise CheckFailure(ex, f"{what}: gradient of {name}", show(want_grads[name]),
                           show(got_grads[name], want_grads[name]), grad_hint)
    if not torch.equal(got_next, want_next):
        raise CheckFailure(ex, f"{what}: torch.rand(4) after the step", want_next.tolist(), got_next.tolist(),
                           rng_hint)


def _namespace(obj: Any) -> dict[str, Any]:
    """The globals `obj` was defined in (a notebook's namespace, for what a student wrote there)."""
    if hasattr(obj, "__globals__"):
        return obj.__globals__
    for value in vars(obj).values() if isinstance(obj, type) else ():
        func = getattr(value, "__func__", value)
        if hasattr(func, "__globals__"):
            return func.__globals__
    return {}


Prerequisite = tuple[str, Callable[..., None], tuple[str, ...]]  # (exercise, its checker, the names it checks)


def check_prerequisites(ex: str, name: str, obj: Any, earlier: tuple[Prerequisite, ...]) -> None:
    """A CheckFailure naming the first earlier exercise whose checker fails on the definitions `obj` sees.

    Called once a check of `obj` has failed: when what it is built on is wrong, fixing that comes first.
    """
    __tracebackhide__ = True
    namespace = _namespace(obj)
    for earlier_ex, checker, names in earlier:
        if not all(n in namespace for n in names):
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                checker(*(namespace[n] for n in names))
        except CheckFailure as e:
            got = str(e).splitlines()[0]
            raise CheckFailure(ex, f"Exercise {earlier_ex}, which {name} is built on", "its checker passing", got,
                               H.PREREQUISITE.format(ex=earlier_ex, name=name, got=got[:120])) from None


@contextlib.contextmanager
def prerequisites_first(ex: str, name: str, obj: Any, earlier: tuple[Prerequisite, ...]):
    """Run a check; if it fails, report a failing earlier exercise instead, when there is one."""
    __tracebackhide__ = True
    try:
        yield
    except NotAttempted:
        raise
    except CheckFailure as failure:
        check_prerequisites(ex, name, obj, earlier)
        raise failure from None


def _library_checkpoints() -> dict:
    """The code of PyTorch's own checkpoints (both designs, and the sequential one), by name."""
    import inspect

    from torch.utils import checkpoint as library

    found = {}
    for name, fn in (("torch.utils.checkpoint.checkpoint", library.checkpoint),
                     ("torch.utils.checkpoint.checkpoint_sequential", library.checkpoint_sequential),
                     ("torch.utils.checkpoint.CheckpointFunction", library.CheckpointFunction.forward),
                     ("torch.utils.checkpoint's non-reentrant checkpoint", library._checkpoint_without_reentrant_generator)):
        found[inspect.unwrap(fn).__code__] = name
    return found


def from_scratch(ex: str, what: str) -> contextlib.AbstractContextManager[None]:
    """While inside, the student's checkpoint may not call PyTorch's (base.refusing)."""
    return refusing(ex, what, _library_checkpoints(), H.FROM_SCRATCH)
