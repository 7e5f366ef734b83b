"""Should this step be checkpointed, and how? A decision helper built from labs 01-05's measurements.

``advise(model, x, budget)`` measures one training step of `model` on `x` (a copy of it, with Adam), then
predicts the peak and the extra step time of each scheme the labs built:

- ``none``: the step as measured (MemoryMeter peak; stopwatch median);
- ``full``: every block checkpointed (lab 02): its saved bytes go, its input stays, and backward rebuilds one
  block at a time; every block's forward runs again;
- ``sqrt_n``: round(sqrt(n)) uniform segments, the last not checkpointed (lab 03, as
  ``torch.utils.checkpoint.checkpoint_sequential``): the checkpointed segments' forwards run again;
- ``selective``: for GPT blocks, core attention recomputed (lab 04): its saved bytes go, its input (the
  fused q|k|v) stays, and its forward runs again.

Bytes are from labkit's ledger (saved tensors per module) and meter; times are medians of the blocks' and the
core's forwards, over the plain step's median. ``recommend`` then picks: no checkpointing when the step
does not train or already fits; else the fitting scheme of least predicted overhead; ``None`` when nothing
fits (the reasons then say what dominates memory).
"""
from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torch.utils.checkpoint import checkpoint

from labkit.instruments.harness import Scheme, blocks_of, plain, wrapped
from labkit.instruments.ledger import Ledger
from labkit.instruments.meter import MemoryMeter
from labkit.instruments.tensors import cuda_devices, inputs_of, tensor_storages
from labkit.instruments.timing import benchmark

__all__ = ["SchemeCost", "Situation", "Advice", "check_budget", "recommend", "situation", "advise", "scheme",
           "SCHEMES"]

SCHEMES = ("none", "full", "sqrt_n", "selective")


@dataclass(frozen=True)
class SchemeCost:
    """A scheme's predicted peak bytes of one training step, and its extra step time over the plain step's."""

    peak_bytes: int
    overhead: float  # 0.3: the step takes 30% longer than without checkpointing


@dataclass(frozen=True)
class Situation:
    """What the decision needs: does the step train, the budget, and each scheme's predicted cost."""

    training: bool
    budget: int  # bytes the step may use
    state_bytes: int  # parameters, gradients and optimizer state: no checkpoint changes them
    activation_bytes: int  # what the plain forward saves for backward
    schemes: dict[str, SchemeCost]  # "none" first, then each scheme that applies to this model

    @property
    def activation_share(self) -> float:
        """Saved activations over the plain step's peak."""
        return self.activation_bytes / self.schemes["none"].peak_bytes


