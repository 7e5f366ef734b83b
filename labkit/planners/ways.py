"""The ways lab 07 runs a single block besides plainly, shared by its profile (profiling.py) and its plans
(applying.py): selective under PyTorch's selective checkpoint with lab 04's policy, and offload.

Lab 04's policy is the lab's own code (labkit.labs.selective: the reference answer in the kit, the student's in
a handed-out one).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from labkit.instruments.ops import OpRecord, trace

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
    ops = trace(forward or block, x.detach().requires_grad_(x.is_floating_point()), model=block, time=False)
    return policy_of(ops, block, who)


def selective(keep: frozenset[str]) -> Callable[..., Any]:
    """Lab 04's policy `keep` as PyTorch's selective checkpoint of a block: wrap(block, x)."""
    from labkit.labs.selective import torch_policy  # lab 04

    context_fn = torch_policy(keep)
    return lambda block, x: torch_checkpoint(block, x, use_reentrant=False, context_fn=context_fn)


def offloaded(block: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
    """block(x) with its saved tensors moved to (pinned, from a GPU) host memory and back in backward: offload."""
    with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
        return block(x)
