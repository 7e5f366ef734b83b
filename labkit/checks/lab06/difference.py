"""Exercise 6.1: compare two tensors, bitwise or by how much."""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch

from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote, trap
from labkit.checks.lab06 import hints as H
from labkit.checks.lab06.oracle import difference
from labkit.instruments.harness import Difference

Case = tuple[str, Any, Any, str]  # (what, a, b, the hint a wrong answer on it gets)
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int8, torch.uint8]
VIEWS = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # a float's bits as an integer dtype of its size


def _cases() -> list[Case]:
    """The public cases, one or more per promise of the spec."""
    f = lambda *v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    nan, big = float("nan"), torch.finfo(torch.float32).max
    half = lambda *v: torch.tensor(v, dtype=torch.float16)  # noqa: E731
    cases = [
        ("equal tensors", f(1.5, -2.0, 3.25), f(1.5, -2.0, 3.25), H.DIFF_EQUAL),
        ("one unit in the last place apart", f(1.0, 2.0), torch.nextafter(f(1.0, 2.0), f(1.0, 3.0)),
         H.DIFF_TOLERANCE),
        ("0.0 against -0.0", f(0.0, 1.0), f(-0.0, 1.0), H.DIFF_BITS),
        ("a baseline of 0.0 against -0.0", f(0.0), f(-0.0), H.DIFF_ZERO),
        ("NaN in the same place of both", f(nan, 1.0), f(nan, 1.0), H.DIFF_BITS),
        ("1.0 against NaN", f(1.0, 2.0), f(nan, 2.0), H.DIFF_NAN),
        ("a NaN baseline against 1.0", f(nan, 2.0), f(1.0, 2.0), H.DIFF_NAN),
        ("a baseline of 1 and 100, one value 1 off", f(1.0, 100.0), f(2.0, 100.0), H.DIFF_REL),
        ("values 0.5 apart", f(3.0, -1.0, 0.25), f(3.0, -1.5, 0.25), H.DIFF_ABS),
        ("an inf in the same place of both, another value 2 apart", f(math.inf, 1.0), f(math.inf, 3.0),
         H.DIFF_ABS),
        ("a zero baseline against a nonzero value", f(0.0, 0.0), f(0.0, 1e-3), H.DIFF_REL),
        ("float16 65504 against -65504", half(65504.0, 1.0), half(-65504.0, 1.0), H.DIFF_WIDE),
        ("float32's largest against its negative", f(big), f(-big), H.DIFF_WIDE),
        ("float32 against float64 of the same values", f(1.0, 2.0), f(1.0, 2.0).double(), H.DIFF_META),
        ("float32 against its own bits viewed as int32", f(1.0, 2.0), f(1.0, 2.0).view(torch.int32), H.DIFF_DTYPE),
        ("a CPU tensor against a meta tensor of its shape and dtype", f(1.0, 2.0), f(1.0, 2.0).to("meta"),
         H.DIFF_DEVICE),
        ("shape (2, 1) against (2,)", f(1.0, 2.0).reshape(2, 1), f(1.0, 2.0), H.DIFF_META),
        ("integers 3 apart", torch.tensor([1, 5]), torch.tensor([1, 8]), H.DIFF_ABS),
        ("int8 integers 3 apart", torch.tensor([1, -5], dtype=torch.int8), torch.tensor([1, -2], dtype=torch.int8),
         H.DIFF_ABS),
        ("booleans, one flipped", torch.tensor([True, False]), torch.tensor([True, True]), H.DIFF_ABS),
        ("a gradient against None", f(1.0), None, H.DIFF_MISSING),
        ("None against None", None, None, H.DIFF_MISSING),
        ("empty tensors", f(), f(), H.DIFF_SPEC),
        ("tensors that require grad", f(1.0, 2.0).requires_grad_(), f(1.0, 2.5).requires_grad_(), H.DIFF_INPUTS)]
    if torch.cuda.is_available():  # the sandbox that grades has no GPU: this one runs in a notebook on one
        cases.append(("a CPU tensor against the same values on CUDA", f(1.0, 2.0), f(1.0, 2.0).cuda(), H.DIFF_DEVICE))
    return cases


