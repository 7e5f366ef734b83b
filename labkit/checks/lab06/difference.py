"""Exercise 6.1: compare two tensors, bitwise or by how much."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote, trap
from labkit.checks.lab06 import hints as H
from labkit.checks.lab06.oracle import difference
from labkit.instruments.harness import Difference


def _cases() -> list[tuple[str, Any, Any, str]]:
    """(what, a, b, the hint a wrong answer on it gets)."""
    f = lambda *v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    nan = float("nan")
    return [("equal tensors", f(1.5, -2.0, 3.25), f(1.5, -2.0, 3.25), H.DIFF_SPEC),
            ("one unit in the last place apart", f(1.0, 2.0), torch.nextafter(f(1.0, 2.0), f(1.0, 3.0)),
             H.DIFF_TOLERANCE),
            ("0.0 against -0.0", f(0.0, 1.0), f(-0.0, 1.0), H.DIFF_BITS),
            ("NaN in the same place of both", f(nan, 1.0), f(nan, 1.0), H.DIFF_BITS),
            ("a baseline of 1 and 100, one value 1 off", f(1.0, 100.0), f(2.0, 100.0), H.DIFF_REL),
            ("values 0.5 apart", f(3.0, -1.0, 0.25), f(3.0, -1.5, 0.25), H.DIFF_ABS),
            ("an inf in the same place of both, another value 2 apart", f(math.inf, 1.0), f(math.inf, 3.0),
             H.DIFF_ABS),
            ("a zero baseline against a nonzero value", f(0.0, 0.0), f(0.0, 1e-3), H.DIFF_REL),
            ("float32 against float64 of the same values", f(1.0, 2.0), f(1.0, 2.0).double(), H.DIFF_META),
            ("shape (2, 1) against (2,)", f(1.0, 2.0).reshape(2, 1), f(1.0, 2.0), H.DIFF_META),
            ("integers 3 apart", torch.tensor([1, 5]), torch.tensor([1, 8]), H.DIFF_ABS),
            ("a gradient against None", f(1.0), None, H.DIFF_MISSING),
            ("None against None", None, None, H.DIFF_MISSING),
            ("empty tensors", f(), f(), H.DIFF_SPEC),
            ("tensors that require grad", f(1.0, 2.0).requires_grad_(), f(1.0, 2.5).requires_grad_(), H.DIFF_SPEC)]


def _hidden_cases() -> list[tuple[str, Any, Any, str]]:
    """Pairs drawn afresh under `labkit grade`: a dtype, a shape, and one element moved (by an ulp, a sign, a
    step of 3) or a NaN put in the same place of both."""
    drawn = hidden("6.1")
    if drawn is None:
        return []
    found = []
    for _ in range(6):
        dtype = drawn.choice([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32])
        shape = tuple(drawn.randint(1, 5) for _ in range(drawn.randint(1, 2)))
        gen = torch.Generator().manual_seed(drawn.randrange(2**31))
        a = (torch.randn(shape, generator=gen) * 10).to(dtype)
        b = a.clone()
        flat = b.view(-1)
        i = drawn.randrange(flat.numel())
        how = drawn.choice(["ulp", "sign", "nan", "step", "same"])
        if how == "ulp" and dtype.is_floating_point:
            flat[i] = torch.nextafter(flat[i:i + 1], torch.full((1,), float("inf"), dtype=dtype))[0]
        elif how == "sign" and dtype.is_floating_point:
            flat[i] = -flat[i]
        elif how == "nan" and dtype.is_floating_point:  # a NaN in the same place of both: equal bits
            a.view(-1)[i] = flat[i] = float("nan")
        elif how != "same":
            flat[i] += 3
        found.append((f"a drawn {dtype} pair of shape {shape} ({how})", a, b, H.DIFF_SPEC))
    return found


def _same(x: float, y: float) -> bool:
    return (math.isinf(x) and math.isinf(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


@remote
def ex_6_1(student: Callable[..., Any]) -> None:
    """Exercise 6.1: difference(name, a, b) agrees with the checkers' own comparison (oracle.py) on every case."""
    __tracebackhide__ = True
    need_callable("6.1", "difference", student)
    cases = _cases() + _hidden_cases()
    for i, (what, a, b, hint) in enumerate(cases):
        name = f"case {i}"
        label = f"difference({name!r}, <{what}>)"
        kept = [None if t is None else t.detach().clone() for t in (a, b)]
        with trap("6.1", label, H.DIFF_SPEC):
            got = student(name, a, b)
        if not all(difference("", k, None if t is None else t.detach()).bitwise for t, k in zip((a, b), kept)):
            raise CheckFailure("6.1", label, "a and b unchanged", "changed", H.DIFF_INPUTS)
        want = difference(name, a, b)
        if not isinstance(got, Difference):
            raise CheckFailure("6.1", label, "a Difference", f"{type(got).__name__} {got!r:.80}", H.DIFF_SPEC)
        if got.name != name:
            raise CheckFailure("6.1", f"{label}.name", repr(name), repr(got.name), H.DIFF_SPEC)
        if got.bitwise != want.bitwise:
            raise CheckFailure("6.1", f"{label}.bitwise", want.bitwise, got.bitwise, hint)
        if want.bitwise:
            continue
        if bool(got.detail) != bool(want.detail):
            expected = "a detail saying why they cannot be compared" if want.detail else 'detail ""'
            raise CheckFailure("6.1", f"{label}.detail", expected, repr(got.detail), hint)
        for field in ("max_abs", "max_rel"):
            g, w = getattr(got, field), getattr(want, field)
            if not isinstance(g, (int, float)) or isinstance(g, bool) or not _same(float(g), w):
                raise CheckFailure("6.1", f"{label}.{field}", f"{w:.6g}", f"{g!r:.40}",
                                   H.DIFF_SPEC if not isinstance(g, (int, float)) else
                                   hint if want.detail else H.DIFF_ABS if field == "max_abs" else H.DIFF_REL)
    passed("6.1", f"difference agrees with the checker on {len(cases)} cases: signed zeros and NaNs by their bits, "
                  "errors in float64, other shapes and dtypes not compared")
