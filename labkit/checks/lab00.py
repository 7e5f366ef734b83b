"""Checkers of 00_start_here."""
from __future__ import annotations

from typing import Callable

import torch

from labkit.checks.base import CheckFailure, attempt, passed


def ex_0_1(tensor_bytes: Callable[[torch.Tensor], int]) -> None:
    """Exercise 0.1: tensor_bytes(t) returns the bytes of t's elements."""
    __tracebackhide__ = True
    cases = [
        torch.zeros(3, 4),
        torch.zeros(5, dtype=torch.bfloat16),
        torch.zeros(2, 3, 7, dtype=torch.float64),
        torch.zeros(10, dtype=torch.bool),
        torch.zeros(0, 4),
    ]
    for t in cases:
        got = attempt("0.1", tensor_bytes, t)
        want = t.numel() * t.element_size()
        if type(got) is not int or got != want:  # an int: not an object that merely compares equal
            raise CheckFailure("0.1", f"bytes of a {t.dtype} tensor of shape {tuple(t.shape)}", want, got,
                               "a tensor's bytes depend on how many elements it holds and how many bytes each "
                               "one takes; torch.Tensor has a method for each")
    passed("0.1", f"tensor_bytes is right on {len(cases)} tensors of 4 dtypes")
