"""Exercise 1.5: a saved-tensor hook that counts what autograd keeps, leak-free."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from labkit.checks.base import CheckFailure, passed
from labkit.checks.lab01 import hints as H
from labkit.checks.lab01.common import call_int, pick_hint
from labkit.instruments import saved_tensors
from labkit.models import GPTBlock, GPTConfig, MLPChain, MLPConfig, gpt_input, mlp_input


def _pack_variants(fn: Callable[..., Any], args: tuple) -> dict[str, int]:
    """Totals that some mistaken hooks would return for fn(*args), keyed by mistake."""
    packs: list[tuple[bool, bool, int, int, int, int, bool]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        base = t if t._base is None else t._base
        packs.append((isinstance(t, nn.Parameter), isinstance(t._base, nn.Parameter),
                      st.data_ptr(), st.nbytes(), t.data_ptr(), t.numel() * t.element_size(),
                      base.is_leaf and base.requires_grad))
        return t.detach()

    with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)

    def total(skip: Callable[[bool, bool, bool], bool], key: int | None, size: int) -> int:
        """Bytes of packs not skipped, deduplicated on field `key` (None: not at all), sized by field `size`."""
        seen: set[int] = set()
        out = 0
        for rec in packs:
            if skip(rec[0], rec[1], rec[6]) or (key is not None and rec[key] in seen):
                continue
            if key is not None:
                seen.add(rec[key])
            out += rec[size]
        return out

    param_or_view = lambda param, view, leaf: param or view  # noqa: E731
    return {
        "no_dedupe": total(param_or_view, None, 3),
        "no_dedupe_elements": total(param_or_view, None, 5),
        "params": total(lambda param, view, leaf: False, 2, 3),
        "param_views": total(lambda param, view, leaf: param, 2, 3),
        "leaves": total(lambda param, view, leaf: leaf, 2, 3),
        "elements": total(param_or_view, 4, 5),
        "elements_per_storage": total(param_or_view, 2, 5),
    }


def _hook_cases() -> list[tuple[str, Callable[[], tuple[nn.Module | None, Callable[..., Any], tuple]]]]:
    """(description, builder) pairs; a builder returns fresh (model or None, fn, args) each call."""
    def mlp():
        model = MLPChain(MLPConfig(3, 8))
        return model, model, (mlp_input(model.cfg, 4),)

    def shifted():
        x = torch.arange(15.0).reshape(5, 3).requires_grad_()
        return None, lambda x: (x[1:] * x[:-1]).sum(), (x,)

    def param_arg():
        x = torch.linspace(-1, 1, 15).reshape(5, 3).clone().requires_grad_()  # a leaf, not a view
        w = nn.Parameter(torch.linspace(-1, 1, 12).reshape(3, 4))
        return None, lambda x, w: torch.tanh(x @ w), (x, w)

    def block():
        cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dtype=torch.bfloat16)
        model = GPTBlock(cfg)
        return model, model, (gpt_input(cfg),)

    return [("an MLPChain (3 layers, width 8)", mlp), ("x[1:] * x[:-1] (two views of x)", shifted),
            ("tanh(x @ w) with w an nn.Parameter", param_arg), ("a bfloat16 GPTBlock", block)]


def _check_backward(saved_bytes: Callable[..., int], build: Callable[[], tuple], what: str) -> None:
    """Backward through a graph recorded under the student's hooks must give the same gradients."""
    __tracebackhide__ = True
    _, fn, args = build()
    outputs: list[Any] = []
    call_int("1.5", saved_bytes, (lambda *a: outputs.append(fn(*a)) or outputs[-1], *args), None,
              f"saved_bytes(<{what}>, ...)")
    if not outputs:
        raise CheckFailure("1.5", f"saved_bytes on {what}", "fn(*args) called once", "fn never called",
                           H.HOOK_CALL)
    try:
        outputs[-1].float().sum().backward()
    except Exception as e:
        raise CheckFailure("1.5", f"backward through {what} run under your hooks", "gradients",
                           f"{type(e).__name__}: {e}", H.HOOK_RETURN) from None
    _, ref_fn, ref_args = build()
    ref_fn(*ref_args).float().sum().backward()
    leaves = lambda f, a: [*(f.parameters() if isinstance(f, nn.Module) else ()), *a]  # noqa: E731
    for got, want in zip(leaves(fn, args), leaves(ref_fn, ref_args)):
        if want.grad is not None and (got.grad is None or not torch.equal(got.grad, want.grad)):
            raise CheckFailure("1.5", f"gradients of {what} run under your hooks", "the same as without hooks",
                               "different gradients", H.HOOK_RETURN)


def _check_no_cycle(saved_bytes: Callable[..., int]) -> None:
    """Once saved_bytes has returned, nothing may keep fn's output alive: no reference cycle through the graph."""
    __tracebackhide__ = True
    model = MLPChain(MLPConfig(3, 8))
    x = mlp_input(model.cfg, 4)
    refs: list[weakref.ref] = []

    def fn(t: torch.Tensor) -> torch.Tensor:
        out = model(t)  # ends in a ReLU, which saves its own output
        refs.append(weakref.ref(out.untyped_storage()))
        return out

    call_int("1.5", saved_bytes, (fn, x), None, "saved_bytes(<an MLPChain>, x)")
    gc.collect()
    if refs and refs[0]() is not None:
        raise CheckFailure("1.5", "fn's output once saved_bytes(fn, x) has returned and nothing refers to it",
                           "freed", "still alive",
                           H.HOOK_CYCLE)


def ex_1_5(saved_bytes: Callable[..., int]) -> None:
    """Exercise 1.5: saved_bytes(fn, *args) totals distinct saved storages, Parameters left out, like the ledger."""
    __tracebackhide__ = True
    cases = _hook_cases()
    with torch.random.fork_rng(devices=[]):  # GPTBlock's dropout draws from the global RNG
        # backward first: a pack that drops its tensor also lets storages be freed and reused, which spoils the count
        _check_backward(saved_bytes, cases[0][1], cases[0][0])
        for what, build in cases:
            _check_saved_bytes(saved_bytes, build, what)
        _check_no_cycle(saved_bytes)
    passed("1.5", f"saved_bytes matches labkit's ledger on {len(cases)} functions, backward still works, and "
                  "nothing outlives the measurement")


def _check_saved_bytes(saved_bytes: Callable[..., int], build: Callable[[], tuple], what: str) -> None:
    """saved_bytes on one case against the ledger; on a mismatch, the hint of the mistake it matches."""
    __tracebackhide__ = True
    _, fn, args = build()
    expected = saved_tensors(fn, *args).total_bytes
    _, fn, args = build()
    got = call_int("1.5", saved_bytes, (fn, *args), None, f"saved_bytes(<{what}>, ...)")
    if got == expected:
        return
    _, fn, args = build()
    v = _pack_variants(fn, args)
    mistakes = [
        (0, H.HOOK_NOT_INSTALLED),
        (v["no_dedupe"], H.HOOK_DEDUPE),
        (v["no_dedupe_elements"], H.HOOK_DEDUPE),
        (v["param_views"], H.HOOK_PARAMS),
        (v["leaves"], H.HOOK_LEAVES),
        (v["params"], H.HOOK_PARAMS),
        (v["elements"], H.HOOK_STORAGE),
        (v["elements_per_storage"], H.HOOK_STORAGE),
    ]
    raise CheckFailure("1.5", f"saved bytes of {what}, against labkit's ledger", expected, got,
                       pick_hint(got, expected, mistakes, H.HOOK_DEFAULT))
