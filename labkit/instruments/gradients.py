"""One step's gradients judged against a reference step's: bitwise, rounding or wrong (pytorch/pytorch#190758).

A way of running a model (a checkpoint, a plan, torch.compile under an activation memory budget) is trusted only
as far as its gradients are those of a step that ran the same forward and recomputed nothing: its *reference*.
For an eager way that is the plain step from the same seed. For torch.compile it is compile at budget 1 from the
same seed: its decomposed forward draws other dropout masks than eager does (another sample, not an error), so
eager is the wrong reference; below budget 1 the partitioner may put random ops back into the backward graph,
which then draws fresh masks (pytorch/pytorch#190758): gradients of no forward that ran, and no error.

``judge`` runs the way and its reference, one forward and backward each from the same seed, and says

- ``bitwise``: every parameter's gradient has the reference's bits;
- ``rounding``: the largest per-parameter relative difference (``difference``) is within the bound of Rule R;
- ``wrong``: it is more.

Rule R (the rounding bound). The way and its reference run again with dropout off (the model in eval mode, where
the kit's Dropout, torch's and Hugging Face's models draw nothing): no random op can be drawn again there, so what
differs is the order of floating-point operations. The bound is MARGIN times that difference, and at most CEILING;
a way that differs by more than CEILING even with dropout off is wrong. Dropout on runs the same ops on the same
values plus the masks' (a few multiplies), so a tenfold margin covers their rounding, while a mask drawn again
moves a gradient by a share of order one (on lab 07's model, compile below budget 1: 0.97 to 1.0 of a parameter's
gradient). A way bitwise with dropout off has a bound of 0: any difference with dropout on is the random ops'.

The forwards are checked first, on the loss: bitwise equal, or within Rule R's bound for the loss; otherwise the
step is not judged (``NotJudged``, saying why): the gradients of two other forwards say nothing of recomputation.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from labkit.instruments.tensors import cuda_devices

__all__ = ["GRADIENTS", "MARGIN", "CEILING", "Judgement", "NotJudged", "Run", "difference", "one_step", "judge"]

GRADIENTS = ("bitwise", "rounding", "wrong")  # a judgement's verdicts
MARGIN = 10.0  # Rule R: rounding is at most this times the difference the same way shows with dropout off
CEILING = 0.05  # Rule R: a difference over 5% of a parameter's gradient is never rounding (float32 keeps 24 bits,
#                 bfloat16 8: 0.4% per rounding), with dropout off or on

Context = Callable[[], contextlib.AbstractContextManager[Any]]


class NotJudged(ValueError):
    """The gradients cannot be judged: the forwards differ, or the rounding bound could not be measured."""


@dataclass(frozen=True)
class Run:
    """One forward and backward from a seed: the loss and every parameter's gradient (None where it has none)."""

    loss: torch.Tensor
    grads: list[torch.Tensor | None]


@dataclass(frozen=True)
class Judgement:
    """A way's gradients against its reference's (Rule R)."""

    gradients: str  # "bitwise", "rounding" or "wrong"
    difference: float  # the largest per-parameter relative difference (0.0 when bitwise; inf where not comparable)
    bound: float | None = None  # Rule R's bound, measured with dropout off (None when bitwise: not needed)
    why: str = ""  # for "wrong": what the figures were

    def fields(self) -> dict[str, Any]:
        """As a row of `labkit bench plan` carries it: gradients, gradient_difference, and where measured the
        bound and, for a wrong way, why."""
        out: dict[str, Any] = {"gradients": self.gradients, "gradient_difference": _finite(self.difference)}
        if self.bound is not None:
            out["gradient_bound"] = self.bound
        return {**out, "why": self.why} if self.why else out


def _finite(x: float) -> float:
    """JSON has no infinity: a difference that is not comparable is written as the largest float."""
    return x if math.isfinite(x) else float(torch.finfo(torch.float64).max)


def _relative(want: torch.Tensor | None, got: torch.Tensor | None) -> float:
    """max |got - want| over max |want| for one parameter; 0 where both are absent, inf where one is, where the
    shapes differ or where anything is not finite."""
    if want is None or got is None:
        return 0.0 if want is got else math.inf
    if want.shape != got.shape:
        return math.inf
    w, g = want.detach().double(), got.detach().double()
    apart, scale = (g - w).abs().max().item() if w.numel() else 0.0, w.abs().max().item() if w.numel() else 0.0
    if not (math.isfinite(apart) and math.isfinite(scale)):
        return math.inf
    return apart / scale if scale else (0.0 if apart == 0 else math.inf)


