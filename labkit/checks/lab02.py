"""Checkers of 02_recompute: Recompute, RNG replay, checkpoint, checkpoint_hooks.

Every check runs one small training step twice, plainly and through the
student's code, from the same weights and seeds, and compares the gradients
bit for bit (recomputation reruns the very same ops, so equality is exact).
Recomputation is proven by counting: calls of fn, grad mode in each call,
bytes saved (the Ledger) or kept alive (weak references) after forward.
The checks run inside `torch.random.fork_rng`, so the notebook's generator is
left as it was.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves

from labkit.checks.base import CheckFailure, Known, need_callable, passed, student_failure, trap
from labkit.checks.rig import (
    B, D, P_DROP, Calls, Net, dropout_label, first_mismatch, kept_after_forward, loss_of, plain_step, show,
)
from labkit.memory import saved_tensors

# ---------------------------------------------------------------- hints: one per mistake
NO_GRAD_FORWARD = ("run fn under torch.no_grad() in forward, so it records no graph and autograd saves none "
                   "of its activations")
ENABLE_GRAD = ("recompute under torch.enable_grad(): backward runs with grad mode off, so the rerun of fn "
               "recorded no graph to back-propagate through")
RNG_RESTORED = "gradients differ only where dropout acts: was the RNG state restored before recomputing?"
DETACH = ("detach the saved inputs before rerunning fn (x.detach().requires_grad_(x.requires_grad)); otherwise "
          "the rerun's graph reaches back into the layers before the checkpoint and they get their gradients twice")
SAVE_ONLY_INPUTS = ("save only the inputs (ctx.save_for_backward(*args)); fn's outputs and intermediates are "
                    "exactly what backward recomputes")
N_GRADS = "return one gradient per argument of forward: None for fn, then one per input"
NON_TENSOR = ("non-tensor arguments and keyword arguments must reach fn unchanged in both runs: pass only the "
              "tensors through RecomputeRNG.apply and close over the rest in the function it reruns")
WARN = ("when grad mode is on and no tensor argument requires grad, warn: warnings.warn(\"None of the inputs "
        "have requires_grad=True. Gradients will be None ...\", stacklevel=2)")
HOOKS_RNG = ("gradients differ only where dropout acts: stash the RNG state before running fn in forward and "
             "rerun it under restored_rng(state)")
HOOKS_PACK = ("pack must return a placeholder (an index) and drop the tensor: the rerun in backward makes "
              "the tensor again")

# what an autograd error message means, when it comes from a known mistake
KNOWN_ERRORS = (
    ("does not require grad and does not have a grad_fn", ENABLE_GRAD),
    ("incorrect number of gradients", N_GRADS),
    ("backward through the graph a second time", DETACH),
)

# ---------------------------------------------------------------- calling student code
def _trap(ex: str, what: str, hint: str, known: Known = KNOWN_ERRORS) -> contextlib.AbstractContextManager[None]:
    """base.trap with this lab's known autograd errors."""
    return trap(ex, what, hint, known)


def _need_function(ex: str, name: str, obj: Any) -> None:
    __tracebackhide__ = True
    if not (isinstance(obj, type) and issubclass(obj, torch.autograd.Function)):
        raise CheckFailure(ex, f"what was passed as {name}", "a torch.autograd.Function subclass",
                           f"{type(obj).__name__} {obj!r:.60}",
                           f"pass the class {name} you defined in the exercise cell (not an instance or its result)")


# ---------------------------------------------------------------- the model around a checkpoint
def _grad_hint(name: str, want: dict, got: dict) -> str:
    """Which mistake a wrong gradient points to (Exercise 2.1)."""
    inside = [n for n in want if "inside fn" in n]
    if any(got[n] is None for n in inside):
        return ("fn's parameters got no gradient: back-propagate grad_outputs through the rerun "
                "(torch.autograd.backward(outputs, grad_outputs))")
    if first_mismatch({n: want[n] for n in inside}, got) is None:
        g, w = got[name], want[name]
        if g is None:
            return ("the gradient stopped at the checkpoint: the detached inputs must require grad "
                    "(x.detach().requires_grad_(x.requires_grad)) and backward must return their .grad")
        if torch.equal(g, 2 * w) or "before" in name:
            return DETACH
    return ("gradients must equal the plain run bit for bit: rerun the same fn on the saved inputs, "
            "back-propagate grad_outputs through it and return each input's .grad")