def check_budget(budget: object, who: str = "budget") -> int:
    """`budget` if it is a positive whole number of bytes (an int), else a ValueError naming it."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"{who}: budget={budget!r} ({type(budget).__name__}) must be a positive int of bytes, "
                         "e.g. 2 * 2**30 for 2 GiB")
    return budget


def recommend(s: Situation) -> str | None:
    """The scheme to use: "none" for inference or a step that fits; else the fitting scheme with the least
    predicted overhead (then the lower peak); None when no scheme fits the budget."""
    if not s.training or s.schemes["none"].peak_bytes <= s.budget:
        return "none"
    fits = [(c.overhead, c.peak_bytes, name) for name, c in s.schemes.items()
            if name != "none" and c.peak_bytes <= s.budget]
    return min(fits)[2] if fits else None


@dataclass(frozen=True)
class Advice:
    """A recommendation (a scheme's name, or None: nothing fits), its reasons, and the figures behind it."""

    scheme: str | None
    reasons: tuple[str, ...]
    situation: Situation

    def __str__(self) -> str:
        s = self.situation
        lines = [f"budget {s.budget / 2**20:,.1f} MiB; activations {s.activation_share:.1%} of the plain peak",
                 f"{'scheme':10} {'predicted peak MiB':>18} {'fits':>5} {'overhead':>9}"]
        lines += [f"{name:10} {c.peak_bytes / 2**20:>18,.1f} {'yes' if c.peak_bytes <= s.budget else 'no':>5} "
                  f"{c.overhead:>+9.0%}" for name, c in s.schemes.items()]
        lines.append(f"recommendation: {self.scheme or 'nothing fits'}")
        return "\n".join(lines + [f"  - {r}" for r in self.reasons])


def _reasons(s: Situation, choice: str | None) -> tuple[str, ...]:
    none = s.schemes["none"]
    mib = lambda b: f"{b / 2**20:,.1f} MiB"  # noqa: E731
    if not s.training:
        return ("no backward pass: nothing is saved for it, so there is nothing to drop, and any recomputation "
                "would only cost time",)
    if choice == "none":
        return (f"the step fits: its peak, {mib(none.peak_bytes)}, is within the budget of {mib(s.budget)}; "
                "every recomputed FLOP would be paid in step time",)
    if choice is None:
        least = min(s.schemes.items(), key=lambda kv: kv[1].peak_bytes)
        return (f"no scheme fits: the lowest predicted peak is {mib(least[1].peak_bytes)} ({least[0]}), over the "
                f"budget of {mib(s.budget)}",
                f"parameters, gradients and optimizer state take {mib(s.state_bytes)} "
                f"({s.state_bytes / none.peak_bytes:.0%} of the peak) and activations "
                f"{s.activation_share:.1%}: checkpointing can only remove activations; shard or offload the state, "
                "or take a smaller batch")
    chosen = s.schemes[choice]
    others = [n for n, c in s.schemes.items() if n not in ("none", choice) and c.peak_bytes <= s.budget]
    return (f"the plain step's peak, {mib(none.peak_bytes)}, is over the budget of {mib(s.budget)}; activations are "
            f"{s.activation_share:.0%} of it",
            f"{choice} is predicted to fit ({mib(chosen.peak_bytes)}) at {chosen.overhead:+.0%} step time" +
            (f", the least of those that fit ({', '.join(others)} cost more)" if others else ", the only one that fits"))


# ---------------------------------------------------------------- the schemes, to run
def _ckpt(f: Callable[..., Any], *args: Any) -> Any:
    return checkpoint(f, *args, use_reentrant=False)


def _segments(n: int) -> list[range]:
    """round(sqrt(n)) segments of n // k blocks, the last taking the rest (as checkpoint_sequential)."""
    k = max(1, round(math.sqrt(n)))
    size = n // k
    return [range(i * size, (i + 1) * size if i < k - 1 else n) for i in range(k)]


def _sqrt_n(model: nn.Module, x: torch.Tensor) -> Any:
    blocks = [m for _, m in blocks_of(model)]
    forwards = [m.forward for m in blocks]

    def segment(seg: range) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(h: torch.Tensor) -> torch.Tensor:
            for i in seg:
                h = forwards[i](h)
            return h
        return run

    with contextlib.ExitStack() as stack:
        for seg in _segments(len(blocks))[:-1]:  # the last segment runs plainly
            first, *rest = seg
            stack.enter_context(wrapped([blocks[first]], lambda f, h, run=segment(seg): _ckpt(run, h)))
            stack.enter_context(wrapped([blocks[i] for i in rest], lambda f, h: h))  # run by the segment
        return model(x)


def _selective(model: nn.Module, x: torch.Tensor) -> Any:
    with wrapped([m.attn.core for _, m in blocks_of(model)], _ckpt):
        return model(x)


def _full(model: nn.Module, x: torch.Tensor) -> Any:
    with wrapped([m for _, m in blocks_of(model)], _ckpt):
        return model(x)


def scheme(name: str) -> Scheme:
    """The scheme `name` of SCHEMES as a function scheme(model, x) -> output (PyTorch's non-reentrant
    checkpoint), as `situation` predicts it: to measure a prediction against."""
    found = {"none": plain, "full": _full, "sqrt_n": _sqrt_n, "selective": _selective}.get(name)
    if found is None:
        raise ValueError(f"scheme: {name!r} is not a scheme; choose one of {', '.join(SCHEMES)}")
    return found


# ---------------------------------------------------------------- measuring the situation
def _nbytes(*trees: Any) -> int:
    return sum(st.nbytes() for st in tensor_storages(*trees))


def _median(fn: Callable[[], Any], repeats: int) -> float:
    return benchmark(fn, warmup=1, repeats=repeats).median


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, loss_fn: Callable) -> Callable[[], None]:
    def run() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x)).backward()
        opt.step()
    return run


def _forward_seconds(module: nn.Module, args: tuple[Any, ...], repeats: int) -> float:
    """Median seconds of the module's forward recording a graph, as a recomputation runs it."""
    def run() -> None:
        with torch.enable_grad():
            module(*[a.requires_grad_() if a.is_floating_point() else a for a in (t.detach() for t in args)])
    return _median(run, repeats)


