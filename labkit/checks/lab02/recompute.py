"""Exercise 2.1: Recompute, the reentrant design as an autograd Function."""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from labkit.checks.base import CheckFailure, passed, student_failure
from labkit.checks.lab02 import hints as H
from labkit.checks.lab02.common import lab_trap, need_function
from labkit.checks.lab02.rig import KINDS, Calls, Net, first_mismatch, loss_of, plain_step, show
from labkit.instruments import saved_tensors


def _grad_hint(name: str, want: dict, got: dict) -> str:
    """Which mistake a wrong gradient points to."""
    inside = [n for n in want if "inside fn" in n]
    if any(got[n] is None for n in inside):
        return H.NO_PARAM_GRADS
    if first_mismatch({n: want[n] for n in inside}, got) is None:
        g, w = got[name], want[name]
        if g is None:
            return H.STOPPED
        if torch.equal(g, 2 * w) or "before" in name:
            return H.DETACH
    return H.EXACT


def _check_forward(calls: Calls, ledger: Any, out: Any, inputs: tuple[torch.Tensor, ...], what: str) -> None:
    """fn ran once with grad mode off, and only the inputs were kept."""
    __tracebackhide__ = True
    if len(calls.grad_modes) != 1:
        raise CheckFailure("2.1", f"{what}: calls of fn in forward", 1, len(calls.grad_modes), H.ONCE_FORWARD)
    if calls.grad_modes[0]:
        raise CheckFailure("2.1", f"{what}: grad mode while forward ran fn", "off", "on", H.NO_GRAD_FORWARD)
    in_bytes = sum(t.untyped_storage().nbytes() for t in inputs)
    kept = _ctx_tensors(out, inputs)
    if ledger.total_bytes > in_bytes or kept:
        got = f"{ledger.total_bytes} B saved" + (f" and {kept} B kept on ctx" if kept else "")
        raise CheckFailure("2.1", f"{what}: bytes kept for backward", f"{in_bytes} B (the inputs)", got,
                           H.SAVE_ONLY_INPUTS)
    if ledger.total_bytes < in_bytes:
        raise CheckFailure("2.1", f"{what}: bytes saved for backward", f"{in_bytes} B (the inputs)",
                           f"{ledger.total_bytes} B", H.SAVE_INPUTS)


def _ctx_tensors(out: Any, inputs: tuple[torch.Tensor, ...]) -> int:
    """Bytes of tensors other than the inputs stored as attributes of ctx (ctx.out = out)."""
    first = next((o for o in tree_leaves(out) if isinstance(o, torch.Tensor)), None)
    ctx = getattr(first, "grad_fn", None)
    ours = {t.untyped_storage().data_ptr() for t in inputs}
    found: dict[int, int] = {}
    for value in getattr(ctx, "__dict__", {}).values():
        for t in tree_leaves(value):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.untyped_storage().data_ptr() not in ours:
                found[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(found.values())


def _recompute_step(Recompute: type, dtype: torch.dtype, kind: str) -> None:
    """One step through Recompute.apply, checked call by call against the plain one."""
    __tracebackhide__ = True
    net = Net(dtype)
    calls = Calls(net.function(kind))
    h = net.pre(net.x)
    shown = {"one": "one output", "two": "two outputs", "mixed": "outputs (tensor, None, 3, int64 tensor)"}[kind]
    what = f"Recompute.apply(fn, h, s), fn with {shown}, {dtype}"
    with lab_trap("2.1", what, H.FORWARD_SPEC):
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
        raise CheckFailure("2.1", f"{what}: grad mode while backward reran fn", "on", "off", H.ENABLE_GRAD)
    if err is not None:  # grad mode was on in the rerun: an output without grad is what autograd refused
        known = (("does not require grad and does not have a grad_fn", H.NON_TENSOR_OUT), *H.KNOWN_ERRORS)
        raise student_failure("2.1", f"{what}: backward", err, H.BACKWARD_SPEC, known)
    if len(calls.grad_modes) != 2:
        raise CheckFailure("2.1", f"{what}: calls of fn in one step", 2, len(calls.grad_modes), H.TWICE)
    want, got = plain_step(dtype, kind=kind)[0], net.grads()
    name = first_mismatch(want, got)
    if name is not None:
        raise CheckFailure("2.1", f"{what}: gradient of {name}", show(want[name]), show(got[name], want[name]),
                           _grad_hint(name, want, got))


def _check_refusals(Recompute: type) -> None:
    """autograd.grad and create_graph=True raise a checkpoint error before fn reruns, and write no .grad."""
    __tracebackhide__ = True
    cases = [("torch.autograd.grad(loss, [x])", lambda loss, net: torch.autograd.grad(loss, [net.x])),
             ("loss.backward(create_graph=True)", lambda loss, net: loss.backward(create_graph=True))]
    for call, run in cases:
        net = Net(torch.float64)
        calls = Calls(net.fn)
        what = f"{call} through Recompute.apply(fn, h, s)"
        with lab_trap("2.1", what, H.FORWARD_SPEC):
            loss = loss_of(Recompute.apply(calls, net.pre(net.x), net.s))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # backward(create_graph=True) warns of a parameter-gradient cycle
                run(loss, net)
        except Exception as e:  # the right answer raises; which error it is, is checked below
            got = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            if "checkpoint" not in str(e) or len(calls.grad_modes) != 1:
                raise CheckFailure("2.1", what, "an error from refuse_unsupported_backward(), before fn reruns",
                                   got, H.REFUSE) from None
        else:
            raise CheckFailure("2.1", what, "an error from refuse_unsupported_backward()", "no error", H.REFUSE)
        written = [n for n, g in net.grads().items() if g is not None]
        if written:
            raise CheckFailure("2.1", f"{what}: .grad written", "none", ", ".join(written), H.REFUSE)


def ex_2_1(Recompute: type) -> None:
    """Exercise 2.1: Recompute saves only fn's inputs and reruns fn in backward; gradients are exact."""
    __tracebackhide__ = True
    need_function("2.1", "Recompute", Recompute)
    with torch.random.fork_rng(devices=[]):
        for dtype in (torch.float32, torch.float64):
            _recompute_step(Recompute, dtype, "one")
        for kind in KINDS[1:]:
            _recompute_step(Recompute, torch.float32, kind)
        _check_refusals(Recompute)
    passed("2.1", "bitwise gradients in float32 and float64, with one, two and non-tensor outputs; fn ran twice; "
                  "only the inputs were saved; .grad() and create_graph refused")
