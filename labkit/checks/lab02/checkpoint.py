"""Exercise 2.4: checkpoint(fn, *args, **kwargs), the reentrant design at the edges real users hit."""
from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from labkit.checks.base import CheckFailure, need_callable, passed
from labkit.checks.lab02 import hints as H
from labkit.checks.lab02.common import from_scratch, lab_trap, prerequisites_first, same_step
from labkit.checks.lab02.recompute import ex_2_1
from labkit.checks.lab02.replay import ex_2_2, ex_2_3
from labkit.checks.lab02.rig import (
    B, D, P_DROP, Calls, Net, amp, dropout_label, first_mismatch, loss_of, plain_step, show,
)

EARLIER = (("2.1", ex_2_1, ("Recompute",)), ("2.2", ex_2_2, ("stash_rng", "restored_rng", "RecomputeRNG")),
           ("2.3", ex_2_3, ("stash_autocast", "restored_autocast")))


def _checkpoint_step(checkpoint: Callable[..., Any], p: float, kind: str, autocast: bool = False) -> None:
    """checkpoint(fn, h, s) with tensors only, against the plain step."""
    __tracebackhide__ = True
    shown = {"one": "one output", "two": "two outputs", "mixed": "outputs (tensor, None, 3, int64 tensor)"}[kind]
    what = f"checkpoint(fn, h, s), fn with {shown}, {dropout_label(p)}" + (", forward under autocast" if autocast
                                                                             else "")
    want, want_next = plain_step(torch.float32, p, kind, autocast)
    net = Net(torch.float32, p)
    calls = Calls(net.function(kind))
    hint = H.AMP_REPLAY if autocast else H.USE_RNG if p else H.BUILD_ON
    try:
        with lab_trap("2.4", what, hint):
            torch.manual_seed(1)
            with amp(autocast):
                out = checkpoint(calls, net.pre(net.x), net.s)  # h made inline: only the checkpoint holds it
            loss_of(out, p).backward()
            got_next = torch.rand(4)
    finally:  # the closure mistake makes autograd fail too: name the mistake, not the error
        if calls.reran_on_originals():
            raise CheckFailure("2.4", f"{what}: the tensors fn received in the recompute",
                               "the detached copies RecomputeRNG passes to run",
                               "the tensors checkpoint was called with", H.CLOSURE)
    if calls.first_input_alive(0):  # h; `out` still holds the graph: a closure over the tensors keeps them
        raise CheckFailure("2.4", f"{what}: h once backward has used it, the output still alive", "freed",
                           "still alive", H.CLOSURE)
    same_step("2.4", what, (want, want_next), (net.grads(), got_next), hint, hint)


def non_tensor_step(checkpoint: Callable[..., Any], ex: str = "2.4", hint: str = H.NON_TENSOR,
                    name: str = "checkpoint") -> None:
    """checkpoint(fn, h, 0.5, s, True, None, shift=2.0): tensors and other arguments interleaved."""
    __tracebackhide__ = True

    def fn(h: torch.Tensor, scale: float, s: torch.Tensor, flag: bool, mask: torch.Tensor | None, *,
           shift: float = 1.0) -> torch.Tensor:
        # `net` is looked up at call time: the plain run's net first, then the checkpointed run's
        a = torch.tanh(net.w1(h) * scale * s)
        a = F.dropout(a, P_DROP, training=True) if flag else a
        a = a if mask is None else a * mask
        return net.w2(a) * shift

    args, kwargs = (0.5, True, None), {"shift": 2.0}
    what = f"{name}(fn, h, 0.5, s, True, None, shift=2.0)"
    net = Net(torch.float32)
    torch.manual_seed(1)
    fn(net.pre(net.x), 0.5, net.s, True, None, shift=2.0).sum().backward()
    want = net.grads()
    net = Net(torch.float32)
    calls = Calls(fn)
    with lab_trap(ex, what, hint, known=()):
        torch.manual_seed(1)
        checkpoint(calls, net.pre(net.x), 0.5, net.s, True, None, shift=2.0).sum().backward()
    expected = ("tensor", args[0], "tensor", *args[1:])
    for i, (got_args, got_kwargs) in enumerate(zip(calls.args, calls.kwargs)):
        if got_args != expected or got_kwargs != kwargs:
            run = "forward" if i == 0 else "the recompute"
            raise CheckFailure(ex, f"{what}: arguments fn received in {run}", f"{expected} {kwargs}",
                               f"{got_args} {got_kwargs}", hint)
    got = net.grads()
    mismatch = first_mismatch(want, got)
    if mismatch is not None:
        raise CheckFailure(ex, f"{what}: gradient of {mismatch}", show(want[mismatch]),
                           show(got[mismatch], want[mismatch]), hint)


