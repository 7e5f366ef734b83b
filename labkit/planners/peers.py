"""PyTorch's other answers to lab 07's question, each run on a model's blocks as a plan is (`applied`): every
block under ``torch.utils.checkpoint``, ``checkpoint_sequential`` over the blocks, and each block compiled by
torch.compile under an activation memory budget. (sac_milp, PyTorch's planner, is in sac_milp.py.)

Each is a context manager that can be entered again and again (the compiled blocks are compiled once), so a
step can be timed under it in alternation with a plain step.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from labkit.instruments.blocks import blocks_of, patched
from labkit.instruments.compiled import Compiled
from labkit.planners.applying import same_arguments

__all__ = ["torch_full", "torch_sequential", "CompiledBlocks"]


@contextlib.contextmanager
def torch_full(model: nn.Module, blocks: Any = None) -> Iterator[None]:
    """While inside, every block of `model` (blocks_of(model, blocks)) runs under torch.utils.checkpoint
    (non-reentrant): full recomputation as PyTorch ships it."""
    blocks = [m for _, m in blocks_of(model, blocks)]
    ways = [(b, (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False, **k))(b.forward)) for b in blocks]
    with patched(ways):
        yield


@contextlib.contextmanager
def torch_sequential(model: nn.Module, segments: int | None = None, blocks: Any = None) -> Iterator[None]:
    """While inside, the blocks of `model` run as one torch.utils.checkpoint.checkpoint_sequential (non-reentrant)
    of `segments` segments (default round(√n)): segments of n // segments blocks, the last one not checkpointed.
    The first block runs them all, each with the first block's other arguments (a mask, rotary tables, as a
    Hugging Face model passes every block the same); the others pass their input through."""
    blocks = [m for _, m in blocks_of(model, blocks)]
    n = len(blocks)
    segments = segments or max(1, round(math.sqrt(n)))
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= n:
        raise ValueError(f"torch_sequential: segments={segments!r} must be an int from 1 to {n} (the blocks)")
    forwards = [b.forward for b in blocks]
    used: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((), {})]

    def first(h: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        used[0] = (a, k)
        functions = [(lambda x, f=f: f(x, *a, **k)) for f in forwards] if a or k else forwards
        return checkpoint_sequential(functions, segments, h, use_reentrant=False)

    def through(i: int) -> Any:
        def run(h: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
            if not same_arguments((a, k), used[0]):  # it ran with block 0's: never silently another mask
                raise ValueError(f"torch_sequential: block {i} is called with other arguments than block 0, which "
                                 "ran it inside checkpoint_sequential with its own; checkpoint_sequential passes "
                                 "one input along, so it cannot run these blocks")
            return h
        return run
    with patched([(blocks[0], first), *((b, through(i)) for i, b in enumerate(blocks[1:], 1))]):
        yield


class CompiledBlocks:
    """Each block of `model` compiled by torch.compile under activation_memory_budget=budget (its min-cut
    partitioner, then eager kernels or Inductor's: labkit.instruments.compiled), entered as a context manager:
    while inside, the blocks run compiled. Per block, as torchtitan compiles its models: each block's backward
    recomputes what its partition left out, while the others keep what theirs kept."""

    def __init__(self, model: nn.Module, budget: float, backend: str = "aot_eager_decomp_partition",
                 blocks: Any = None) -> None:
        self.blocks = [m for _, m in blocks_of(model, blocks)]
        self.compiled = [Compiled(b.forward, budget, backend) for b in self.blocks]
        self._entered: list[Any] = []

    def __enter__(self) -> CompiledBlocks:
        ctx = patched(zip(self.blocks, self.compiled))
        ctx.__enter__()
        self._entered.append(ctx)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered.pop().__exit__(*exc)

    def ran(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Refuse a region in which some block ran no compiled graph (dynamo fell back to eager)."""
        stack = contextlib.ExitStack()
        for c in self.compiled:
            stack.enter_context(c.check_ran(what))
        return stack
