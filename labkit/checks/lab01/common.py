"""What lab 01's checkers share: calling student code that returns an int, and picking a mistake's hint."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from labkit.checks.base import CheckFailure, attempt, trap
from labkit.checks.lab01 import hints as H

Mistakes = Sequence[tuple[Any, str]]  # (value a mistake gives, hint for it)


def call_int(ex: str, fn: Callable[..., Any], args: tuple, kwargs: dict | None, call: str) -> int:
    """fn(*args, **kwargs), which must return an int; any exception becomes a CheckFailure."""
    __tracebackhide__ = True
    with trap(ex, f"calling {call}", H.RUN_ALONE.format(call=call)):
        got = attempt(ex, fn, *args, **(kwargs or {}))
    if isinstance(got, bool) or not isinstance(got, int):
        raise CheckFailure(ex, f"the type {call} returns", "int", f"{type(got).__name__} {got!r:.60}",
                           H.INT)
    return got


def pick_hint(got: int, expected: int, mistakes: Mistakes, default: str) -> str:
    """The hint of the first mistake whose value is `got`, else `default`."""
    for value, hint in mistakes:
        if got == value != expected:
            return hint
    return default


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
