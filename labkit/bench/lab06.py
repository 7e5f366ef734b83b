"""Lab 06's measurements: short training runs under a scheme, and a step behind a slow input pipeline.

``train_losses`` trains a copy of a model for N steps from one seed and returns each step's loss, so that
two schemes' curves compare bit for bit. ``SlowLoader`` hands out batches that take a fixed time to make
(as decoding and augmenting do), prefetched by a background thread; ``loader_seconds`` times an epoch of
steps fed by it, so the lab can measure how much of a recomputation hides behind the loader.
"""
from __future__ import annotations

import copy
import functools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit.instruments.harness import Scheme, per_block, plain
from labkit.instruments.meter import MemoryMeter
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.tensors import cuda_devices
from labkit.instruments.timing import compare, wall_seconds
from labkit.planners.measuring import train_step, train_steps

__all__ = ["train_losses", "rng_config", "SlowLoader", "loader_seconds", "costs", "pitfalls"]


def rng_config(size: Sizes) -> GPTConfig:
    """The lab's small training stack: the profile's GPT shapes at half the depth and batch, dropout 0.1, its
    forwards under the profile's autocast (bfloat16 on the gpu profile)."""
    return size.gpt(batch=max(1, size.batch // 2), n_layers=max(1, size.gpt_layers // 2), dropout=0.1,
                    autocast=size.amp)


def train_losses(model: nn.Module, x: torch.Tensor, scheme: Scheme, steps: int, lr: float = 1e-3,
                 seed: int = 0) -> list[float]:
    """Train a copy of `model` for `steps` steps of Adam on the mean square of its output for input `x`, each
    forward run by scheme(model, x), from generator seed `seed`; each step's loss. `model` and the global
    generators are left as they were."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"train_losses: steps={steps!r} must be a positive int")
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = None  # deepcopy copies gradients; the first step starts without any
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with torch.random.fork_rng(devices=cuda_devices(x)):
        torch.manual_seed(seed)
        return train_steps(lambda y: scheme(model, y), opt, x, lambda out: out.square().mean(), steps)


class SlowLoader:
    """`batches` copies of `x`, each taking `seconds` to make (a sleep, as a file read or decode waits), made
    ahead by a background thread into a queue of `prefetch` batches, as DataLoader's workers do."""

    def __init__(self, x: torch.Tensor, batches: int, seconds: float, prefetch: int = 2) -> None:
        if not seconds >= 0:
            raise ValueError(f"SlowLoader: seconds={seconds!r} must be >= 0")
        self.x, self.batches, self.seconds, self.prefetch = x, batches, seconds, prefetch

    def __iter__(self) -> Iterator[torch.Tensor]:
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)

        def make() -> None:
            for _ in range(self.batches):
                time.sleep(self.seconds)
                q.put(self.x.clone())
            q.put(None)

        worker = threading.Thread(target=make, daemon=True)
        worker.start()
        while (batch := q.get()) is not None:
            yield batch
        worker.join()


def loader_seconds(step: Callable[[torch.Tensor], Any], loader: SlowLoader) -> float:
    """Seconds to run step(batch) on every batch of `loader`, its thread started afresh, the device's queued
    work included (timing.wall_seconds)."""
    return wall_seconds(lambda: [step(batch) for batch in loader], None, step, loader)


def _step(model: nn.Module, scheme: Scheme) -> Callable[[torch.Tensor], None]:
    def run(x: torch.Tensor) -> None:
        model.zero_grad(set_to_none=True)
        scheme(model, x).square().mean().backward()
    return run


def costs(model: nn.Module, x: torch.Tensor, schemes: dict[str, Scheme], training: bool = True,
          repeats: int = 5) -> dict[str, tuple[int, float]]:
    """{name: (peak bytes, step time over the first scheme's)} of one step of `model` on `x` under each scheme:
    with Adam when training, else a forward under no_grad. Peaks from the meter after a warm-up step; times
    interleaved with the first scheme's (labkit.instruments.timing.compare)."""
    opt = torch.optim.Adam(model.parameters()) if training else None

    def step(scheme: Scheme) -> Callable[[], None]:
        if opt is not None:
            return train_step(functools.partial(scheme, model), opt, x, lambda y: y.float().square().mean())

        def run() -> None:
            with torch.no_grad():
                scheme(model, x)
        return run

    first = step(next(iter(schemes.values())))
    found = {}
    with torch.random.fork_rng(devices=cuda_devices(x)):
        for name, scheme in schemes.items():
            run = step(scheme)
            run()
            with MemoryMeter(model, opt, x) as meter:
                run()
            found[name] = (meter.peak, compare(first, run, repeats=repeats).ratio)
    return found


def pitfalls(size: Sizes | None = None) -> dict[str, Any]:
    """N steps with and without RNG replay against plain training, and the cost of full recomputation in a
    compute-bound step and behind a loader as slow as 1.5 plain steps."""
    size = size or sizes()
    cfg = rng_config(size)
    model, x = GPTStack(cfg).to(size.device), gpt_input(cfg, device=size.device)
    full = per_block(lambda f, x: checkpoint(f, x, use_reentrant=False))
    forgetful = per_block(lambda f, x: checkpoint(f, x, use_reentrant=False, preserve_rng_state=False))
    steps = 10
    base, replay, no_replay = (train_losses(model, x, s, steps) for s in (plain, full, forgetful))
    ratio = compare(lambda: _step(model, plain)(x), lambda: _step(model, full)(x), repeats=size.repeats)
    loader = SlowLoader(x, batches=8, seconds=1.5 * ratio.a.median)
    behind = [loader_seconds(_step(model, s), loader) for s in (plain, full)]
    return {"steps": steps, "replay_bitwise_equal": replay == base, "no_replay_differs": no_replay != base,
            "no_replay_max_loss_diff": max(abs(a - b) for a, b in zip(base, no_replay)),
            "compute_bound_step_ratio": ratio.ratio, "input_bound_epoch_ratio": behind[1] / behind[0],
            "recompute_hidden_share": 1 - (behind[1] - behind[0]) / max(
                (ratio.b.median - ratio.a.median) * loader.batches, math.ulp(1.0))}
