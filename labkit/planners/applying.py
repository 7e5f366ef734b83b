"""Lab 07's plans run for real: a plan applied to a model's blocks, a step's peak measured under it, and the
largest batch that fits.

Recomputed segments run under lab 02's checkpoint_hooks on lab 03's run_layers, selective blocks under lab 04's
policy (labkit.labs: the reference answers in the kit, the student's in a handed-out one).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from labkit.instruments.blocks import blocks_of, patched
from labkit.instruments.meter import MemoryMeter
from labkit.planners.measuring import train_step
from labkit.planners.ways import offloaded, policy_of, selective, traced
from labkit.plans.plan import OFFLOAD, RECOMPUTE, SELECTIVE, BlockCosts, Option, Profile, Step, check_plan

__all__ = ["applied", "measure_step", "largest_batch"]


@contextlib.contextmanager
def applied(model: nn.Module, plan: Sequence[Step]) -> Iterator[None]:
    """While inside, calling `model` runs its blocks as the plan says: recompute segments under lab 02's
    checkpoint_hooks, selective under PyTorch's checkpoint with lab 04's policy (core attention recomputed),
    offload under torch.autograd.graph.save_on_cpu; keep plainly. Every block's forward is as it was after
    (labkit.instruments.blocks.patched)."""
    from labkit.labs.recompute import checkpoint_hooks  # lab 02
    from labkit.labs.sqrt_n import run_layers  # lab 03: one function of a chain's layers

    blocks = [m for _, m in blocks_of(model)]
    n = len(blocks)
    check_plan(plan, Profile(tuple(BlockCosts(0, 0, 0.0, {SELECTIVE: Option(0, 0, 0.0), OFFLOAD: Option(0, 0, 0.0)})
                                   for _ in range(n)), 0, 0, 1.0))
    forwards = [b.forward for b in blocks]
    ways: list[tuple[nn.Module, Callable[..., Any]]] = []
    for s in plan:
        f, block = forwards[s.start], blocks[s.start]
        if s.how == RECOMPUTE:
            run = run_layers(forwards[s.start:s.stop])
            ways.append((block, lambda h, run=run: checkpoint_hooks(run, h)))
            ways += [(blocks[i], lambda h: h) for i in range(s.start + 1, s.stop)]  # run by the segment's checkpoint
        elif s.how == SELECTIVE:
            ways.append((block, _selectively(block, f)))
        elif s.how == OFFLOAD:
            ways.append((block, lambda h, f=f: offloaded(f, h)))
    with patched(ways):
        yield


def _selectively(block: nn.Module, forward: Callable[..., Any]) -> Callable[[torch.Tensor], Any]:
    """block's forward under PyTorch's selective checkpoint with lab 04's policy, traced from this block at the
    first input of each shape, dtype, device, mode and autocast it meets while one `applied` lasts; every forward is held
    to the traced ops (a block changed in between is refused, never run under a policy made for other ops)."""
    policies: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def run(h: torch.Tensor) -> Any:
        kind = h.device.type
        amp = torch.get_autocast_dtype(kind) if torch.amp.is_autocast_available(kind) \
            and torch.is_autocast_enabled(kind) else None
        key = (tuple(h.shape), h.dtype, h.device, block.training, torch.is_grad_enabled(), amp)
        if key not in policies:
            ops = traced(block, h, forward)
            policies[key] = selective(policy_of(ops, block, "applied"), [r.key for r in ops])
        return policies[key](forward, h)
    return run


def measure_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                 loss_fn: Callable[[Any], torch.Tensor], plan: Sequence[Step] | None = None) -> int:
    """Peak bytes on x's device (the meter) of one steady training step of `model` on `x` under `plan` (None:
    plainly): two steps train the model (drawing from the global generator for dropout), the first making the
    gradients and the optimizer's state, the second measured."""
    with applied(model, plan) if plan is not None else contextlib.nullcontext():
        step = train_step(model, opt, x, loss_fn)
        step()
        with MemoryMeter(model, opt, x, device=x.device) as meter:  # the device's bytes: offload moves some out
            step()
    return meter.peak


def largest_batch(fits: Callable[[int], bool], start: int = 1, most: int = 2**16) -> int:
    """The largest batch b in [1, most] with fits(b), 0 if none: from `start`, doubling while it fits, then
    bisection (or bisection below `start` when start does not fit). Fitting is assumed monotone: a larger batch
    never needs less memory."""
    for name, value in (("start", start), ("most", most)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"largest_batch: {name}={value!r} must be an int >= 1")
    start = min(start, most)
    if fits(start):
        low, high = start, None  # fits(low); high: the least batch known not to fit
        while high is None:
            nxt = min(low * 2, most)
            if nxt == low:
                return low
            low, high = (nxt, None) if fits(nxt) else (low, nxt)
    else:
        low, high = 0, start  # 0: nothing known to fit yet
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
