"""Exercises 3.1 and 3.2: a chain in k checkpointed segments, and the model of its peak."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote
from labkit.checks.lab03 import hints as H
from labkit.checks.lab03.common import call, clear, expect_error, grads, plain_grads, same, weighted, widening_chain
from labkit.instruments import saved_tensors

CASES = [(5, 2), (5, 3), (7, 3), (6, 4), (4, 4), (5, 1), (1, 1)]  # (n, k): uneven splits, both ends; k >= 2 first


class Recorder:
    """A checkpoint (torch's, non-reentrant) that notes which layer each segment starts at."""

    def __init__(self) -> None:
        self.starts: list[int] = []

    def __call__(self, fn: Callable[..., Any], h: torch.Tensor) -> torch.Tensor:
        self.starts.append(h.shape[-1] - 2)  # layer i of a widening chain takes inputs of width 2 + i
        return torch_checkpoint(fn, h, use_reentrant=False)


def _segments_step(checkpoint_segments: Callable[..., Any], n: int, k: int) -> None:
    __tracebackhide__ = True
    layers, x = widening_chain(n)
    want = plain_grads(layers, x)
    record = Recorder()
    what = f"checkpoint_segments(<{n} layers>, x, {k}, checkpoint)"
    out = call("3.1", what, H.SEG_SPEC, checkpoint_segments, layers, x, k, record)
    starts = [i * n // k for i in range(k)]
    if not record.starts:
        raise CheckFailure("3.1", f"{what}: calls of the checkpoint passed in", k, 0, H.SEG_ARG)
    if len(record.starts) == k - 1 and record.starts == starts[:-1]:
        raise CheckFailure("3.1", f"{what}: segments checkpointed", f"all {k}", f"{k - 1}, the last ran plainly",
                           H.SEG_LAST)
    if record.starts != starts:
        raise CheckFailure("3.1", f"{what}: the layers the segments start at", starts, record.starts, H.SEG_BOUNDS)
    call("3.1", f"{what}: backward", H.SEG_SPEC, lambda: weighted(out).backward())
    calls = [layer.calls for layer in layers]
    if calls != [2] * n:
        raise CheckFailure("3.1", f"{what}: forward calls of each layer in one step", [2] * n, calls, H.SEG_ONCE)
    if not same(want, grads(layers, x)):
        raise CheckFailure("3.1", f"{what}: gradients", "bitwise equal to the plain chain's", "different", H.SEG_EXACT)
    clear(layers, x)


def _kept_inputs(checkpoint_segments: Callable[..., Any]) -> None:
    """With the default checkpoint, forward keeps exactly the k segment inputs (the ledger)."""
    __tracebackhide__ = True
    n, k = 6, 3
    layers, x = widening_chain(n)
    what = f"the ledger of checkpoint_segments(<{n} layers>, x, {k}) with its default checkpoint"
    ledger = call("3.1", what, H.SEG_SPEC, lambda: saved_tensors(checkpoint_segments, layers, x, k))
    widths = sorted(e.shape[-1] for e in ledger.entries)
    want = sorted(2 + i * n // k for i in range(k))
    if widths != want:
        raise CheckFailure("3.1", f"{what}: widths of the tensors kept", want, widths,
                           H.SEG_LAST if len(widths) > len(want) else H.SEG_BOUNDS)


def _bad_input(checkpoint_segments: Callable[..., Any]) -> None:
    __tracebackhide__ = True
    layers, x = widening_chain(3)
    for k in (0, 4, -1):
        expect_error("3.1", f"checkpoint_segments(<3 layers>, x, {k!r})", ValueError, repr(k), H.SEG_BAD_K,
                     checkpoint_segments, layers, x, k)
    for k in (2.0, True, "2"):  # a bool is an int to Python: refused by name
        expect_error("3.1", f"checkpoint_segments(<3 layers>, x, {k!r})", TypeError, repr(k), H.SEG_BAD_TYPE,
                     checkpoint_segments, layers, x, k)
    expect_error("3.1", "checkpoint_segments([], x, 1)", ValueError, "empty", H.SEG_BAD_CHAIN,
                 checkpoint_segments, [], x, 1)
    expect_error("3.1", "checkpoint_segments([layer, 3], x, 1)", TypeError, "layers[1]", H.SEG_BAD_CHAIN,
                 checkpoint_segments, [layers[0], 3], x, 1)


def ex_3_1(checkpoint_segments: Callable[..., Any]) -> None:
    """Exercise 3.1: k checkpointed segments, bounds i*n//k, every segment recomputed, gradients exact."""
    __tracebackhide__ = True
    need_callable("3.1", "checkpoint_segments", checkpoint_segments)
    with torch.random.fork_rng(devices=[]):
        for n, k in CASES:
            _segments_step(checkpoint_segments, n, k)
        _kept_inputs(checkpoint_segments)
        _bad_input(checkpoint_segments)
    passed("3.1", f"bitwise gradients on {len(CASES)} chains, k from 1 to n; segments start at i*n//k, all "
                  "checkpointed, each layer run twice; bad k and chains refused")


# ---------------------------------------------------------------- Exercise 3.2
PEAK_CASES = [(64, 8, 100, 100, 30), (10, 3, 7, 5, 0), (7, 7, 4, 9, 1), (5, 1, 8, 3, 2), (9, 4, 1, 1, 0)]
BEST_CASES = [(64, 100, 100), (6, 1, 1), (50, 4, 1), (50, 1, 9), (1, 3, 3), (12, 2, 5)]


def _model_hint(got: Any, n: int, k: int, a: int, b: int, e: int) -> str:
    ceil = -(-n // k)
    mistakes = [(k * a + (n // k) * b + e, H.MODEL_CEIL), (k * a + ceil * b, H.MODEL_EXTRA),
                ((k + 1) * a + ceil * b + e, H.MODEL_INPUTS), ((k - 1) * a + ceil * b + e, H.MODEL_INPUTS)]
    return next((h for value, h in mistakes if got == value), H.MODEL_SPEC)


@remote
def ex_3_2(segment_peak: Callable[..., int], best_segments: Callable[..., int]) -> None:
    """Exercise 3.2: segment_peak = k·input + ceil(n/k)·layer + extra; best_segments its argmin over 1..n."""
    __tracebackhide__ = True
    need_callable("3.2", "segment_peak", segment_peak)
    need_callable("3.2", "best_segments", best_segments)
    peak_cases, best_cases = list(PEAK_CASES), list(BEST_CASES)
    rng = hidden("3.2")
    if rng is not None:  # labkit grade: chains and sizes the student never saw
        for _ in range(6):
            n = rng.randint(1, 400)
            peak_cases.append((n, rng.randint(1, n), rng.randint(1, 10 ** 6), rng.randint(1, 10 ** 6), rng.randint(0, 999)))
            best_cases.append((n, rng.randint(1, 10 ** 4), rng.randint(1, 10 ** 4)))
    for n, k, a, b, e in peak_cases:
        what = f"segment_peak({n}, {k}, {a}, {b}, {e})"
        got = call("3.2", what, H.MODEL_SPEC, segment_peak, n, k, a, b, e)
        want = k * a + -(-n // k) * b + e
        if isinstance(got, bool) or not isinstance(got, int):
            raise CheckFailure("3.2", f"the type {what} returns", "int", type(got).__name__, H.MODEL_INT)
        if got != want:
            raise CheckFailure("3.2", what, want, got, _model_hint(got, n, k, a, b, e))
    for n, a, b in best_cases:
        what = f"best_segments({n}, {a}, {b})"
        got = call("3.2", what, H.MODEL_BEST, best_segments, n, a, b)
        want = min(range(1, n + 1), key=lambda k: k * a + -(-n // k) * b)
        if got != want:
            raise CheckFailure("3.2", what, want, got, H.MODEL_BEST)
    passed("3.2", f"segment_peak right on {len(peak_cases)} cases (uneven splits included); best_segments is the "
                  f"argmin on {len(best_cases)} chains, ties to the smallest k")
