"""Benchmarks: `python -m labkit bench NAME [--json]`, and the comparisons notebooks show.

Each benchmark prints figures; none asserts. Memory is tensor bytes from the
meter and ledger; time is a median of alternating A/B runs (labkit.timing).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from labkit.ledger import saved_tensors
from labkit.meter import MemoryMeter, measure_peak
from labkit.models import GPTBlock, GPTConfig, GPTStack, gpt_input, korthikanti_bytes
from labkit.profile import Sizes, sizes
from labkit.timing import compare

Checkpoint = Callable[..., torch.Tensor]  # checkpoint(fn, *args) -> output


# ------------------------------------------------------------------ formula
def formula_configs() -> list[GPTConfig]:
    """bfloat16 GPT blocks from MLP-dominated (s/h small) to attention-dominated (s/h large), CPU-sized."""
    shapes = [(32, 4, 512, 8), (128, 2, 256, 4), (256, 2, 128, 4), (512, 1, 64, 4)]  # (s, b, h, a)
    return [GPTConfig(seq=s, batch=b, hidden=h, heads=a, n_layers=1, dtype=torch.bfloat16) for s, b, h, a in shapes]


def formula() -> dict[str, Any]:
    """Ledger total of one bf16 GPT block against Korthikanti et al.'s s·b·h·(34 + 5·a·s/h)."""
    rows = []
    for cfg in formula_configs():
        block = GPTBlock(cfg)
        measured = saved_tensors(block, gpt_input(cfg), model=block).total_bytes
        rows.append({"s": cfg.seq, "b": cfg.batch, "h": cfg.hidden, "a": cfg.heads,
                     "measured_bytes": measured, "formula_bytes": korthikanti_bytes(cfg, act_bytes=2, mask_bytes=1)})
    worst = max(abs(r["measured_bytes"] - r["formula_bytes"]) / r["formula_bytes"] for r in rows)
    return {"configs": rows, "max_rel_error": round(worst, 6)}


# ------------------------------------------------------------------ meter
def meter(size: Sizes | None = None) -> dict[str, Any]:
    """Slowdown of one CPU training step of the GPT stack under the meter (alternating A/B, median ratio)."""
    size = size or sizes()
    cfg = GPTConfig(seq=size.seq, batch=size.batch, hidden=size.hidden, heads=size.heads, n_layers=size.gpt_layers)
    model = GPTStack(cfg)
    opt = torch.optim.Adam(model.parameters())
    x = gpt_input(cfg)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    result = compare(step, lambda: measure_peak(step, track=(model, opt, x)), repeats=size.repeats)
    return {"slowdown": round(result.ratio, 4), "ratios": [round(r, 4) for r in result.ratios]}


# ------------------------------------------------------------------ recompute
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
                       "n_layers": self.cfg.n_layers, "dtype": str(self.cfg.dtype).replace("torch.", "")},
        }

    def summary(self) -> str:
        """A few lines for a notebook."""
        f = self.figures()
        lines = [f"peak live bytes over one forward + backward ({self.cfg.n_layers} blocks, every block checkpointed):"]
        lines += [f"  {name:6} {peak:>14,}" for name, peak in self.peaks.items()]
        lines += [f"peak yours / torch: {f['peak_ratio_vs_torch']:.3f}   yours / none: {f['peak_ratio_vs_none']:.3f}",
                  f"time yours / torch: {f['time_ratio_vs_torch']:.3f}   yours / none: {f['time_ratio_vs_none']:.3f}",
                  f"gradients equal to no checkpointing, bitwise: {self.grads_bitwise_equal}"]
        return "\n".join(lines)


def recompute_config(size: Sizes) -> GPTConfig:
    """A stack where activations dominate the step's memory: the profile's GPT sizes, twice the depth."""
    return GPTConfig(seq=size.seq, batch=size.batch, hidden=size.hidden, heads=size.heads,
                     n_layers=2 * size.gpt_layers, dropout=0.1)


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
        def run() -> None:
            model.zero_grad(set_to_none=True)
            x.grad = None
            torch.manual_seed(0)
            y = x
            for block in model.blocks:
                y = ckpt(block, y)
            model.ln_f(y).square().mean().backward()
        return run

    variants = {"none": _no_checkpoint, "torch": _torch_checkpoint, "yours": checkpoint}
    grads = {}
    for name, ckpt in variants.items():
        step(ckpt)()
        grads[name] = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    equal = all(torch.equal(a, b) for a, b in zip(grads["none"], grads["yours"]))
    meters = {name: measure_peak(step(ckpt), track=(model, x)) for name, ckpt in variants.items()}
    vs_torch = compare(step(_torch_checkpoint), step(checkpoint), repeats=size.repeats, device=size.device)
    vs_none = compare(step(_no_checkpoint), step(checkpoint), repeats=size.repeats, device=size.device)
    return RecomputeResult(cfg, meters, vs_torch.ratio, vs_none.ratio, equal)


def recompute(size: Sizes | None = None) -> dict[str, Any]:
    """The reference from-scratch checkpoint (labkit.reference.recompute, generated from lab 02) against torch's."""
    from labkit.reference.recompute import checkpoint

    return recompute_comparison(checkpoint, size).figures()


# ------------------------------------------------------------------ CLI
BENCHMARKS: dict[str, Callable[[], dict[str, Any]]] = {"formula": formula, "meter": meter, "recompute": recompute}


def main(name: str, as_json: bool = False) -> int:
    """Run benchmark `name`; print one JSON object (--json) or readable lines."""
    if name not in BENCHMARKS:
        print(f"labkit bench: unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    figures = BENCHMARKS[name]()
    if as_json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0
