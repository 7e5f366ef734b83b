"""Should this step be checkpointed, and how? A decision helper built from labs 01-05's measurements.

``situation(model, x, budget)`` measures one training step of `model` on `x` (a copy of it, with Adam), then
predicts the peak and the extra step time of each scheme the labs built:

- ``none``: the step as measured (MemoryMeter peak; stopwatch median);
- ``full``: every block checkpointed (lab 02): its saved bytes go, its input stays, and backward rebuilds one
  block at a time; every block's forward runs again;
- ``sqrt_n``: round(sqrt(n)) uniform segments, the last not checkpointed (lab 03, as
  ``torch.utils.checkpoint.checkpoint_sequential``): the checkpointed segments' forwards run again;
- ``selective``: for GPT blocks, core attention recomputed (lab 04): its saved bytes go, its input (the
  fused q|k|v) stays, and its forward runs again.

Bytes are from labkit's ledger (saved tensors per module) and meter; times are medians of the blocks' and the
core's forwards, over the plain step's median. A prediction from those sums misses what a checkpoint holds
beyond them (a few percent), so each predicted scheme is then run for one step (``scheme``, on the copy) and its
peak measured: ``SchemeCost.peak_bytes`` is that measured peak, which a recommendation holds to when run, and
``predicted_bytes`` the prediction beside it. ``decide(situation, rule)`` then applies a rule, lab 06's
Exercise 6.3 (``recommend``: the reference answer in the kit, the student's in a handed-out one, or the one
given), and gives its reasons; ``advise`` does both. The rule itself is never written here.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit.instruments.blocks import block_inputs, blocks_of, wrapped
from labkit.instruments.harness import Scheme, plain
from labkit.instruments.meter import MemoryMeter
from labkit.instruments.tensors import inputs_of
from labkit.planners.measuring import (
    forward_seconds, nbytes, saved_by, saved_under, step_seconds, train_step, working_copy,
)
from labkit.plans.plan import SCHEMES, sqrt_n_segments
from labkit.plans.situation import SchemeCost, Situation, check_budget

__all__ = ["Advice", "Rule", "situation", "decide", "advise", "scheme"]

Rule = Callable[[Situation], "str | None"]  # lab 06's Exercise 6.3: recommend(situation) -> a scheme, or None


@dataclass(frozen=True)
class Advice:
    """A recommendation (a scheme's name, or None: nothing fits), its reasons, and the figures behind it."""

    scheme: str | None
    reasons: tuple[str, ...]
    situation: Situation

    def __str__(self) -> str:
        lines = [str(self.situation), f"recommendation: {self.scheme or 'nothing fits'}"]
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
        return (f"no scheme fits: the lowest peak, measured, is {mib(least[1].peak_bytes)} ({least[0]}), over the "
                f"budget of {mib(s.budget)}",
                f"parameters, gradients and optimizer state take {mib(s.state_bytes)} "
                f"({s.state_bytes / none.peak_bytes:.0%} of the peak) and activations "
                f"{s.activation_share:.1%}: checkpointing can only remove activations; shard or offload the state, "
                "or take a smaller batch")
    chosen = s.schemes[choice]
    others = [n for n, c in s.schemes.items() if n not in ("none", choice) and c.peak_bytes <= s.budget]
    return (f"the plain step's peak, {mib(none.peak_bytes)}, is over the budget of {mib(s.budget)}; activations are "
            f"{s.activation_share:.0%} of it",
            f"{choice} fits (its peak, measured, {mib(chosen.peak_bytes)}) at {chosen.overhead:+.0%} step time "
            "(predicted)" +
            (f", the least of those that fit ({', '.join(others)} cost more)" if others else ", the only one that fits"))


# ---------------------------------------------------------------- the schemes, to run
def _ckpt(f: Callable[..., Any], *args: Any) -> Any:
    return checkpoint(f, *args, use_reentrant=False)


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
        for seg in sqrt_n_segments(len(blocks))[:-1]:  # the last segment runs plainly
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
    with working_copy(model, x) as work:
        return _measure(work, x, budget, training, loss_fn or _mean_square, repeats)


def _mean_square(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def _measure(model: nn.Module, x: torch.Tensor, budget: int, training: bool,
             loss_fn: Callable[[Any], torch.Tensor], repeats: int) -> Situation:
    blocks = blocks_of(model)
    if not training:
        with torch.no_grad(), MemoryMeter(model, x) as meter:
            model(x)
        return Situation(False, budget, nbytes(list(model.parameters())), 0, {"none": SchemeCost(meter.peak, 0.0)})
    opt = torch.optim.Adam(model.parameters())
    step = train_step(model, opt, x, loss_fn)
    step()  # gradients and Adam's state exist from here on, as in every step after the first
    with MemoryMeter(model, opt, x) as meter:
        step()
    state = nbytes(list(model.parameters()), [p.grad for p in model.parameters()], opt.state_dict()["state"])
    t_step = step_seconds(step, x.device, repeats)
    saved, total = saved_by(model, x, loss_fn)
    names = [fqn for fqn, _ in blocks]
    act = [saved_under(saved, fqn) for fqn in names]
    cores = [getattr(getattr(m, "attn", None), "core", None) for _, m in blocks]
    selective = all(isinstance(c, nn.Module) for c in cores)
    ins = block_inputs(model, lambda: model(x), "situation")  # each block h -> h, or refused by name
    core_ins = inputs_of(cores, lambda: model(x)) if selective else []
    in_bytes = [nbytes(a) for a in ins]
    t_fwd = [forward_seconds(m, (a,), repeats) for (_, m), a in zip(blocks, ins)]
    peak, n = meter.peak, len(blocks)
    schemes = {"none": SchemeCost(peak, 0.0),
               "full": SchemeCost(peak - sum(act) + sum(in_bytes) + max(act), sum(t_fwd) / t_step)}
    segments = sqrt_n_segments(n)
    if 1 < len(segments) < n:
        ckpt, last = [i for seg in segments[:-1] for i in seg], list(segments[-1])
        kept = peak - sum(act[i] for i in ckpt) + sum(in_bytes[seg[0]] for seg in segments[:-1])
        rebuilt = max(sum(act[i] for i in seg) for seg in segments[:-1])
        schemes["sqrt_n"] = SchemeCost(max(kept, kept - sum(act[i] for i in last) + rebuilt),
                                       sum(t_fwd[i] for i in ckpt) / t_step)
    if selective:
        core_act = [saved_under(saved, f"{fqn}.attn.core") for fqn in names]
        t_core = [forward_seconds(c, a, repeats) for c, a in zip(cores, core_ins)]
        schemes["selective"] = SchemeCost(peak - sum(core_act) + sum(nbytes(a) for a in core_ins) + max(core_act),
                                          sum(t_core) / t_step)
    run = {name: scheme(name) for name in schemes if name != "none"}
    measured = {"none": peak, **{name: _peak_under(model, opt, x, loss_fn, f) for name, f in run.items()}}
    return Situation(True, budget, state, total, {name: SchemeCost(measured[name], c.overhead, c.peak_bytes)
                                                  for name, c in schemes.items()})


def _peak_under(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor],
                run: Scheme) -> int:
    """The meter's peak of one steady training step (gradients and the optimizer's state made before) with the
    forward run as run(model, x)."""
    step = train_step(functools.partial(run, model), opt, x, loss_fn)
    with MemoryMeter(model, opt, x) as meter:
        step()
    return meter.peak


def decide(s: Situation, rule: Rule | None = None) -> Advice:
    """The advice for situation `s`: the scheme rule(s) names (default lab 06's `recommend`, Exercise 6.3, from
    labkit.labs.pitfalls) and why."""
    if not isinstance(s, Situation):
        raise TypeError(f"decide: s must be a Situation (from situation(...)), got {type(s).__name__}")
    if rule is None:
        from labkit.labs.pitfalls import recommend as rule  # lab 06's rule (the student's, handed out)
    choice = rule(s)
    if choice is not None and choice not in s.schemes:
        raise ValueError(f"decide: the rule returned {choice!r:.60}, not one of the situation's schemes "
                         f"({', '.join(s.schemes)}) or None")
    return Advice(choice, _reasons(s, choice), s)


def advise(model: nn.Module, x: torch.Tensor, budget: int, *, rule: Rule | None = None, **kwargs: Any) -> Advice:
    """Measure (`situation`), decide (`decide`, by `rule`) and say why: see the module's doc."""
    return decide(situation(model, x, budget, **kwargs), rule)
