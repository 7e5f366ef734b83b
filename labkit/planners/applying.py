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

__all__ = ["applied", "measure_step", "largest_batch", "same_arguments"]


@contextlib.contextmanager
def applied(model: nn.Module, plan: Sequence[Step], blocks: Any = None) -> Iterator[None]:
    """While inside, calling `model` runs its blocks (blocks_of(model, blocks)) as the plan says: recompute
    segments under lab 02's checkpoint_hooks, selective under PyTorch's checkpoint with lab 04's policy (core
    attention recomputed), offload under torch.autograd.graph.save_on_cpu; keep plainly. Every block's forward is
    as it was after (labkit.instruments.blocks.patched). A block called with arguments besides its hidden state
    (a mask, rotary tables) gets them again when recomputed; a segment runs all its blocks with its first
    block's, and a later block of it called with others is refused."""
    from labkit.labs.recompute import checkpoint_hooks  # lab 02
    from labkit.labs.sqrt_n import run_layers  # lab 03: one function of a chain's layers

    blocks = [m for _, m in blocks_of(model, blocks)]
    n = len(blocks)
    check_plan(plan, Profile(tuple(BlockCosts(0, 0, 0.0, {SELECTIVE: Option(0, 0, 0.0), OFFLOAD: Option(0, 0, 0.0)})
                                   for _ in range(n)), 0, 0, 1.0))
    forwards = [b.forward for b in blocks]
    ways: list[tuple[nn.Module, Callable[..., Any]]] = []
    for s in plan:
        f, block = forwards[s.start], blocks[s.start]
        if s.how == RECOMPUTE:
            first, rest = _segment(forwards[s.start:s.stop], checkpoint_hooks, run_layers, s.start)
            ways.append((block, first))
            ways += [(blocks[i], rest(i)) for i in range(s.start + 1, s.stop)]  # run by the segment's checkpoint
        elif s.how == SELECTIVE:
            ways.append((block, _selectively(block, f)))
        elif s.how == OFFLOAD:
            ways.append((block, lambda h, *a, f=f, **k: offloaded(lambda x: f(x, *a, **k), h)))
    with patched(ways):
        yield


def _segment(forwards: Sequence[Callable[..., Any]], checkpoint_hooks: Callable[..., Any],
             run_layers: Callable[..., Any], start: int) -> tuple[Callable[..., Any], Callable[[int], Callable]]:
    """A recomputed segment's first block, which runs every block of it under one checkpoint (with its own
    other arguments), and its later blocks, which pass their input through, each checking that it was called
    with the arguments the segment ran it with (never silently other masks)."""
    plain = run_layers(forwards)
    used: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((), {})]

    def first(h: torch.Tensor, *a: Any, **k: Any) -> Any:
        used[0] = (a, k)
        if not a and not k:
            return checkpoint_hooks(plain, h)
        return checkpoint_hooks(run_layers([lambda x, f=f: f(x, *a, **k) for f in forwards]), h)

    def rest(i: int) -> Callable[..., Any]:
        def through(h: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
            if not same_arguments((a, k), used[0]):
                raise ValueError(f"applied: block {i} is called with other arguments than block {start}, which "
                                 f"ran it in its recomputed segment with its own; recompute block {i} in a "
                                 "segment of its own")
            return h
        return through
    return first, rest


def same_arguments(a: Any, b: Any) -> bool:
    """Whether two blocks' other arguments are the same: tensors the very same objects, the rest equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same_arguments(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_arguments(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (an object whose == is not a truth value: only itself is the same)
        return a is b


def _selectively(block: nn.Module, forward: Callable[..., Any]) -> Callable[[torch.Tensor], Any]:
    """block's forward under PyTorch's selective checkpoint with lab 04's policy, traced from this block at the
    first input of each shape, dtype, device, mode and autocast it meets while one `applied` lasts; every forward is held
    to the traced ops (a block changed in between is refused, never run under a policy made for other ops)."""
    policies: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def run(h: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            raise ValueError(f"applied: the selective way runs {type(block).__name__} on its hidden state alone, and "
                             "the model calls it with other arguments too; keep it, or recompute it in a segment")
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
                 loss_fn: Callable[[Any], torch.Tensor], plan: Sequence[Step] | None = None, blocks: Any = None) -> int:
    """Peak bytes on x's device (the meter) of one steady training step of `model` on `x` under `plan` (None:
    plainly): two steps train the model (drawing from the global generator for dropout), the first making the
    gradients and the optimizer's state, the second measured."""
    with applied(model, plan, blocks) if plan is not None else contextlib.nullcontext():
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
    if start > most:  # clamping would report `most` as the answer for every scheme that fits it
        raise ValueError(f"largest_batch: start={start} is above most={most}; raise most to at least start "
                         "(the profile's batch grows with the card)")
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