def _check_refusal(checkpoint: Callable[..., Any]) -> None:
    """torch.autograd.grad through checkpoint raises and writes no .grad (PyTorch's reentrant checkpoint raises)."""
    __tracebackhide__ = True
    what = "torch.autograd.grad(loss, [x]) through checkpoint(fn, h, s)"
    net = Net(torch.float32)
    with lab_trap("2.4", what, H.BUILD_ON):
        loss = loss_of(checkpoint(net.fn, net.pre(net.x), net.s))
    try:
        torch.autograd.grad(loss, [net.x])
    except Exception as e:  # the right answer raises; it must also leave every .grad alone
        written = [n for n, g in net.grads().items() if g is not None]
        if written or "checkpoint" not in str(e):
            raise CheckFailure("2.4", what, "a checkpoint error and no .grad written",
                               f"{type(e).__name__}; .grad written: {', '.join(written) or 'none'}",
                               H.REFUSE_CKPT) from None
    else:
        raise CheckFailure("2.4", what, "an error: the reentrant design cannot serve .grad()", "no error",
                           H.REFUSE_CKPT)


def _warnings_of(checkpoint: Callable[..., Any], fn: Callable[..., Any], *args: Any) -> list[warnings.WarningMessage]:
    """Warnings checkpoint(fn, *args) emits, called from _caller's one line, where stacklevel=2 points."""
    __tracebackhide__ = True
    with warnings.catch_warnings(record=True) as caught, lab_trap("2.4", f"checkpoint(fn, {_names(args)})", H.WARN):
        warnings.simplefilter("always")
        _caller(checkpoint, fn, *args)
    return [w for w in caught if "requires_grad" in str(w.message) and issubclass(w.category, UserWarning)]


def _caller(checkpoint: Callable[..., Any], fn: Callable[..., Any], *args: Any) -> Any:
    return checkpoint(fn, *args)  # the caller's line: a warning with stacklevel=2 names this one, and only this


CALLER_LINE = _caller.__code__.co_firstlineno + 1


def _names(args: tuple[Any, ...]) -> str:
    return ", ".join("x" if isinstance(a, torch.Tensor) else repr(a) for a in args)


def _check_warnings(checkpoint: Callable[..., Any]) -> None:
    """Warn when no input requires grad and grad mode is on; otherwise not; at the caller's line."""
    __tracebackhide__ = True
    net = Net(torch.float32)
    frozen = nn.Embedding(10, D).requires_grad_(False)
    block = nn.Sequential(net.w1, nn.Tanh(), net.w2)
    ids = torch.arange(B)
    cases = [
        ("checkpoint(fn, h) where no input requires grad", True, False, (net.fn, torch.randn(B, D), net.s.detach())),
        ("checkpoint(block, frozen_embedding(ids)), block with parameters", True, False, (block, frozen(ids))),
        ("checkpoint(fn, h, s) where s requires grad", False, False, (net.fn, torch.randn(B, D), net.s)),
        ("checkpoint(fn, h) under torch.no_grad()", False, True, (net.fn, torch.randn(B, D), net.s.detach())),
    ]
    for what, should_warn, no_grad, args in cases:
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            caught = _warnings_of(checkpoint, *args)
        if should_warn and not caught:
            raise CheckFailure("2.4", f"{what}: warnings", "a UserWarning mentioning requires_grad", "none", H.WARN)
        if not should_warn and caught:
            raise CheckFailure("2.4", f"{what}: warnings", "none", str(caught[0].message)[:80],
                               H.WARN_GRAD_MODE if no_grad else H.WARN_ANY)
    caught = _warnings_of(checkpoint, net.fn, torch.randn(B, D), net.s.detach())
    if os.path.abspath(caught[0].filename) != os.path.abspath(__file__) or caught[0].lineno != CALLER_LINE:
        raise CheckFailure("2.4", "where the warning points", "the line that called checkpoint",
                           f"{os.path.basename(caught[0].filename)}:{caught[0].lineno}", H.STACKLEVEL)


def ex_2_4(checkpoint: Callable[..., Any]) -> None:
    """Exercise 2.4: checkpoint takes any arguments and outputs, replays RNG and autocast, warns when it should."""
    __tracebackhide__ = True
    need_callable("2.4", "checkpoint", checkpoint)
    with from_scratch("2.4", "what checkpoint calls"), torch.random.fork_rng(devices=[]), \
            prerequisites_first("2.4", "checkpoint", checkpoint, EARLIER):
        _checkpoint_step(checkpoint, 0.0, "one")
        _checkpoint_step(checkpoint, P_DROP, "one")
        _checkpoint_step(checkpoint, P_DROP, "two")
        _checkpoint_step(checkpoint, P_DROP, "mixed")
        non_tensor_step(checkpoint)
        _check_refusal(checkpoint)
        _check_warnings(checkpoint)
        _checkpoint_step(checkpoint, P_DROP, "one", autocast=True)
    passed("2.4", "bitwise gradients with dropout and under autocast, one, two and non-tensor outputs, non-tensor "
                  "and keyword arguments; .grad() refused; warns exactly when no input requires grad")
