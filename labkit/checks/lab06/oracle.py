"""The checkers' own comparison of two tensors, written apart from Exercise 6.1's reference so that the checks of
lab 06 do not trust the notebook's copy (nor the student's): it judges 6.1, and compares the steps 6.2 runs.

Not part of the `lk` surface; an answer that reaches into labkit.checks is flagged by `labkit grade`.
"""
from __future__ import annotations

import math

import torch

from labkit.instruments.harness import Difference

_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of its element size: -0.0 and 0.0 differ, a NaN equals its own bits."""
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(_INTS[t.element_size()]) if t.dtype != torch.bool else t.to(torch.uint8)


def difference(name: str, a: torch.Tensor | None, b: torch.Tensor | None) -> Difference:
    """Compare baseline `a` with `b`: bitwise, else the largest absolute and relative error."""
    if a is None or b is None:
        if a is None and b is None:
            return Difference(name, True)
        return Difference(name, False, math.inf, math.inf, f"{'missing in the baseline' if a is None else 'missing'}")
    meta = [f"{what} {x} vs {y}" for what, x, y in (("shape", tuple(a.shape), tuple(b.shape)),
                                                     ("dtype", a.dtype, b.dtype), ("device", a.device, b.device))
            if x != y]
    if meta:
        return Difference(name, False, math.inf, math.inf, "; ".join(meta))
    differ = _bits(a) != _bits(b)
    if a.numel() == 0 or not differ.any():
        return Difference(name, True)
    a64, b64 = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    max_abs = (a64 - b64)[differ.cpu()].abs().max().item()  # only where the bits differ: inf - inf is no error
    scale = a64.abs().max().item()
    # a NaN against a number is a NaN error (never 0: within() must not pass it); a NaN in the baseline, a NaN scale
    max_rel = max_abs / scale if scale != 0 else (0.0 if max_abs == 0 else math.inf)
    return Difference(name, False, max_abs, max_rel)
