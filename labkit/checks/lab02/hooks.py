"""Exercise 2.5: checkpoint_hooks, the non-reentrant design with saved-tensor hooks."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from labkit.checks.base import CheckFailure, need_callable, passed
from labkit.checks.lab02 import hints as H
from labkit.checks.lab02.checkpoint import non_tensor_step
from labkit.checks.lab02.common import from_scratch, lab_trap, prerequisites_first, same_step
from labkit.checks.lab02.replay import ex_2_2, ex_2_3
from labkit.checks.lab02.rig import (
    P_DROP, Alive, Calls, Net, amp, dropout_label, kept_after_forward, loss_of, plain_step, recompute_census, show,
)
from labkit.instruments import saved_tensors

EARLIER = (("2.2", ex_2_2, ("stash_rng", "restored_rng", "RecomputeRNG")),
           ("2.3", ex_2_3, ("stash_autocast", "restored_autocast")))


def _hooks_step(checkpoint_hooks: Callable[..., Any], p: float, autocast: bool = False, census: bool = True) -> None:
    """One step through checkpoint_hooks(fn, h, s), checked against the plain one; memory released on the way."""
    __tracebackhide__ = True
    what = f"checkpoint_hooks(fn, h, s), {dropout_label(p)}" + (", forward under autocast" if autocast else "")
    want, want_next = plain_step(torch.float32, p, autocast=autocast)
    net = Net(torch.float32, p)
    calls = Calls(net.fn)
    hint = H.HOOKS_AMP if autocast else H.HOOKS_RNG if p else H.HOOKS_SPEC
    with lab_trap("2.5", what, hint, known=()), recompute_census(net) as held:
        torch.manual_seed(1)
        with amp(autocast):
            loss = loss_of(checkpoint_hooks(calls, net.pre(net.x), net.s), p)
        try:
            loss.backward()
        finally:
            if len(calls.grad_modes) >= 2 and not any(calls.grad_modes[1:]):
                raise CheckFailure("2.5", f"{what}: grad mode while fn was rerun", "on", "off", H.HOOKS_GRAD_MODE)
        got_next = torch.rand(4)
    if len(calls.grad_modes) != 2:
        raise CheckFailure("2.5", f"{what}: calls of fn in one step", 2, len(calls.grad_modes), H.HOOKS_ONCE)
    same_step("2.5", what, (want, want_next), (net.grads(), got_next), hint, H.HOOKS_RNG_AFTER)
    if census and held and held[0]:
        raise CheckFailure("2.5", f"{what}: bytes the recompute still held when backward reached fn's first layer",
                           "0 B (each tensor handed over and forgotten)", f"{held[0]} B", H.HOOKS_RELEASE)


def _check_grad_api(checkpoint_hooks: Callable[..., Any]) -> None:
    """torch.autograd.grad(out.sum(), [w1.weight]) reaches a parameter inside fn."""
    __tracebackhide__ = True
    what = "torch.autograd.grad(checkpoint_hooks(fn, h, s).sum(), [w1.weight])"
    net = Net(torch.float32)
    (want,) = torch.autograd.grad(net.fn(net.pre(net.x), net.s).sum(), [net.w1.weight])
    with lab_trap("2.5", what, H.HOOKS_GRAPH, known=()):
        (got,) = torch.autograd.grad(checkpoint_hooks(net.fn, net.pre(net.x), net.s).sum(), [net.w1.weight])
    if not torch.equal(got, want):
        raise CheckFailure("2.5", what, show(want), show(got, want), H.HOOKS_GRAPH)


def _check_second_backward(checkpoint_hooks: Callable[..., Any]) -> None:
    """A partial autograd.grad (w2 only) with retain_graph, then a full backward: both exact."""
    __tracebackhide__ = True
    what = ("torch.autograd.grad(loss, [w2.weight], retain_graph=True), then loss.backward(), "
            "through checkpoint_hooks(fn, h, s)")
    want, _ = plain_step(torch.float32)
    net = Net(torch.float32)
    with lab_trap("2.5", what, H.HOOKS_PER_TASK, known=()):
        loss = loss_of(checkpoint_hooks(net.fn, net.pre(net.x), net.s))
        torch.autograd.grad(loss, [net.w2.weight], retain_graph=True)
        loss.backward()
    same_step("2.5", what, (want, torch.zeros(0)), (net.grads(), torch.zeros(0)), H.HOOKS_PER_TASK, "")


def _check_inputs_saved(checkpoint_hooks: Callable[..., Any]) -> None:
    """The inputs are autograd saved tensors: the ledger sees them, and an in-place change is refused."""
    __tracebackhide__ = True
    net = Net(torch.float32)
    h = net.pre(net.x)
    what = "the ledger around checkpoint_hooks(fn, h, s)"
    with lab_trap("2.5", what, H.HOOKS_FORWARD, known=()):
        ledger = saved_tensors(checkpoint_hooks, net.fn, h, net.s)
    inputs = h.untyped_storage().nbytes() + net.s.untyped_storage().nbytes()
    if ledger.total_bytes != inputs:
        raise CheckFailure("2.5", f"{what}: bytes saved", f"{inputs} B (h and s, as torch.utils.checkpoint keeps)",
                           f"{ledger.total_bytes} B", H.HOOKS_INPUTS if ledger.total_bytes < inputs else H.HOOKS_PACK)
    what = "h.add_(1) after checkpoint_hooks(fn, h, s), then backward"
    net = Net(torch.float32)
    h = net.pre(net.x)
    with lab_trap("2.5", what, H.HOOKS_FORWARD, known=()):
        loss = loss_of(checkpoint_hooks(net.fn, h, net.s))  # no ledger here: its hooks would skip version checks
    with torch.no_grad():
        h.add_(1)
    try:
        loss.backward()
    except RuntimeError as e:
        if "inplace" in str(e):
            return
        raise CheckFailure("2.5", what, "autograd's error: modified by an inplace operation",
                           f"RuntimeError: {str(e).splitlines()[0][:100]}", H.HOOKS_INPUTS) from None
    raise CheckFailure("2.5", what, "autograd's error: modified by an inplace operation",
                       "no error (gradients recomputed from the changed h)", H.HOOKS_INPUTS)


def _check_frozen_inputs(checkpoint_hooks: Callable[..., Any]) -> None:
    """No input requires grad (a frozen embedding's output), the parameters inside fn do: they get the plain
    step's gradients, which the reentrant design cannot give (its warning sends users to checkpoint_hooks)."""
    __tracebackhide__ = True
    what = "checkpoint_hooks(fn, h, s), h and s requiring no grad (a frozen layer's outputs), fn's weights do"
    net = Net(torch.float32)
    loss_of(net.fn(net.pre(net.x).detach(), net.s.detach())).backward()
    want = net.grads()
    net = Net(torch.float32)
    h, s = net.pre(net.x).detach(), net.s.detach()
    with lab_trap("2.5", what, H.HOOKS_FROZEN, known=()):
        with Alive(torch.float32, h, s, *net.parameters()) as alive:
            out = checkpoint_hooks(net.fn, h, s)
        kept = alive.alive_bytes(out)
        loss_of(out).backward()
    got = net.grads()
    for name in (n for n in want if "inside fn" in n):
        if got[name] is None or not torch.equal(got[name], want[name]):
            raise CheckFailure("2.5", f"{what}: gradient of {name}", show(want[name]), show(got[name], want[name]),
                               H.HOOKS_FROZEN)
    if kept:
        raise CheckFailure("2.5", f"{what}: bytes of fn's activations alive after forward", "0 B", f"{kept} B",
                           H.HOOKS_FROZEN)


def _check_memory(checkpoint_hooks: Callable[..., Any]) -> None:
    """After forward no activation of fn is alive but its output (the plain run keeps several)."""
    __tracebackhide__ = True
    what = "bytes of fn's activations alive after checkpoint_hooks(fn, h, s) returned"
    net = Net(torch.float64, P_DROP)
    h = net.pre(net.x)
    plain, _ = kept_after_forward(lambda fn, *a: fn(*a), net, h)
    with lab_trap("2.5", what, H.HOOKS_FORWARD, known=()):
        kept, _ = kept_after_forward(checkpoint_hooks, net, h)
    if kept:
        raise CheckFailure("2.5", what, f"0 B (without checkpointing: {plain} B)", f"{kept} B", H.HOOKS_PACK)


def ex_2_5(checkpoint_hooks: Callable[..., Any]) -> None:
    """Exercise 2.5: checkpoint_hooks keeps no activation, reruns fn once per backward, and gives exact gradients."""
    __tracebackhide__ = True
    need_callable("2.5", "checkpoint_hooks", checkpoint_hooks)
    with from_scratch("2.5", "what checkpoint_hooks calls"), torch.random.fork_rng(devices=[]), \
            prerequisites_first("2.5", "checkpoint_hooks", checkpoint_hooks, EARLIER):
        _check_memory(checkpoint_hooks)  # first: a pack that keeps tensors never needs the rerun
        _hooks_step(checkpoint_hooks, 0.0, census=False)
        _check_grad_api(checkpoint_hooks)  # before the census: a reentrant design holds its rerun's tensors too
        _hooks_step(checkpoint_hooks, P_DROP)
        _hooks_step(checkpoint_hooks, P_DROP, autocast=True)
        _check_second_backward(checkpoint_hooks)
        non_tensor_step(checkpoint_hooks, "2.5", H.HOOKS_ARGS, "checkpoint_hooks")
        _check_frozen_inputs(checkpoint_hooks)
        _check_inputs_saved(checkpoint_hooks)
    passed("2.5", "bitwise gradients with dropout and under autocast, also through torch.autograd.grad and a second "
                  "backward, with non-tensor and keyword arguments, and with inputs that require no grad; fn ran "
                  "twice; no activation kept after forward, each released as backward used it; inputs saved through "
                  "autograd")
