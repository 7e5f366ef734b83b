"""A model's blocks, and running them another way for a while.

``blocks_of(model)`` finds the blocks a per-block scheme runs: the items of the model's ``blocks`` (or ``layers``)
list, or those given (``blocks=``); ``block_calls`` how the model calls them. ``patched`` is the one way the kit
changes how a module runs: while inside, each module's ``forward`` is the
function given for it; on the way out, whatever ``forward`` the module had when it came in is back (its class's,
or a patch made before), also when the block raised. ``wrapped`` and ``wrap_blocks`` build on it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from labkit.instruments.tensors import check_callable

__all__ = ["blocks_of", "BlockCall", "block_calls", "block_inputs", "patched", "wrapped", "wrap_blocks"]

_CLASS = object()  # the module had no forward of its own: its class's runs


def blocks_of(model: nn.Module, blocks: Any = None) -> list[tuple[str, nn.Module]]:
    """(fqn, module) of each block of `model`: `blocks` where given (the blocks' nn.ModuleList or nn.Sequential,
    a list of the modules, or their path in the model, such as "model.layers" in a Hugging Face Llama), else the
    items of the model's `blocks` (or `layers`) list; each named as model.named_modules() names it (the name the
    ledger attributes its bytes to: a block reached by two paths, say `net.blocks.0` and `blocks.0` through a
    wrapper, has the first)."""
    found = _given(model, blocks) if blocks is not None else next(
        (f for f in (getattr(model, n, None) for n in ("blocks", "layers"))
         if isinstance(f, (nn.ModuleList, nn.Sequential)) and len(f)), None)
    if found is None:
        raise ValueError(f"{type(model).__name__} has no blocks: a scheme applied per block needs the model's blocks, "
                         "as a non-empty `blocks` (nn.ModuleList) or `layers` (nn.Sequential), or given as blocks=: "
                         "the list or its path in the model" + _candidates(model))
    names = {id(m): fqn for fqn, m in model.named_modules()}
    missing = [i for i, m in enumerate(found) if id(m) not in names]
    if missing:  # an attribute not registered as a submodule (set through object.__setattr__, say)
        raise ValueError(f"{type(model).__name__}'s block {missing[0]} is not a submodule of the model: its bytes "
                         "could not be attributed to it; register the blocks as submodules")
    return [(names[id(m)], m) for m in found]


def _given(model: nn.Module, blocks: Any) -> list[nn.Module]:
    """The blocks named by blocks= (see blocks_of), or a ValueError naming what is allowed."""
    if isinstance(blocks, str):
        try:
            blocks = model.get_submodule(blocks)
        except AttributeError as e:
            raise ValueError(f"blocks={blocks!r} is not a submodule of {type(model).__name__}"
                             + _candidates(model)) from e
    found = list(blocks) if isinstance(blocks, (nn.ModuleList, nn.Sequential, list, tuple)) else None
    if not found or not all(isinstance(m, nn.Module) for m in found):
        raise ValueError(f"blocks= must be a non-empty nn.ModuleList, nn.Sequential or list of modules, or the path "
                         f"of one in the model; got {type(blocks).__name__} {blocks!r:.80}")
    return found


def _candidates(model: nn.Module) -> str:
    """'; its lists of like modules: ...' naming each ModuleList of two or more modules of one class, which is how
    models hold their blocks (GPT-2's transformer.h, Llama's model.layers)."""
    found = [f"{fqn} ({len(m)} {type(m[0]).__name__})" for fqn, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) > 1 and len({type(c) for c in m}) == 1]
    return f"; its lists of like modules: {', '.join(found)}" if found else ""


ONE_TENSOR = ("a per-block plan runs each block as block(h, ...) -> h: the hidden state first, any other arguments "
              "ones that need no gradient (a mask, rotary tables), and one tensor back; wrap a block that does "
              "otherwise in a module that does (for a block that returns a tuple: `return self.block(h, ...)[0]`)")


@dataclass(frozen=True)
class BlockCall:
    """How the model called a block in a step: its hidden state (detached) and its other arguments, which need
    no gradient and are the same at every step (a mask, rotary tables, positions)."""

    h: torch.Tensor
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def bind(self, fn: Callable[..., Any]) -> Callable[[torch.Tensor], Any]:
        """h -> fn(h, *args, **kwargs): the block as a function of its hidden state alone."""
        if not self.args and not self.kwargs:
            return fn
        return lambda h: fn(h, *self.args, **self.kwargs)


def block_calls(model: nn.Module, run: Callable[[], Any], who: str, blocks: Any = None) -> list[BlockCall]:
    """How each block of `model` is called during run(), checked to be what a per-block scheme can run: each
    block called, first with its hidden state (a tensor), its other arguments needing no gradient, returning one
    tensor. Anything else is a ValueError naming the block and what it was called with (ONE_TENSOR says how to
    make it fit)."""
    found = blocks_of(model, blocks)
    first: dict[int, int] = {}
    for i, (fqn, m) in enumerate(found):  # one module twice (shared weights) runs twice a step: no plan fits it
        if id(m) in first:
            raise ValueError(f"{who}: block {i} is block {first[id(m)]} ({fqn}): the model lists one module as two "
                             "blocks (shared weights); a per-block plan needs each block once")
        first[id(m)] = i
    seen: dict[int, tuple[tuple[Any, ...], dict[str, Any], Any]] = {}

    def hook(i: int) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            seen.setdefault(i, (args, kwargs, out))
        return record

    handles = [m.register_forward_hook(hook(i), with_kwargs=True) for i, (_, m) in enumerate(found)]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return [_checked(i, fqn, m, seen, who) for i, (fqn, m) in enumerate(found)]


def _checked(i: int, fqn: str, m: nn.Module, seen: dict, who: str) -> BlockCall:
    if i not in seen:
        raise ValueError(f"{who}: block {fqn} ({type(m).__name__}) was never called by the model's forward")
    args, kwargs, out = seen[i]
    kinds = ", ".join([type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()])
    if not args or not isinstance(args[0], torch.Tensor):
        raise ValueError(f"{who}: block {fqn} ({type(m).__name__}) is called with ({kinds}), not its hidden state "
                         "first; " + ONE_TENSOR)
    grads = [k for k, v in [*((f"argument {j + 1}", a) for j, a in enumerate(args[1:], 1)), *kwargs.items()]
             if any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_leaves(v))]
    if grads:
        raise ValueError(f"{who}: block {fqn} ({type(m).__name__}) is called with a tensor that needs a gradient "
                         f"besides its hidden state ({grads[0]}); a recomputed block is rebuilt from its hidden state "
                         "alone; " + ONE_TENSOR)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{who}: block {fqn} ({type(m).__name__}) returns {type(out).__name__}, not one tensor; "
                         + ONE_TENSOR)
    return BlockCall(args[0].detach(), tuple(args[1:]), dict(kwargs))


def block_inputs(model: nn.Module, run: Callable[[], Any], who: str, blocks: Any = None) -> list[torch.Tensor]:
    """The hidden state (detached) each block of `model` is called with during run(), checked as block_calls
    checks it, and refused where a block takes other arguments (the advisor runs blocks on their input alone)."""
    calls = block_calls(model, run, who, blocks)
    for (fqn, m), c in zip(blocks_of(model, blocks), calls):
        if c.args or c.kwargs:
            raise ValueError(f"{who}: block {fqn} ({type(m).__name__}) takes arguments besides its hidden state; "
                             "this one runs blocks as block(h) -> h: wrap it in a module that does")
    return [c.h for c in calls]


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
