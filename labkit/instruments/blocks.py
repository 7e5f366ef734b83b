"""A model's blocks, and running them another way for a while.

``blocks_of(model)`` finds the blocks a per-block scheme runs: the items of the model's ``blocks`` (or ``layers``)
list. ``patched`` is the one way the kit changes how a module runs: while inside, each module's ``forward`` is the
function given for it; on the way out, whatever ``forward`` the module had when it came in is back (its class's,
or a patch made before), also when the block raised. ``wrapped`` and ``wrap_blocks`` build on it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torch import nn

from labkit.instruments.tensors import check_callable

__all__ = ["blocks_of", "patched", "wrapped", "wrap_blocks"]

_CLASS = object()  # the module had no forward of its own: its class's runs


def blocks_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(fqn, module) of each block of `model`: the items of its `blocks` (or `layers`) list."""
    for name in ("blocks", "layers"):
        found = getattr(model, name, None)
        if isinstance(found, (nn.ModuleList, nn.Sequential)) and len(found):
            return [(f"{name}.{i}", m) for i, m in enumerate(found)]
    raise ValueError(f"{type(model).__name__} has no blocks: a scheme applied per block needs a model with a "
                     "non-empty `blocks` (nn.ModuleList) or `layers` (nn.Sequential) of blocks")


@contextlib.contextmanager
def patched(forwards: Iterable[tuple[nn.Module, Callable[..., Any]]]) -> Iterator[None]:
    """While inside, each (module, fn) of `forwards` runs fn when the module is called; after, every module's
    forward is what it was before (a module named twice ends as it came in)."""
    forwards = list(forwards)
    for module, fn in forwards:
        if not isinstance(module, nn.Module):
            raise TypeError(f"patched: {module!r:.60} is not an nn.Module")
        check_callable(fn, "patched", f"the forward for {type(module).__name__}")
    before = [(module, vars(module).get("forward", _CLASS)) for module, _ in forwards]
    for module, fn in forwards:
        module.forward = fn
    try:
        yield
    finally:
        for module, old in reversed(before):
            if old is _CLASS:
                vars(module).pop("forward", None)  # the instance attribute goes; the class's forward shows again
            else:
                module.forward = old


def wrapped(modules: Sequence[nn.Module], wrap: Callable[..., Any]) -> contextlib.AbstractContextManager[None]:
    """While inside, calling one of `modules` runs wrap(its forward, *args, **kwargs) instead of its forward."""
    check_callable(wrap, "wrapped", "wrap")
    return patched((m, (lambda f: lambda *a, **k: wrap(f, *a, **k))(m.forward)) for m in modules)


def wrap_blocks(model: nn.Module, wrap: Callable[..., Any]) -> contextlib.AbstractContextManager[None]:
    """While inside, calling a block of `model` runs wrap(its forward, *args) instead of forward(*args)."""
    return wrapped([m for _, m in blocks_of(model)], wrap)
