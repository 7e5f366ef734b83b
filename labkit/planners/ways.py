"""The ways lab 07 runs a single block besides plainly, shared by its profile (profiling.py) and its plans
(applying.py): selective under PyTorch's selective checkpoint with lab 04's policy, and offload.

Lab 04's policy is the lab's own code (labkit.labs.selective: the reference answer in the kit, the student's in
a handed-out one).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import SAC_IGNORED_OPS
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from labkit.instruments.ops import OpRecord, op_key, trace
from labkit.instruments.tensors import op_name

__all__ = ["policy_of", "selective_keep", "selective", "offloaded"]


def policy_of(ops: list[OpRecord], block: nn.Module, who: str) -> frozenset[str]:
    """Lab 04's selective policy (every candidate outside core attention kept) from `ops`, a trace of `block`'s
    forward. A policy that would keep a random op before a recomputed one is refused: PyTorch's selective
    checkpoint would then compute wrong gradients without an error (lab 04)."""
    from labkit.labs.selective import random_ok, selective_keep as lab_keep  # lab 04

    keep = lab_keep(ops)
    if not random_ok(ops, keep):
        raise ValueError(f"{who}: the selective policy for {type(block).__name__} keeps a random op that a "
                         "recomputed one follows; PyTorch's selective checkpoint would be silently wrong")
    return keep


def selective_keep(block: nn.Module, x: torch.Tensor, forward: Callable[..., Any] | None = None,
                   who: str = "applied") -> frozenset[str]:
    """`policy_of` a trace of forward(x) (default the block's own; inside `applied`, the one it replaced): op
    keys count calls, and which ops run depends on the block and its input, so the policy is traced from what
    the block computes, at the input it runs on, each time it is asked for (`applied` asks once per block and
    input while inside: nothing is kept beyond it)."""
    return policy_of(traced(block, x, forward), block, who)


def traced(block: nn.Module, x: torch.Tensor, forward: Callable[..., Any] | None = None) -> list[OpRecord]:
    """The ops of forward(x) (default the block's own), untimed, attributed to the block's modules. Under
    autocast, with the weight casts a fresh forward makes: autocast caches a cast weight until its outermost
    region ends, so the cache is cleared before the trace (no casts of an earlier forward reused) and after it
    (none of the trace's left for the forward it was traced for, which would then run fewer ops)."""
    torch.clear_autocast_cache()
    try:
        return trace(forward or block, x.detach().requires_grad_(x.is_floating_point()), model=block, time=False)
    finally:
        torch.clear_autocast_cache()


class _SameOps(TorchDispatchMode):
    """Refuses, at the first op that differs, a forward that runs other ops than `keys` (the trace the policy
    was decided from): a policy's keys count calls, so on other ops it would keep other outputs, a random one
    before a recomputed one among them (silently wrong gradients under PyTorch's selective checkpoint)."""

    def __init__(self, keys: Sequence[str], who: str) -> None:
        super().__init__()
        self.keys, self.who, self.counts, self.at = keys, who, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func not in SAC_IGNORED_OPS:
            name = op_name(func)
            key = op_key(name, self.counts.get(name, 0))
            self.counts[name] = self.counts.get(name, 0) + 1
            if self.at >= len(self.keys) or self.keys[self.at] != key:
                want = self.keys[self.at] if self.at < len(self.keys) else "no more ops"
                raise ValueError(f"{self.who}: the block runs {key} where its selective policy was traced running "
                                 f"{want}: it computes otherwise than when the policy was made (changed inside "
                                 "`applied`?); leave `applied` and enter it again to trace it anew")
            self.at += 1
        return func(*args, **(kwargs or {}))


def selective(keep: frozenset[str], keys: Sequence[str] | None = None, who: str = "applied") -> Callable[..., Any]:
    """Lab 04's policy `keep` as PyTorch's selective checkpoint of a block: wrap(block, x). With `keys` (the op
    keys of the trace the policy came from), each forward is held to running those very ops (``_SameOps``)."""
    from labkit.labs.selective import torch_policy  # lab 04

    policy = torch_policy(keep)

    def context_fn() -> tuple[Any, Any]:
        forward, recompute = policy()
        return (forward if keys is None else _entered(forward, _SameOps(keys, who))), recompute
    return lambda block, x: torch_checkpoint(block, x, use_reentrant=False, context_fn=context_fn)


@contextlib.contextmanager
def _entered(first: Any, then: Any) -> Iterator[None]:
    """SAC's forward context, then the check inside it."""
    with first, then:
        yield


def offloaded(block: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
    """block(x) with its saved tensors moved to (pinned, from a GPU) host memory and back in backward: offload."""
    with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
        return block(x)
