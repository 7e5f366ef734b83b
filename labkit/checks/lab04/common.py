"""What lab 04's checkers share: a small GPT block, made-up op profiles, and calling student code."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.checks.base import CheckFailure, Known, expect_error, trap  # noqa: F401  (expect_error: re-exported)
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.instruments.ops import OpRecord, op_key
from labkit.instruments.tensors import op_name


def small_block(seed: int = 4) -> tuple[torch.nn.Module, torch.Tensor]:
    """A GPT block with dropout on, in float64, and an input that requires grad."""
    cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dropout=0.2, dtype=torch.float64, seed=seed)
    return GPTStack(cfg, final_norm=False).blocks[0], gpt_input(cfg, requires_grad=True)


def grads_of(block: torch.nn.Module, x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]) -> list:
    """Gradients of a weighted sum of run(x), with dropout seeded; .grad cleared before and after."""
    block.zero_grad(set_to_none=True)
    x.grad = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        out = run(x)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    got = [p.grad.clone() if p.grad is not None else None for p in block.parameters()] + [x.grad.clone()]
    block.zero_grad(set_to_none=True)
    x.grad = None
    return got


def same(want: list, got: list) -> bool:
    return len(want) == len(got) and all(g is not None and torch.equal(w, g) for w, g in zip(want, got))


class OpCounter(TorchDispatchMode):
    """Counts the calls of each op name that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.counts[op_name(func)] = self.counts.get(op_name(func), 0) + 1
        return func(*args, **(kwargs or {}))


def record(name: str, count: int, out: int, seconds: float, view: bool = False, random: bool = False,
           module: str = "", is_output: bool = False, in_place: bool = False, mutated: bool = False) -> OpRecord:
    """A made-up OpRecord (a view or an in-place op makes no bytes of its own)."""
    return OpRecord(key=op_key(name, count), op=name, module=module, flops=0, bytes_moved=2 * out,
                    output_bytes=0 if view or in_place else out, elements=out // 4, is_view=view,
                    in_place=in_place, random=random, is_output=is_output, seconds=seconds, mutated=mutated)


def profiles(n_cases: int = 30, most_items: int = 9, seed: int = 5) -> list[tuple[list[OpRecord], int]]:
    """Made-up block profiles (views, random ops, ties, and nn.Dropout as a CPU runs it: a buffer from
    empty_like filled in place by bernoulli_) and budgets around what fits, from a fixed seed."""
    rng = np.random.default_rng(seed)
    names = ("addmm", "gelu", "mul", "_softmax", "add", "native_layer_norm")
    out = []
    for _ in range(n_cases):
        counts: dict[str, int] = {}
        ops = []
        for _ in range(int(rng.integers(1, most_items + 1))):
            kind = rng.random()
            name = "native_dropout" if kind < 0.2 else "view" if kind < 0.3 else "empty_like" if kind < 0.38 \
                else str(rng.choice(names))
            for name in (name, "bernoulli_") if name == "empty_like" else (name,):
                c = counts.get(name, 0)
                counts[name] = c + 1
                ops.append(record(name, c, 64 * int(rng.integers(1, 9)), float(rng.integers(1, 9)) * 1e-3,
                                  view=name == "view", random=name in ("native_dropout", "bernoulli_"),
                                  in_place=name == "bernoulli_", mutated=name == "empty_like"))
        if ops[-1].output_bytes and rng.random() < 0.5:  # the region's output: free to keep
            ops[-1] = replace(ops[-1], is_output=True)
        total = sum(r.output_bytes for r in ops if not r.is_view and not r.is_output and not r.mutated)
        out.append((ops, int(rng.integers(0, total + 2)) if total else 0))
    return out


def call(ex: str, what: str, hint: str, fn: Callable[..., Any], *args: Any, known: Known = (), **kwargs: Any) -> Any:
    """fn(*args, **kwargs); any exception of student code becomes a CheckFailure (a stub: NotAttempted)."""
    __tracebackhide__ = True
    with trap(ex, what, hint, known):
        return fn(*args, **kwargs)