def difference(want: list[torch.Tensor | None], got: list[torch.Tensor | None]) -> float:
    """The largest per-parameter relative difference of `got` from `want`: over parameters, max |g - w| / max |w|."""
    if len(want) != len(got):
        return math.inf
    return max((_relative(w, g) for w, g in zip(want, got)), default=0.0)


def _same(a: Run, b: Run) -> bool:
    """Every gradient and the loss with the same bits (both absent counts as the same)."""
    grads = all((x is None and y is None) or (x is not None and y is not None and x.dtype == y.dtype
                                                and torch.equal(x, y)) for x, y in zip(a.grads, b.grads))
    return len(a.grads) == len(b.grads) and grads and torch.equal(a.loss, b.loss)


def one_step(model: nn.Module, x: Any, loss_fn: Callable[[Any], torch.Tensor], context: Context,
             seed: int = 0) -> Run:
    """One forward and backward of `model` on x under context(), from `seed` (dropout draws alike for every way
    run so), the generators left as they were and the gradients cleared after."""
    with torch.random.fork_rng(devices=cuda_devices(x, model)):
        torch.manual_seed(seed)
        model.zero_grad(set_to_none=True)
        with context():
            loss = loss_fn(model(x))
            loss.backward()
    grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return Run(loss.detach().clone(), grads)


@contextlib.contextmanager
def _dropout_off(model: nn.Module) -> Iterator[None]:
    """The model in eval mode (no dropout draws), every module's own mode put back after."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def judge(model: nn.Module, x: Any, loss_fn: Callable[[Any], torch.Tensor], context: Context,
          reference: Context = contextlib.nullcontext, seed: int = 0) -> Judgement:
    """`context`'s one-step gradients against `reference`'s (a step that ran the same forward and recomputed
    nothing: by default the plain step), from the same seed, by Rule R. Raises NotJudged where the forwards
    differ or the bound cannot be measured."""
    want, got = (one_step(model, x, loss_fn, c, seed) for c in (reference, context))
    if _same(want, got):
        return Judgement("bitwise", 0.0)
    try:
        with _dropout_off(model):
            want_off, got_off = (one_step(model, x, loss_fn, c, seed) for c in (reference, context))
    except Exception as e:  # noqa: BLE001 - a way that cannot run in eval mode: no bound, so no verdict
        raise NotJudged(f"its gradients differ from its reference's by {difference(want.grads, got.grads):.3g} and "
                        f"the rounding bound could not be measured with dropout off: {type(e).__name__}: {e}"[:300])
    _forwards_agree(want, got, want_off, got_off)
    apart, off = difference(want.grads, got.grads), difference(want_off.grads, got_off.grads)
    bound = min(MARGIN * off, CEILING)
    if off > CEILING:
        return Judgement("wrong", apart, bound, f"its gradients differ from its reference's by {apart:.3g} of a "
                                                f"parameter's gradient, and by {off:.3g} even with dropout off "
                                                f"(over {CEILING:g}: no rounding)")
    if apart > bound:
        return Judgement("wrong", apart, bound, f"its gradients differ from its reference's by {apart:.3g} of a "
                                                f"parameter's gradient, past the rounding bound {bound:.3g} "
                                                f"({MARGIN:g} x {off:.3g}, the difference with dropout off): random "
                                                "ops drawn again in backward, or an error")
    return Judgement("rounding", apart, bound)


def _forwards_agree(want: Run, got: Run, want_off: Run, got_off: Run) -> None:
    """Raise NotJudged unless the losses are bitwise equal or apart by Rule R's bound at most."""
    if torch.equal(want.loss, got.loss):
        return
    loss, off = (_relative(a.loss, b.loss) for a, b in ((want, got), (want_off, got_off)))
    if off > CEILING or loss > min(MARGIN * off, CEILING):
        raise NotJudged(f"the forwards differ: its loss {got.loss.item():.9g} against its reference's "
                        f"{want.loss.item():.9g} (relative {loss:.3g}; with dropout off {off:.3g}): another forward "
                        "than the reference's, so its gradients cannot be judged against the reference's")
