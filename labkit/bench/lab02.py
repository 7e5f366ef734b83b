"""Lab 02's benchmark: a from-scratch checkpoint against torch.utils.checkpoint and against none."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from labkit.instruments.meter import MemoryMeter
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.models.layers import dtype_name
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.timing import compare

Checkpoint = Callable[..., torch.Tensor]  # checkpoint(fn, *args) -> output


def _no_checkpoint(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    return fn(*args)


def _torch_checkpoint(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    return torch_checkpoint(fn, *args, use_reentrant=False)


@dataclass
class RecomputeResult:
    """One run of the three-way comparison: no checkpointing, torch.utils.checkpoint, a from-scratch version."""

    cfg: GPTConfig
    meters: dict[str, MemoryMeter]  # variant -> its meter over one forward + backward
    time_ratio_vs_torch: float  # median over pairs of time(scratch) / time(torch)
    time_ratio_vs_none: float  # median over pairs of time(scratch) / time(none)
    grads_bitwise_equal: bool  # scratch's parameter and input gradients == no checkpointing's, bitwise
    peaks: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.peaks = {name: m.peak for name, m in self.meters.items()}

    def figures(self) -> dict[str, Any]:
        """The benchmark's JSON object."""
        return {
            "peak_ratio_vs_torch": round(self.peaks["yours"] / self.peaks["torch"], 4),
            "time_ratio_vs_torch": round(self.time_ratio_vs_torch, 4),
            "peak_ratio_vs_none": round(self.peaks["yours"] / self.peaks["none"], 4),
            "grads_bitwise_equal": self.grads_bitwise_equal,
            "time_ratio_vs_none": round(self.time_ratio_vs_none, 4),
            "peak_bytes": self.peaks,
            "config": {"s": self.cfg.seq, "b": self.cfg.batch, "h": self.cfg.hidden, "a": self.cfg.heads,
                       "n_layers": self.cfg.n_layers, "dtype": dtype_name(self.cfg.dtype),
                       "autocast": dtype_name(self.cfg.autocast)},
        }

    def summary(self) -> str:
        """A few lines for a notebook."""
        f = self.figures()
        amp = "" if self.cfg.autocast is None else f", forwards under {self.cfg.autocast} autocast"
        lines = [f"peak live bytes over one forward + backward ({self.cfg.n_layers} blocks, every block "
                 f"checkpointed{amp}):"]
        lines += [f"  {name:6} {peak:>14,}" for name, peak in self.peaks.items()]
        lines += [f"peak yours / torch: {f['peak_ratio_vs_torch']:.3f}   yours / none: {f['peak_ratio_vs_none']:.3f}",
                  f"time yours / torch: {f['time_ratio_vs_torch']:.3f}   yours / none: {f['time_ratio_vs_none']:.3f}",
                  f"gradients equal to no checkpointing, bitwise: {self.grads_bitwise_equal}"]
        return "\n".join(lines)


def recompute_config(size: Sizes) -> GPTConfig:
    """A stack where activations dominate the step's memory: the profile's GPT sizes, twice the depth, its
    forwards under the profile's autocast (bfloat16 on the gpu profile)."""
    return size.gpt(n_layers=2 * size.gpt_layers, dropout=0.1, autocast=size.amp)


def stack_step(model: GPTStack, x: torch.Tensor, run_block: Callable, backward: bool = True) -> Callable[[], Any]:
    """One training step (no optimizer; or forward only, returning the output) of the stack with every block
    run by run_block(block, y); dropout seeded."""
    def run() -> Any:
        model.zero_grad(set_to_none=True)
        x.grad = None
        torch.manual_seed(0)
        y = x
        for block in model.blocks:
            y = run_block(block, y)
        if not backward:
            return model.ln_f(y)
        model.ln_f(y).square().mean().backward()  # no name holds the output: backward frees it with the graph
        return None
    return run


def _metered(step: Callable[[], Any], model: nn.Module, x: torch.Tensor) -> MemoryMeter:
    """One step under a meter that records every tensor's life (lk.plots.lifetimes draws it)."""
    with MemoryMeter(model, x, lifetimes=True) as meter:
        meter.result = step()
    return meter


def step_meters(checkpoints: dict[str, Checkpoint], size: Sizes | None = None) -> tuple[GPTConfig, dict[str, MemoryMeter]]:
    """The comparison's stack (recompute_config), one metered step under each named checkpoint, after a
    warm-up step: (the stack's config, {name: MemoryMeter})."""
    size = size or sizes()
    cfg = recompute_config(size)
    model = GPTStack(cfg).to(size.device)
    x = gpt_input(cfg, requires_grad=True, device=size.device)
    meters = {}
    for name, ckpt in checkpoints.items():
        stack_step(model, x, ckpt)()
        meters[name] = _metered(stack_step(model, x, ckpt), model, x)
    return cfg, meters


def recompute_comparison(checkpoint: Checkpoint, size: Sizes | None = None) -> RecomputeResult:
    """Peak memory, time and gradients of `checkpoint` (applied to every block) against torch's and none."""
    if not callable(checkpoint):
        raise TypeError(f"recompute_comparison: checkpoint must be callable like checkpoint(fn, *args), "
                        f"got {type(checkpoint).__name__}")
    size = size or sizes()
    cfg = recompute_config(size)
    model = GPTStack(cfg).to(size.device)
    x = gpt_input(cfg, requires_grad=True, device=size.device)

    def step(ckpt: Checkpoint) -> Callable[[], None]:
        return stack_step(model, x, ckpt)

    variants = {"none": _no_checkpoint, "torch": _torch_checkpoint, "yours": checkpoint}
    step(checkpoint)()  # yours first: an unfinished exercise fails at once, before any measurement
    for ckpt in variants.values():  # one warm-up step each
        step(ckpt)()
        if ckpt is _no_checkpoint:  # one set of gradients kept at a time (memory: labkit.env.sizing)
            want = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    got = [p.grad for p in model.parameters()] + [x.grad]  # the last step's: yours
    equal = all(torch.equal(a, b) for a, b in zip(want, got))
    del want, got
    meters = {name: _metered(step(ckpt), model, x) for name, ckpt in variants.items()}
    vs_torch = compare(step(_torch_checkpoint), step(checkpoint), repeats=size.repeats, device=size.device)
    vs_none = compare(step(_no_checkpoint), step(checkpoint), repeats=size.repeats, device=size.device)
    return RecomputeResult(cfg, meters, vs_torch.ratio, vs_none.ratio, equal)


def recompute(size: Sizes | None = None) -> dict[str, Any]:
    """The reference from-scratch checkpoint (labkit.labs.recompute: lab 02's code) against torch's."""
    from labkit.labs.recompute import checkpoint

    return recompute_comparison(checkpoint, size).figures()