def _pair(drawn: random.Random, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A drawn tensor of `dtype`, a copy of it, and a drawn index into both (flat)."""
    shape = tuple(drawn.randint(1, 5) for _ in range(drawn.randint(1, 2)))
    gen = torch.Generator().manual_seed(drawn.randrange(2**31))
    a = (torch.randn(shape, generator=gen) * 10).to(dtype)
    return a, a.clone(), drawn.randrange(a.numel())


def _promised(drawn: random.Random) -> list[Case]:
    """One drawn case per promise of the spec, in the order of the public cases."""
    found: list[Case] = []

    def add(what: str, a: Any, b: Any, hint: str) -> None:
        found.append((f"drawn: {what}", a, b, hint))
    a, b, i = _pair(drawn, drawn.choice(FLOATS + INTS))
    add(f"a {a.dtype} tensor against its copy", a, b, H.DIFF_EQUAL)
    a, b, i = _pair(drawn, drawn.choice(FLOATS[:2]))  # a 16-bit ulp is wide enough for allclose to see it
    b.view(-1)[i] = torch.nextafter(b.view(-1)[i], torch.tensor(math.inf, dtype=b.dtype))
    add(f"a {a.dtype} pair one unit in the last place apart", a, b, H.DIFF_TOLERANCE)
    a, b, i = _pair(drawn, drawn.choice(FLOATS))
    a, b = a.view(-1).repeat(2), b.view(-1).repeat(2)  # a nonzero value beside the zero: max_rel 0
    a[i], b[i] = 0.0, -0.0
    add(f"a {a.dtype} pair, 0.0 against -0.0 among other values", a, b, H.DIFF_BITS)
    zeros = torch.zeros(drawn.randint(1, 6), dtype=drawn.choice(FLOATS))
    signed = zeros.clone()
    signed[drawn.randrange(zeros.numel())] = -0.0
    add(f"a {zeros.dtype} baseline of zeros against one -0.0", zeros, signed, H.DIFF_ZERO)
    a, b, i = _pair(drawn, drawn.choice(FLOATS))
    a.view(-1)[i] = b.view(-1)[i] = math.nan
    add(f"a {a.dtype} pair, NaN in the same place of both", a, b, H.DIFF_BITS)
    a, b, i = _pair(drawn, drawn.choice(FLOATS))
    (b if drawn.random() < 0.5 else a).view(-1)[i] = math.nan
    add(f"a {a.dtype} pair, a NaN against a number", a, b, H.DIFF_NAN)
    a, b, i = _pair(drawn, drawn.choice(FLOATS))
    a, b = a.view(-1).repeat(2), b.view(-1).repeat(2)  # two elements at least: the inf, and one moved
    a[i] = b[i] = math.inf
    b[i + 1] += 3
    add(f"a {a.dtype} pair, an inf in the same place of both", a, b, H.DIFF_ABS)
    zeros = torch.zeros(drawn.randint(1, 6))
    add("a float32 baseline of zeros against a nonzero value", zeros, zeros + drawn.choice([1e-3, -2.0]), H.DIFF_REL)
    dtype = drawn.choice([torch.float32, torch.bfloat16])  # their largest minus their smallest overflows float32
    a, b, i = _pair(drawn, dtype)
    a.view(-1)[i], b.view(-1)[i] = torch.finfo(dtype).max, torch.finfo(dtype).min
    add(f"a {dtype} pair, one element its dtype's largest against its smallest", a, b, H.DIFF_WIDE)
    a, _, _ = _pair(drawn, drawn.choice(FLOATS))
    other = drawn.choice([t for t in FLOATS if t.itemsize != a.element_size()])  # one of a size: the next case
    add(f"a {a.dtype} tensor against its values in {other}", a, a.to(other), H.DIFF_META)
    a, _, _ = _pair(drawn, drawn.choice(FLOATS))
    add(f"a {a.dtype} tensor against its own bits viewed as {VIEWS[a.element_size()]}", a,
        a.clone().view(VIEWS[a.element_size()]), H.DIFF_DTYPE)
    a, b, _ = _pair(drawn, drawn.choice(FLOATS))
    add(f"a {a.dtype} tensor against a meta tensor of its shape and dtype", a, b.to("meta"), H.DIFF_DEVICE)
    a, b, _ = _pair(drawn, drawn.choice(FLOATS))
    add(f"a {a.dtype} tensor against its values flattened", a, b.reshape(-1, 1), H.DIFF_META)
    add("a tensor against None", a, None, H.DIFF_MISSING)
    add("None against None", None, None, H.DIFF_MISSING)
    return found


def _hidden_cases() -> list[Case]:
    """Pairs drawn afresh under `labkit grade`: one per promise (_promised), then four of a drawn dtype and shape
    with one element moved (by an ulp, a sign, a step of 3) or a NaN put in the same place of both."""
    drawn = hidden("6.1")
    if drawn is None:
        return []
    found = _promised(drawn)
    for _ in range(4):
        a, b, i = _pair(drawn, drawn.choice(FLOATS + INTS))
        flat, how = b.view(-1), drawn.choice(["ulp", "sign", "nan", "step", "same"])
        if how == "ulp" and a.dtype.is_floating_point:
            flat[i] = torch.nextafter(flat[i:i + 1], torch.full((1,), float("inf"), dtype=a.dtype))[0]
        elif how == "sign" and a.dtype.is_floating_point:
            flat[i] = -flat[i]
        elif how == "nan" and a.dtype.is_floating_point:  # a NaN in the same place of both: equal bits
            a.view(-1)[i] = flat[i] = float("nan")
        elif how != "same":
            flat[i] += 3
        found.append((f"a drawn {a.dtype} pair of shape {tuple(a.shape)} ({how})", a, b, H.DIFF_SPEC))
    return found


def _same(x: float, y: float) -> bool:
    """x and y agree: both NaN, both the same inf, or close."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def _kept(t: torch.Tensor | None) -> torch.Tensor | None:
    """A copy of an argument, to tell whether the answer changed it (a meta tensor has no data to change)."""
    return None if t is None or t.is_meta else t.detach().clone()


def _value_hint(a: Any, b: Any, field: str, got: float, want: float, hint: str) -> str:
    """The hint for a wrong max_abs or max_rel `got` (`want` right) on a case whose own hint is `hint`: the
    mistake the answer's figure matches, else the field's."""
    if math.isnan(want) and not math.isnan(got):
        return H.DIFF_NAN
    if field == "max_rel" and want == 0 and got == math.inf:
        return H.DIFF_ZERO
    if field == "max_abs" and a.is_floating_point():
        a, b = a.detach(), b.detach()
        differ = a != b
        narrow = [(a.to(t) - b.to(t))[differ].abs().max().item() for t in (a.dtype, torch.float32) if differ.any()]
        if any(_same(got, x) for x in narrow):
            return H.DIFF_WIDE  # the figure the tensors' own dtype (or float32) gives
    if hint in (H.DIFF_WIDE, H.DIFF_NAN, H.DIFF_ZERO):
        return hint
    return H.DIFF_ABS if field == "max_abs" else H.DIFF_REL


def _judge(label: str, a: Any, b: Any, got: Any, want: Difference, hint: str) -> None:
    """Fail unless the answer's Difference `got` for the pair (a, b) agrees with the oracle's `want`."""
    __tracebackhide__ = True
    if not isinstance(got, Difference):
        raise CheckFailure("6.1", label, "a Difference", f"{type(got).__name__} {got!r:.80}", H.DIFF_SPEC)
    if got.name != want.name:
        raise CheckFailure("6.1", f"{label}.name", repr(want.name), repr(got.name), H.DIFF_SPEC)
    if "dtype" in want.detail and a.element_size() == b.element_size():
        hint = H.DIFF_DTYPE  # two dtypes of one size: a wrong answer here took the size for the dtype
    if got.bitwise != want.bitwise:
        raise CheckFailure("6.1", f"{label}.bitwise", want.bitwise, got.bitwise, hint)
    if want.bitwise:
        return
    if bool(got.detail) != bool(want.detail):
        expected = "a detail saying why they cannot be compared" if want.detail else 'detail ""'
        raise CheckFailure("6.1", f"{label}.detail", expected, repr(got.detail), hint)
    for field in ("max_abs", "max_rel"):
        g, w = getattr(got, field), getattr(want, field)
        if not isinstance(g, (int, float)) or isinstance(g, bool):
            raise CheckFailure("6.1", f"{label}.{field}", f"{w:.6g}", f"{g!r:.40}", H.DIFF_SPEC)
        if not _same(float(g), w):
            raise CheckFailure("6.1", f"{label}.{field}", f"{w:.6g}", f"{g!r:.40}",
                               hint if want.detail else _value_hint(a, b, field, float(g), w, hint))


@remote
def ex_6_1(student: Callable[..., Any]) -> None:
    """Exercise 6.1: difference(name, a, b) agrees with the checkers' own comparison (oracle.py) on every case."""
    __tracebackhide__ = True
    need_callable("6.1", "difference", student)
    cases = _cases() + _hidden_cases()
    for i, (what, a, b, hint) in enumerate(cases):
        name = f"case {i}"
        label = f"difference({name!r}, <{what}>)"
        kept = [_kept(t) for t in (a, b)]
        with trap("6.1", label, hint):
            got = student(name, a, b)
        if not all(k is None or difference("", k, t.detach()).bitwise for t, k in zip((a, b), kept)):
            raise CheckFailure("6.1", label, "a and b unchanged", "changed", H.DIFF_INPUTS)
        _judge(label, a, b, got, difference(name, a, b), hint)
    passed("6.1", f"difference agrees with the checker on {len(cases)} cases: signed zeros and NaNs by their bits, "
                  "errors in float64 (NaN against a number), other shapes, dtypes and devices not compared")