def situation(model: nn.Module, x: torch.Tensor, budget: int, *, training: bool = True,
              loss_fn: Callable[[Any], torch.Tensor] | None = None, repeats: int = 3) -> Situation:
    """Measure a copy of `model` on `x` (Adam, loss_fn(output), default the mean square) and predict each
    scheme's peak and overhead (see the module's doc). `model` and the random generators are left as they were."""
    budget = check_budget(budget, "situation")
    if not isinstance(model, nn.Module):
        raise TypeError(f"situation: model must be an nn.Module, got {type(model).__name__}")
    blocks_of(model)  # a model without blocks is refused before anything runs
    if not isinstance(training, bool):
        raise TypeError(f"situation: training={training!r} must be True or False")
    with torch.random.fork_rng(devices=cuda_devices(x)):  # dropout draws: put back
        return _measure(copy.deepcopy(model), x, budget, training, loss_fn, repeats)


def _measure(model: nn.Module, x: torch.Tensor, budget: int, training: bool,
             loss_fn: Callable[[Any], torch.Tensor] | None, repeats: int) -> Situation:
    for p in model.parameters():
        p.grad = None  # the copy's own step makes them; deepcopy copied the original's
    blocks = blocks_of(model)
    loss_fn = loss_fn or (lambda out: out.float().square().mean())
    if not training:
        with torch.no_grad(), MemoryMeter(model, x) as meter:
            model(x)
        return Situation(False, budget, _nbytes(list(model.parameters())), 0,
                         {"none": SchemeCost(meter.peak, 0.0)})
    opt = torch.optim.Adam(model.parameters())
    step = _step(model, opt, x, loss_fn)
    step()  # gradients and Adam's state exist from here on, as in every step after the first
    with MemoryMeter(model, opt, x) as meter:
        step()
    state = _nbytes(list(model.parameters()), [p.grad for p in model.parameters()], opt.state_dict()["state"])
    t_step = _median(step, repeats)
    with Ledger(model=model) as ledger:
        loss_fn(model(x)).backward()
    opt.zero_grad(set_to_none=False)
    saved = ledger.by_module()
    under = lambda fqn: sum(b for m, b in saved.items() if m == fqn or m.startswith(fqn + "."))  # noqa: E731
    names = [fqn for fqn, _ in blocks]
    act = [under(fqn) for fqn in names]
    cores = [getattr(getattr(m, "attn", None), "core", None) for _, m in blocks]
    selective = all(isinstance(c, nn.Module) for c in cores)
    seen = inputs_of([m for _, m in blocks] + (cores if selective else []), lambda: model(x))
    ins, core_ins = seen[:len(blocks)], seen[len(blocks):]
    in_bytes = [_nbytes(a) for a in ins]
    t_fwd = [_forward_seconds(m, a, repeats) for (_, m), a in zip(blocks, ins)]
    peak, n = meter.peak, len(blocks)
    schemes = {"none": SchemeCost(peak, 0.0),
               "full": SchemeCost(peak - sum(act) + sum(in_bytes) + max(act), sum(t_fwd) / t_step)}
    segments = _segments(n)
    if 1 < len(segments) < n:
        ckpt, last = [i for seg in segments[:-1] for i in seg], list(segments[-1])
        kept = peak - sum(act[i] for i in ckpt) + sum(in_bytes[seg[0]] for seg in segments[:-1])
        rebuilt = max(sum(act[i] for i in seg) for seg in segments[:-1])
        schemes["sqrt_n"] = SchemeCost(max(kept, kept - sum(act[i] for i in last) + rebuilt),
                                       sum(t_fwd[i] for i in ckpt) / t_step)
    if selective:
        core_act = [under(f"{fqn}.attn.core") for fqn in names]
        t_core = [_forward_seconds(c, a, repeats) for c, a in zip(cores, core_ins)]
        schemes["selective"] = SchemeCost(peak - sum(core_act) + sum(_nbytes(a) for a in core_ins) + max(core_act),
                                          sum(t_core) / t_step)
    return Situation(True, budget, state, ledger.total_bytes, schemes)


def advise(model: nn.Module, x: torch.Tensor, budget: int, **kwargs: Any) -> Advice:
    """Measure (`situation`), decide (`recommend`) and say why: see the module's doc."""
    s = situation(model, x, budget, **kwargs)
    choice = recommend(s)
    return Advice(choice, _reasons(s, choice), s)
