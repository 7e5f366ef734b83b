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

import torch
from torch import nn

from labkit.instruments.tensors import check_callable

__all__ = ["blocks_of", "block_inputs", "patched", "wrapped", "wrap_blocks"]

_CLASS = object()  # the module had no forward of its own: its class's runs


def blocks_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(fqn, module) of each block of `model`: the items of its `blocks` (or `layers`) list, each named as
    model.named_modules() names it (the name the ledger attributes its bytes to: a block reached by two paths,
    say `net.blocks.0` and `blocks.0` through a wrapper, has the first)."""
    for name in ("blocks", "layers"):
        found = getattr(model, name, None)
        if isinstance(found, (nn.ModuleList, nn.Sequential)) and len(found):
            names = {id(m): fqn for fqn, m in model.named_modules()}
            missing = [i for i, m in enumerate(found) if id(m) not in names]
            if missing:  # an attribute not registered as a submodule (set through object.__setattr__, say)
                raise ValueError(f"{type(model).__name__}.{name}[{missing[0]}] is not a submodule of the model: "
                                 "its bytes could not be attributed to it; register the blocks as submodules")
            return [(names[id(m)], m) for m in found]
    raise ValueError(f"{type(model).__name__} has no blocks: a scheme applied per block needs a model with a "
                     "non-empty `blocks` (nn.ModuleList) or `layers` (nn.Sequential) of blocks")


ONE_TENSOR = ("a per-block plan runs each block as block(h) -> h: wrap each in a module whose forward takes the "
              "hidden state alone and returns it alone (for a Hugging Face block: `return self.block(h)[0]`, with "
              "the cache off), and expose those as the model's `blocks`")


def block_inputs(model: nn.Module, run: Callable[[], Any], who: str) -> list[torch.Tensor]:
    """The input (detached) of each block of `model` during run(), checked to be what a per-block scheme can
    run: each block called, first with one tensor and nothing else, returning one tensor. Anything else is a
    ValueError naming the block and what it was called with (ONE_TENSOR says how to make it fit)."""
    blocks = blocks_of(model)
    first: dict[int, int] = {}
    for i, (fqn, m) in enumerate(blocks):  # one module twice (shared weights) runs twice a step: no plan fits it
        if id(m) in first:
            raise ValueError(f"{who}: block {i} is block {first[id(m)]} ({fqn}): the model lists one module as two "
                             "blocks (shared weights); a per-block plan needs each block once")
        first[id(m)] = i
    seen: dict[int, tuple[tuple[Any, ...], dict[str, Any], Any]] = {}

    def hook(i: int) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            seen.setdefault(i, (args, kwargs, out))
        return record

    handles = [m.register_forward_hook(hook(i), with_kwargs=True) for i, (_, m) in enumerate(blocks)]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    inputs = []
    for i, (fqn, m) in enumerate(blocks):
        if i not in seen:
            raise ValueError(f"{who}: block {fqn} ({type(m).__name__}) was never called by the model's forward")
        args, kwargs, out = seen[i]
        kinds = ", ".join([type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()])
        if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
            raise ValueError(f"{who}: block {fqn} ({type(m).__name__}) is called with ({kinds}), not one tensor; "
                             + ONE_TENSOR)
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"{who}: block {fqn} ({type(m).__name__}) returns {type(out).__name__}, not one tensor; "
                             + ONE_TENSOR)
        inputs.append(args[0].detach())
    return inputs


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
