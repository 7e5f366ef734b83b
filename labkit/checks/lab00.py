"""Checkers of 00_start_here: one exercise, its hints at the top, one per mistake."""
from __future__ import annotations

from typing import Callable

import torch

from labkit.checks.base import CheckFailure, attempt, hidden, passed, remote

COUNT = ("a tensor's bytes depend on how many elements it holds and how many bytes each one takes; torch.Tensor "
         "has a method for each")
VIEW = ("a view shares its base's storage: count the elements of the tensor you are given, not the storage it "
        "shares (which holds the base's elements too)")
INT = "return a Python int (a tensor's numel() and element_size() are ints; keep them so)"


DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int64, torch.bool)


def _hidden_cases() -> list[tuple[str, torch.Tensor, str]]:
    """Tensors drawn afresh when `labkit grade` asks: shapes, dtypes, and a slice that is a view."""
    rng = hidden("0.1")
    if rng is None:
        return []
    found = []
    for _ in range(4):
        shape = tuple(rng.randint(0, 7) for _ in range(rng.randint(1, 3)))
        dtype = rng.choice(DTYPES)
        t = torch.zeros(shape, dtype=dtype)
        found.append((f"a {dtype} tensor of shape {shape}", t, COUNT))
    base = torch.zeros(rng.randint(3, 9), rng.randint(2, 6), dtype=rng.choice(DTYPES))
    found.append((f"a column of a {tuple(base.shape)} {base.dtype} tensor, a view", base[:, 1], VIEW))
    return found


def _cases() -> list[tuple[str, torch.Tensor, str]]:
    """(what, tensor, the hint a wrong answer on it gets): the public cases, then any hidden ones."""
    base = torch.zeros(10, 4)
    return [("a float32 tensor of shape (3, 4)", torch.zeros(3, 4), COUNT),
            ("a bfloat16 tensor of shape (5,)", torch.zeros(5, dtype=torch.bfloat16), COUNT),
            ("a float64 tensor of shape (2, 3, 7)", torch.zeros(2, 3, 7, dtype=torch.float64), COUNT),
            ("a bool tensor of shape (10,)", torch.zeros(10, dtype=torch.bool), COUNT),
            ("an empty float32 tensor of shape (0, 4)", torch.zeros(0, 4), COUNT),
            ("row 2 of a (10, 4) float32 tensor, a view", base[2], VIEW), *_hidden_cases()]


@remote
def ex_0_1(tensor_bytes: Callable[[torch.Tensor], int]) -> None:
    """Exercise 0.1: tensor_bytes(t) returns the bytes of t's elements."""
    __tracebackhide__ = True
    cases = _cases()
    for what, t, hint in cases:
        got = attempt("0.1", tensor_bytes, t)
        want = t.numel() * t.element_size()
        if isinstance(got, bool) or not isinstance(got, (int, float)) or (got == want and type(got) is not int):
            raise CheckFailure("0.1", f"bytes of {what}", f"the int {want}", f"{type(got).__name__} {got!r:.40}", INT)
        if got != want:
            raise CheckFailure("0.1", f"bytes of {what}", want, got, hint)
    dtypes = len({t.dtype for _, t, _ in cases})
    passed("0.1", f"tensor_bytes is right on {len(cases)} tensors of {dtypes} dtypes, a view among them")