# ---------------------------------------------------------------- Exercise 2.1
def _recompute_step(Recompute: type, dtype: torch.dtype, two: bool) -> None:
    """One step through Recompute.apply, checked call by call against the plain one."""
    __tracebackhide__ = True
    kind = "two outputs" if two else "one output"
    net = Net(dtype)
    calls = Calls(net.fn2 if two else net.fn)
    h = net.pre(net.x)
    what = f"Recompute.apply(fn, h, s), fn with {kind}, {dtype}"
    with _trap("2.1", what, "forward(ctx, fn, *args) saves args, runs fn(*args) and returns its output"):
        ledger = saved_tensors(Recompute.apply, calls, h, net.s)
        out = ledger.result
        loss = loss_of(out)
    _check_forward(calls, ledger, out, (h, net.s), what)
    err = None
    try:
        loss.backward()
    except Exception as e:  # reported below, after the grad-mode check that explains most of them
        err = e
    if len(calls.grad_modes) >= 2 and not any(calls.grad_modes[1:]):
        raise CheckFailure("2.1", f"{what}: grad mode while backward reran fn", "on", "off", ENABLE_GRAD)
    if err is not None:
        raise student_failure("2.1", f"{what}: backward", err,
                       "backward(ctx, *grad_outputs) reruns fn on the detached inputs and returns their gradients",
                       KNOWN_ERRORS)
    if len(calls.grad_modes) != 2:
        raise CheckFailure("2.1", f"{what}: calls of fn in one step", 2, len(calls.grad_modes),
                           "run fn exactly twice per step: once in forward, once in backward")
    want, got = plain_step(dtype, two=two)[0], net.grads()
    name = first_mismatch(want, got)
    if name is not None:
        raise CheckFailure("2.1", f"{what}: gradient of {name}", show(want[name]), show(got[name], want[name]),
                           _grad_hint(name, want, got))


def _check_forward(calls: Calls, ledger: Any, out: Any, inputs: tuple[torch.Tensor, ...], what: str) -> None:
    """fn ran once with grad mode off, and only the inputs were kept."""
    __tracebackhide__ = True
    if len(calls.grad_modes) != 1:
        raise CheckFailure("2.1", f"{what}: calls of fn in forward", 1, len(calls.grad_modes),
                           "forward runs fn once and returns its output")
    if calls.grad_modes[0]:
        raise CheckFailure("2.1", f"{what}: grad mode while forward ran fn", "off", "on", NO_GRAD_FORWARD)
    in_bytes = sum(t.untyped_storage().nbytes() for t in inputs)
    kept = _ctx_tensors(out, inputs)
    if ledger.total_bytes > in_bytes or kept:
        got = f"{ledger.total_bytes} B saved" + (f" and {kept} B kept on ctx" if kept else "")
        raise CheckFailure("2.1", f"{what}: bytes kept for backward", f"{in_bytes} B (the inputs)", got,
                           SAVE_ONLY_INPUTS)
    if ledger.total_bytes < in_bytes:
        raise CheckFailure("2.1", f"{what}: bytes saved for backward", f"{in_bytes} B (the inputs)",
                           f"{ledger.total_bytes} B",
                           "save the inputs with ctx.save_for_backward(*args) and read them back from "
                           "ctx.saved_tensors in backward")


