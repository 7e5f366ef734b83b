"""What the instruments share: storages of tensors, op names, the module stack, and argument checks."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


def op_name(func: Any) -> str:
    """aten.addmm.default -> 'addmm'."""
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", str(func))


def plain_tensors(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """t, or, for a wrapper subclass such as FSDP2's DTensor, the tensors it wraps (its local shard), whatever their
    layout: a wrapper's own storage is a stand-in of the global size, not memory (the ledger counts a wrapper so:
    its attribution rules, labkit/instruments/ledger.py)."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        for name in names:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):  # a flatten may also name non-tensor attributes
                yield from plain_tensors(inner)
    else:
        yield t


def tensor_storages(*trees: Any) -> list[torch.UntypedStorage]:
    """Distinct storages of every plain (strided) tensor in nested args/outputs, and of the tensors wrapper
    subclasses (DTensor) hold."""
    seen: dict[int, torch.UntypedStorage] = {}
    for leaf in tree_leaves(trees):
        if isinstance(leaf, torch.Tensor):
            for t in plain_tensors(leaf):
                if t.layout == torch.strided:
                    st = t.untyped_storage()
                    seen.setdefault(id(st), st)
    return list(seen.values())


def cuda_devices(*trees: Any) -> list[int]:
    """Sorted indices of the CUDA devices holding a tensor in `trees` (a module's parameters and buffers count):
    the generators torch.random.fork_rng must save and restore."""
    found = set()
    for leaf in tree_leaves(trees):
        tensors = [*leaf.parameters(), *leaf.buffers()] if isinstance(leaf, nn.Module) else [leaf]
        found |= {t.device.index or 0 for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}
    return sorted(found)


def inputs_of(modules: list[nn.Module], run: Any) -> list[tuple[Any, ...]]:
    """The positional arguments each of `modules` was called with during run() (its first call), the tensors
    detached."""
    seen: dict[int, tuple[Any, ...]] = {}
    detached = lambda a: tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in a)  # noqa: E731
    hooks = [m.register_forward_pre_hook(lambda m, a, i=i: seen.setdefault(i, detached(a)))
             for i, m in enumerate(modules)]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return [seen[i] for i in range(len(modules))]


def check_callable(fn: Any, who: str, name: str = "fn") -> None:
    """TypeError naming the type when argument `name` of `who` cannot be called."""
    if not callable(fn):
        raise TypeError(f"{who}: {name} must be callable (a function, lambda or nn.Module), "
                        f"got {type(fn).__name__}: {fn!r:.60}")


def check_not_meta(model: nn.Module, who: str) -> None:
    """ValueError when a parameter of `model` has no data (the meta device)."""
    for name, p in model.named_parameters():
        if p.device.type == "meta":
            raise ValueError(
                f"{who}: parameter {name!r} of {type(model).__name__} is on the meta device: "
                "materialise it with .to_empty(device=...) first."
            )


@contextlib.contextmanager
def module_stack(model: nn.Module | None, modules: list[str]) -> Iterator[None]:
    """While inside, `modules` holds the fqns of the submodules of `model` whose forward is running, innermost
    last (nothing when model is None)."""
    def leave(module: nn.Module, args: Any, output: Any) -> None:  # a forward hook returning a value would
        if modules:                                                 # replace the module's output: return None
            modules.pop()

    handles = []
    if model is not None:
        for fqn, mod in model.named_modules():
            handles.append(mod.register_forward_pre_hook(lambda m, a, fqn=fqn: modules.append(fqn)))
            handles.append(mod.register_forward_hook(leave))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
