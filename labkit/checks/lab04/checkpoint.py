"""Exercise 4.1: checkpoint_selective, held against no checkpointing and against PyTorch's selective checkpoint."""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from labkit.checks.base import CheckFailure, hidden, need_callable, passed
from labkit.checks.lab04 import hints as H
from labkit.checks.lab04.common import OpCounter, call, expect_error, grads_of, same, small_block
from labkit.instruments.meter import measure_peak
from labkit.instruments.ops import op_key, trace
from labkit.instruments.tensors import op_name

EX = "4.1"


def _torch_context(keep: Collection[str]) -> Callable[[], Any]:
    """PyTorch's selective checkpoint keeping `keep`, written here so the check does not trust the notebook's."""
    def context_fn() -> Any:
        counts: dict[bool, dict[str, int]] = {False: {}, True: {}}

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            c = counts[ctx.is_recompute]
            name = op_name(func)
            c[name] = c.get(name, 0) + 1
            return CheckpointPolicy.MUST_SAVE if op_key(name, c[name] - 1) in keep else \
                CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return context_fn


def _kept(run: Callable[[torch.Tensor], torch.Tensor], block: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes alive after run(x) beyond the block, x and the output."""
    with torch.random.fork_rng(devices=[]):
        meter = measure_peak(run, x, track=(block, x))
    return meter.live - meter.baseline - meter.result.untyped_storage().nbytes()


def _policies(block: torch.nn.Module, x: torch.Tensor) -> dict[str, frozenset[str]]:
    ops = trace(block, x, model=block, time=False)
    costly = [r for r in ops if r.output_bytes > 0 and not r.is_view]
    chosen = {"nothing": frozenset(),
              "the matrix products": frozenset(r.key for r in costly if r.op in ("addmm", "bmm")),
              "everything outside core attention": frozenset(r.key for r in costly
                                                             if not r.module.startswith("attn.core")),
              "every output but the random ops'": frozenset(r.key for r in costly if not r.random)}
    rng = hidden(EX)  # labkit grade: policies the student never saw (the random ops kept: a suffix of them)
    if rng is not None:
        rand = [r.key for r in costly if r.random]
        for i in range(3):
            others = frozenset(r.key for r in costly if not r.random and rng.random() < 0.5)
            chosen[f"drawn policy {i + 1}"] = others | frozenset(rand[rng.randrange(len(rand) + 1):])
    return chosen


def _block(cs: Callable[..., Any]) -> None:
    __tracebackhide__ = True
    rng = hidden(EX)
    block, x = small_block(4 if rng is None else rng.randrange(1000))
    want = grads_of(block, x, block)
    for label, keep in _policies(block, x).items():
        what = f"checkpoint_selective(block, x, keep=<{label}>) on a GPT block with dropout"
        got = call(EX, what, H.SEL_SPEC, grads_of, block, x, lambda h: cs(block, h, keep=keep))
        if not same(want, got):
            raise CheckFailure(EX, f"{what}: gradients", "those of no checkpointing, bit for bit", "others",
                               H.SEL_GRADS)
        mine = _kept(lambda h: checkpoint(block, h, use_reentrant=False, context_fn=_torch_context(keep)), block, x)
        theirs = call(EX, what, H.SEL_SPEC, _kept, lambda h: cs(block, h, keep=keep), block, x)
        if theirs != mine:
            raise CheckFailure(EX, f"{what}: bytes kept after forward", f"{mine:,} (PyTorch's, same keys)",
                               f"{theirs:,}", H.SEL_BYTES)
    keep = _policies(block, x)["the matrix products"]
    for label, k in (("nothing", frozenset()), ("the matrix products", keep)):
        counter = OpCounter()
        out = call(EX, "forward", H.SEL_SPEC, cs, block, x, keep=k)
        with counter:
            out.sum().backward()
        reran = counter.counts.get("addmm", 0)
        expected = 0 if k else 4
        if reran != expected:
            raise CheckFailure(EX, f"addmm calls in backward with keep=<{label}>", expected, reran,
                               H.SEL_SKIP if k else H.SEL_SPEC)
        block.zero_grad(set_to_none=True)
        x.grad = None


class _Detaches(TorchDispatchMode):
    """Every detach the modes inside it run, with its input: a detach made below autograd with the ADInplaceOrView
    key off (a plain t.detach() inside a dispatch mode) gets a version counter of its own, and after an in-place
    change of its input their versions differ; one made as alias() makes it shares the counter."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.detach.default:
            self.pairs.append((args[0], out))
        return out

    def own_counter(self) -> bool:
        """Some detach has a version counter of its own: its input changed in place and it did not see it."""
        return any(out._version != t._version for t, out in self.pairs)


def _in_place(cs: Callable[..., Any], CheckpointError: type, w: torch.Tensor, a: torch.Tensor) -> None:
    """Keeping mm#0 whose output relu_ then changes must be refused; a kept plain detach is named as the cause."""
    __tracebackhide__ = True

    def inplace(h: torch.Tensor) -> torch.Tensor:
        y = h @ w
        y.relu_()
        return y @ w

    spy, own = _Detaches(), []

    def run() -> None:
        with spy:
            out = cs(inplace, a, keep={"mm#0"})
        own.append(spy.own_counter())  # now: the recomputation's relu_ would bump a replayed detach's counter too
        out.sum().backward()

    what = "keep={'mm#0'} where mm#0's output is then changed in place by relu_"
    try:
        expect_error(EX, what, CheckpointError, "changed in place", H.SEL_MUTATED, run)
    except CheckFailure as failure:
        if failure.got == "no error" and any(own):
            raise CheckFailure(EX, what, failure.expected, "no error, and a kept detach that missed the change",
                               H.SEL_ALIAS) from None
        raise


def _edges(cs: Callable[..., Any]) -> None:
    __tracebackhide__ = True
    from labkit.labs.recompute import CheckpointError  # Lab 02's (in a handed-out kit: the student's own)

    gen = torch.Generator().manual_seed(2)
    w = torch.randn(6, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    a = torch.randn(3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    _in_place(cs, CheckpointError, w, a)

    def two_dropouts(h: torch.Tensor) -> torch.Tensor:
        h = torch.native_dropout(h @ w, 0.5, True)[0]
        return torch.native_dropout(h @ w, 0.5, True)[0]

    def grad(run: Callable[[], torch.Tensor]) -> torch.Tensor:
        w.grad = None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(3)
            run().sum().backward()
        return w.grad.clone()

    expect_error(EX, "keep={'native_dropout#0'} (forward) with native_dropout#1 recomputed", CheckpointError,
                 "native_dropout#1", H.SEL_RANDOM, lambda: cs(two_dropouts, a, keep={"native_dropout#0"}))
    both = {"native_dropout#0", "native_dropout#1"}
    got = call(EX, "keep both dropouts", H.SEL_SPEC, grad, lambda: cs(two_dropouts, a, keep=both))
    if not torch.equal(got, grad(lambda: two_dropouts(a))):
        raise CheckFailure(EX, "keep both dropouts: gradients", "those of no checkpointing", "others", H.SEL_GRADS)
    out = call(EX, "forward", H.SEL_SPEC, cs, two_dropouts, a, keep=both)
    out.sum().backward(retain_graph=True)
    expect_error(EX, "a second backward through the same region (retain_graph=True)", CheckpointError,
                 "second backward", H.SEL_TWICE, lambda: out.sum().backward())


def ex_4_1(checkpoint_selective: Callable[..., Any]) -> None:
    """Exercise 4.1: gradients bit for bit, PyTorch's bytes, kept ops not rerun, and the refusals."""
    __tracebackhide__ = True
    need_callable(EX, "checkpoint_selective", checkpoint_selective)
    with torch.random.fork_rng(devices=[]):  # dropout draws: leave the student's generator where it was
        _block(checkpoint_selective)
        _edges(checkpoint_selective)
    passed(EX, "gradients equal to no checkpointing and bytes equal to PyTorch's for four policies; kept ops "
               "are not rerun; in-place changes, a random op after a kept one, and a second backward refused")