def _ctx_tensors(out: Any, inputs: tuple[torch.Tensor, ...]) -> int:
    """Bytes of tensors other than the inputs stored as attributes of ctx (ctx.out = out)."""
    first = out if isinstance(out, torch.Tensor) else next(iter(out), None)
    ctx = getattr(first, "grad_fn", None)
    ours = {t.untyped_storage().data_ptr() for t in inputs}
    found: dict[int, int] = {}
    for value in getattr(ctx, "__dict__", {}).values():
        for t in tree_leaves(value):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.untyped_storage().data_ptr() not in ours:
                found[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(found.values())


def ex_2_1(Recompute: type) -> None:
    """Exercise 2.1: Recompute saves only fn's inputs and reruns fn in backward; gradients are exact."""
    __tracebackhide__ = True
    _need_function("2.1", "Recompute", Recompute)
    with torch.random.fork_rng(devices=[]):
        for dtype in (torch.float32, torch.float64):
            _recompute_step(Recompute, dtype, two=False)
        _recompute_step(Recompute, torch.float32, two=True)
    passed("2.1", "bitwise gradients in float32 and float64, one and two outputs; fn ran twice; "
                  "only the inputs were saved")


# ---------------------------------------------------------------- Exercise 2.2
def _check_replay(stash_rng: Callable[..., Any], restored_rng: Callable[..., Any]) -> None:
    """s = stash_rng(); a = rand; with restored_rng(s): b = rand  gives a == b, and rand continues after a."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    torch.rand(3)
    after_a = torch.rand(3)
    what = "s = stash_rng(x); a = torch.rand(3); with restored_rng(s): b = torch.rand(3)"
    torch.manual_seed(0)
    with _trap("2.2", what, "stash_rng(*args) returns the generator states; restored_rng(state) is a "
                            "context manager that runs its block from them",
               (("context manager", "restored_rng must be a context manager: decorate it with @contextmanager "
                                    "and yield once inside"),)):
        state = stash_rng(torch.zeros(2))
        a = torch.rand(3)
        with restored_rng(state):
            b = torch.rand(3)
            torch.rand(7)  # more draws than a's, so a generator left where the block ended shows in c
        c = torch.rand(3)
        with restored_rng(state):
            b2 = torch.rand(3)
    for name, got in (("b", b), ("b from a second restored_rng(s)", b2)):
        if not torch.equal(got, a):
            raise CheckFailure("2.2", f"{what}: {name}", a.tolist(), got.tolist(),
                               "stash_rng must return a snapshot (torch.get_rng_state()) and restored_rng must set "
                               "it (torch.set_rng_state) before running the block")
    if not torch.equal(c, after_a):
        raise CheckFailure("2.2", f"{what}: torch.rand(3) after the with-block", after_a.tolist(), c.tolist(),
                           "after the block the generator must continue as if the block had not run: save the "
                           "current state on entry and put it back on exit (torch.random.fork_rng does both)")


def _same_step(ex: str, what: str, want: tuple[dict, torch.Tensor], got: tuple[dict, torch.Tensor],
               grad_hint: str, rng_hint: str) -> None:
    """A CheckFailure unless gradients and the next random numbers match the plain step's bitwise."""
    __tracebackhide__ = True
    (want_grads, want_next), (got_grads, got_next) = want, got
    name = first_mismatch(want_grads, got_grads)
    if name is not None:
        raise CheckFailure(ex, f"{what}: gradient of {name}", show(want_grads[name]),
                           show(got_grads[name], want_grads[name]), grad_hint)
    if not torch.equal(got_next, want_next):
        raise CheckFailure(ex, f"{what}: torch.rand(4) after the step", want_next.tolist(), got_next.tolist(),
                           rng_hint)


def _rng_step(RecomputeRNG: type, p: float) -> None:
    """One step through RecomputeRNG.apply with dropout p inside fn and after it, against the plain one."""
    __tracebackhide__ = True
    what = f"RecomputeRNG.apply(fn, h, s), {dropout_label(p)}"
    want, want_next = plain_step(torch.float32, p)
    net = Net(torch.float32, p)
    with _trap("2.2", what, "RecomputeRNG runs like your Recompute, with the RNG state stashed in forward "
                            "and restored in backward"):
        torch.manual_seed(1)
        loss_of(RecomputeRNG.apply(net.fn, net.pre(net.x), net.s), p).backward()
        got_next = torch.rand(4)
    grad_hint = RNG_RESTORED if p else ("RecomputeRNG is wrong even without dropout: make Exercise 2.1 pass first "
                                        "(RecomputeRNG is built on your Recompute)")
    _same_step("2.2", what, (want, want_next), (net.grads(), got_next), grad_hint,
               "after backward the generator must continue where training left it: restore the "
               "state only for the recompute (torch.random.fork_rng around it)")


def ex_2_2(stash_rng: Callable[..., Any], restored_rng: Callable[..., Any], RecomputeRNG: type) -> None:
    """Exercise 2.2: the RNG is replayed for the recompute, and continues afterwards as if it had not been."""
    __tracebackhide__ = True
    need_callable("2.2", "stash_rng", stash_rng)
    need_callable("2.2", "restored_rng", restored_rng)
    _need_function("2.2", "RecomputeRNG", RecomputeRNG)
    with torch.random.fork_rng(devices=[]):
        _check_replay(stash_rng, restored_rng)
        _rng_step(RecomputeRNG, 0.0)
        _rng_step(RecomputeRNG, P_DROP)
    passed("2.2", "restored_rng replays stash_rng's state; RecomputeRNG gives bitwise gradients with dropout "
                  "and the generator continues as without recomputation")


# ---------------------------------------------------------------- Exercise 2.3
def _checkpoint_step(checkpoint: Callable[..., Any], p: float, two: bool) -> None:
    """checkpoint(fn, h, s) with tensors only, against the plain step."""
    __tracebackhide__ = True
    kind = "two outputs" if two else "one output"
    what = f"checkpoint(fn, h, s), fn with {kind}, {dropout_label(p)}"
    want, want_next = plain_step(torch.float32, p, two)
    net = Net(torch.float32, p)
    with _trap("2.3", what, "checkpoint is built on your RecomputeRNG: make Exercises 2.1 and 2.2 pass, then "
                            "return RecomputeRNG.apply(fn, *tensors)"):
        torch.manual_seed(1)
        loss_of(checkpoint(net.fn2 if two else net.fn, net.pre(net.x), net.s), p).backward()
        got_next = torch.rand(4)
    hint = ("with dropout inside fn, use RecomputeRNG.apply, not Recompute.apply: the recompute must replay "
            "the RNG" if p else "make Exercises 2.1 and 2.2 pass, then return RecomputeRNG.apply(fn, *tensors)")
    _same_step("2.3", what, (want, want_next), (net.grads(), got_next), hint, hint)


def _non_tensor_step(checkpoint: Callable[..., Any]) -> None:
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
    what = "checkpoint(fn, h, 0.5, s, True, None, shift=2.0)"
    net = Net(torch.float32)
    torch.manual_seed(1)
    fn(net.pre(net.x), 0.5, net.s, True, None, shift=2.0).sum().backward()
    want = net.grads()
    net = Net(torch.float32)
    calls = Calls(fn)
    with _trap("2.3", what, NON_TENSOR, known=()):
        torch.manual_seed(1)
        checkpoint(calls, net.pre(net.x), 0.5, net.s, True, None, shift=2.0).sum().backward()
    expected = ("tensor", args[0], "tensor", *args[1:])
    for i, (got_args, got_kwargs) in enumerate(zip(calls.args, calls.kwargs)):
        if got_args != expected or got_kwargs != kwargs:
            run = "forward" if i == 0 else "the recompute"
            raise CheckFailure("2.3", f"{what}: arguments fn received in {run}", f"{expected} {kwargs}",
                               f"{got_args} {got_kwargs}", NON_TENSOR)
    got = net.grads()
    name = first_mismatch(want, got)
    if name is not None:
        raise CheckFailure("2.3", f"{what}: gradient of {name}", show(want[name]), show(got[name], want[name]),
                           NON_TENSOR)


def _warnings_of(checkpoint: Callable[..., Any], fn: Callable[..., Any], *args: Any) -> list[warnings.WarningMessage]:
    """Warnings checkpoint(fn, *args) emits; the call is on a line of this file, for stacklevel=2."""
    __tracebackhide__ = True
    with warnings.catch_warnings(record=True) as caught, _trap("2.3", f"checkpoint(fn, {_names(args)})", WARN):
        warnings.simplefilter("always")
        checkpoint(fn, *args)
    return [w for w in caught if "requires_grad" in str(w.message) and issubclass(w.category, UserWarning)]


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
            raise CheckFailure("2.3", f"{what}: warnings", "a UserWarning mentioning requires_grad", "none", WARN)
        if not should_warn and caught:
            hint = ("warn only when grad mode is on (torch.is_grad_enabled()): under torch.no_grad() nobody "
                    "expects gradients" if no_grad else
                    "warn only when no tensor argument requires grad (not any(t.requires_grad for t in tensors))")
            raise CheckFailure("2.3", f"{what}: warnings", "none", str(caught[0].message)[:80], hint)
    caught = _warnings_of(checkpoint, net.fn, torch.randn(B, D), net.s.detach())
    if os.path.abspath(caught[0].filename) != os.path.abspath(__file__):
        raise CheckFailure("2.3", "where the warning points", "the line that called checkpoint",
                           f"{os.path.basename(caught[0].filename)}:{caught[0].lineno}",
                           "pass stacklevel=2 to warnings.warn, so the warning names the caller's line, not yours")


def ex_2_3(checkpoint: Callable[..., Any]) -> None:
    """Exercise 2.3: checkpoint takes any arguments, several outputs, and warns when no input requires grad."""
    __tracebackhide__ = True
    need_callable("2.3", "checkpoint", checkpoint)
    with torch.random.fork_rng(devices=[]):
        _checkpoint_step(checkpoint, 0.0, two=False)
        _checkpoint_step(checkpoint, P_DROP, two=False)
        _checkpoint_step(checkpoint, P_DROP, two=True)
        _non_tensor_step(checkpoint)
        _check_warnings(checkpoint)
    passed("2.3", "bitwise gradients with dropout, one and two outputs, non-tensor and keyword arguments; "
                  "warns exactly when no input requires grad")


# ---------------------------------------------------------------- Exercise 2.4
def _hooks_step(checkpoint_hooks: Callable[..., Any], p: float) -> None:
    """One step through checkpoint_hooks(fn, h, s), checked against the plain one."""
    __tracebackhide__ = True
    what = f"checkpoint_hooks(fn, h, s), {dropout_label(p)}"
    want, want_next = plain_step(torch.float32, p)
    net = Net(torch.float32, p)
    calls = Calls(net.fn)
    with _trap("2.4", what, "unpack(i) must return the i-th tensor the rerun saved: rerun fn once on detached "
                            "inputs with grad on, collecting what it saves in order", known=()):
        torch.manual_seed(1)
        loss = loss_of(checkpoint_hooks(calls, net.pre(net.x), net.s), p)
        try:
            loss.backward()
        finally:
            if len(calls.grad_modes) >= 2 and not any(calls.grad_modes[1:]):
                raise CheckFailure("2.4", f"{what}: grad mode while fn was rerun", "on", "off",
                                   "rerun fn under torch.enable_grad(): backward runs with grad mode off, and "
                                   "with it off fn saves nothing for the unpacks to hand back")
        got_next = torch.rand(4)
    if len(calls.grad_modes) != 2:
        raise CheckFailure("2.4", f"{what}: calls of fn in one step", 2, len(calls.grad_modes),
                           "rerun fn once, at the first unpack, and keep what it saves for the later unpacks")
    grad_hint = HOOKS_RNG if p else ("unpack(i) must return the i-th tensor the rerun saved: rerun fn once on "
                                     "detached inputs with grad on, collecting what it saves in order")
    _same_step("2.4", what, (want, want_next), (net.grads(), got_next), grad_hint,
               "replay the RNG for the rerun only (restored_rng): afterwards the generator must "
               "continue where training left it")


def _check_grad_api(checkpoint_hooks: Callable[..., Any]) -> None:
    """torch.autograd.grad(out.sum(), [w1.weight]) reaches a parameter inside fn."""
    __tracebackhide__ = True
    what = "torch.autograd.grad(checkpoint_hooks(fn, h, s).sum(), [w1.weight])"
    net = Net(torch.float32)
    (want,) = torch.autograd.grad(net.fn(net.pre(net.x), net.s).sum(), [net.w1.weight])
    with _trap("2.4", what, "keep the outer graph: run fn itself in forward, under saved_tensors_hooks "
                            "(no autograd.Function), so autograd.grad sees fn's operations", known=()):
        (got,) = torch.autograd.grad(checkpoint_hooks(net.fn, net.pre(net.x), net.s).sum(), [net.w1.weight])
    if not torch.equal(got, want):
        raise CheckFailure("2.4", what, show(want), show(got, want),
                           "keep the outer graph: run fn itself in forward, under saved_tensors_hooks, so "
                           "autograd.grad sees fn's operations")


def _check_memory(checkpoint_hooks: Callable[..., Any]) -> None:
    """After forward no activation of fn is alive but its output (the plain run keeps several)."""
    __tracebackhide__ = True
    what = "bytes of fn's activations alive after checkpoint_hooks(fn, h, s) returned"
    net = Net(torch.float64, P_DROP)
    h = net.pre(net.x)
    plain, _ = kept_after_forward(lambda fn, *a: fn(*a), net, h)
    with _trap("2.4", what, "checkpoint_hooks(fn, *args) runs fn(*args) under saved_tensors_hooks(pack, unpack) "
                            "and returns its output", known=()):
        kept, _ = kept_after_forward(checkpoint_hooks, net, h)
    if kept:
        raise CheckFailure("2.4", what, f"0 B (without checkpointing: {plain} B)", f"{kept} B", HOOKS_PACK)


def ex_2_4(checkpoint_hooks: Callable[..., Any]) -> None:
    """Exercise 2.4: checkpoint_hooks keeps no activation, reruns fn once, and gives exact gradients."""
    __tracebackhide__ = True
    need_callable("2.4", "checkpoint_hooks", checkpoint_hooks)
    with torch.random.fork_rng(devices=[]):
        _check_memory(checkpoint_hooks)  # first: a pack that keeps tensors never needs the rerun
        _hooks_step(checkpoint_hooks, 0.0)
        _hooks_step(checkpoint_hooks, P_DROP)
        _check_grad_api(checkpoint_hooks)
    passed("2.4", "bitwise gradients with dropout, also through torch.autograd.grad; fn ran twice; "
                  "no activation kept after forward")
