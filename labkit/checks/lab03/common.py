"""What lab 03's checkers share: small chains whose layers tell segments apart, and calling student code."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from labkit.checks.base import CheckFailure, Known, expect_error, trap  # noqa: F401  (expect_error: re-exported)


class Counted(nn.Module):
    """A layer that counts its forward calls."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.layer(x)


def widening_chain(n: int, dtype: torch.dtype = torch.float64) -> tuple[list[Counted], torch.Tensor]:
    """n counted Linear+Tanh layers whose widths 2, 3, 4, ... differ, so each layer's input has its own size
    (the ledger then says which inputs a schedule keeps), and an input that requires grad."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layers = [Counted(nn.Sequential(nn.Linear(2 + i, 3 + i, dtype=dtype), nn.Tanh())) for i in range(n)]
        x = torch.randn(3, 2, dtype=dtype, requires_grad=True)
    return layers, x


def plain_grads(layers: list[Counted], x: torch.Tensor) -> list[torch.Tensor]:
    """Gradients of a weighted sum of the chain's output, plainly; every .grad is cleared first and after."""
    clear(layers, x)
    h = x
    for layer in layers:
        h = layer(h)
    weighted(h).backward()
    out = grads(layers, x)
    clear(layers, x)
    return out


def weighted(out: torch.Tensor) -> torch.Tensor:
    return (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum()


def grads(layers: list[Counted], x: torch.Tensor) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else None for layer in layers for p in layer.parameters()] + \
           [x.grad.clone() if x.grad is not None else None]


def clear(layers: list[Counted], x: torch.Tensor) -> None:
    for layer in layers:
        layer.calls = 0
        layer.zero_grad(set_to_none=True)
    x.grad = None


def same(want: list, got: list) -> bool:
    return all(w is not None and g is not None and torch.equal(w, g) for w, g in zip(want, got))


def call(ex: str, what: str, hint: str, fn: Callable[..., Any], *args: Any, known: Known = ()) -> Any:
    """fn(*args); any exception of student code becomes a CheckFailure (a stub: NotAttempted)."""
    __tracebackhide__ = True
    with trap(ex, what, hint, known):
        return fn(*args)
