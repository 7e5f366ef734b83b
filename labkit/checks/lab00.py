"""Checkers of 00_start_here: one exercise, its hints at the top, one per mistake."""
from __future__ import annotations

from typing import Callable

import torch

from labkit.checks.base import CheckFailure, attempt, passed, remote

COUNT = ("a tensor's bytes depend on how many elements it holds and how many bytes each one takes; torch.Tensor "
         "has a method for each")
VIEW = ("a view shares its base's storage: count the elements of the tensor you are given, not the storage it "
        "shares (which holds the base's elements too)")
INT = "return a Python int (a tensor's numel() and element_size() are ints; keep them so)"


def _cases() -> list[tuple[str, torch.Tensor, str]]:
    """(what, tensor, the hint a wrong answer on it gets)."""
    base = torch.zeros(10, 4)
    return [("a float32 tensor of shape (3, 4)", torch.zeros(3, 4), COUNT),
            ("a bfloat16 tensor of shape (5,)", torch.zeros(5, dtype=torch.bfloat16), COUNT),
            ("a float64 tensor of shape (2, 3, 7)", torch.zeros(2, 3, 7, dtype=torch.float64), COUNT),
            ("a bool tensor of shape (10,)", torch.zeros(10, dtype=torch.bool), COUNT),
            ("an empty float32 tensor of shape (0, 4)", torch.zeros(0, 4), COUNT),
            ("row 2 of a (10, 4) float32 tensor, a view", base[2], VIEW)]


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
    passed("0.1", f"tensor_bytes is right on {len(cases)} tensors of 4 dtypes, a view among them")
