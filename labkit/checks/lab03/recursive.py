"""Exercise 3.3: Chen et al.'s recursive checkpointing."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from labkit.checks.base import CheckFailure, need_callable, passed
from labkit.checks.lab03 import hints as H
from labkit.checks.lab03.common import call, clear, grads, plain_grads, same, weighted, widening_chain
from labkit.checks.lab03.segments import Recorder

SIZES = [1, 2, 3, 5, 8]


def expected_calls(n: int, split: Callable[[int], int] = lambda m: m // 2) -> list[int]:
    """Forward calls of each layer in one step of the recursion (first half checkpointed, second recursed)."""
    counts = [0] * n

    def rec(lo: int, hi: int) -> None:
        if hi - lo == 1:
            counts[lo] += 1
            return
        mid = lo + split(hi - lo)
        for i in range(lo, mid):  # the first half's forward, under the checkpoint's no_grad
            counts[i] += 1
        rec(mid, hi)
        rec(lo, mid)  # its recompute in backward runs the recursion with grad

    rec(0, n)
    return counts


def expected_starts(n: int) -> set[int]:
    """The first layers of the segments the recursion checkpoints, at every level (the first half of each)."""
    starts: set[int] = set()

    def rec(lo: int, hi: int) -> None:
        if hi - lo > 1:
            mid = lo + (hi - lo) // 2
            starts.add(lo)
            rec(lo, mid)
            rec(mid, hi)

    rec(0, n)
    return starts


def ex_3_3(checkpoint_recursive: Callable[..., Any]) -> None:
    """Exercise 3.3: the recursion runs each layer as often as it should, and gradients are exact."""
    __tracebackhide__ = True
    need_callable("3.3", "checkpoint_recursive", checkpoint_recursive)
    with torch.random.fork_rng(devices=[]):
        for n in SIZES:
            layers, x = widening_chain(n)
            want = plain_grads(layers, x)
            record = Recorder()
            what = f"checkpoint_recursive(<{n} layers>, x, checkpoint)"
            out = call("3.3", what, H.REC_SPEC, checkpoint_recursive, layers, x, record)
            call("3.3", f"{what}: backward", H.REC_SPEC, lambda: weighted(out).backward())
            calls = [layer.calls for layer in layers]
            if calls != expected_calls(n):
                hint = H.REC_SPLIT if calls == expected_calls(n, lambda m: -(-m // 2)) else H.REC_CALLS
                raise CheckFailure("3.3", f"{what}: forward calls of each layer in one step", expected_calls(n),
                                   calls, hint)
            if set(record.starts) != expected_starts(n):  # every level checkpoints with the one passed in
                raise CheckFailure("3.3", f"{what}: the first layers of the segments the checkpoint passed in saw",
                                   sorted(expected_starts(n)), sorted(set(record.starts)), H.REC_ARG)
            if not same(want, grads(layers, x)):
                raise CheckFailure("3.3", f"{what}: gradients", "bitwise equal to the plain chain's", "different",
                                   H.REC_SPEC)
            clear(layers, x)
    passed("3.3", f"bitwise gradients and the recursion's layer calls on chains of {', '.join(map(str, SIZES))} layers")
