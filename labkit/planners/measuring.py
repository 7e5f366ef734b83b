"""What the advisor and lab 07's profile measure alike: a working copy of the model, its training step, bytes,
forward times and saved bytes per module.

Every time here is taken on the device the tensors live on, with CUDA events there: the device is passed, though
``benchmark`` would find it through the closures (labkit/instruments/devices.py), and the host clock, which
returns before the kernels finish, is never used for GPU work (labkit/instruments/timing.py says why).
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from labkit.instruments.ledger import Ledger
from labkit.instruments.tensors import cuda_devices, tensor_storages
from labkit.instruments.timing import benchmark

__all__ = ["nbytes", "working_copy", "train_step", "train_steps", "step_seconds", "forward_seconds", "saved_under", "saved_by"]

Loss = Callable[[Any], torch.Tensor]


def nbytes(*trees: Any) -> int:
    """Bytes of the distinct storages of every tensor in `trees`."""
    return sum(st.nbytes() for st in tensor_storages(*trees))


@contextlib.contextmanager
def working_copy(model: nn.Module, x: torch.Tensor) -> Iterator[nn.Module]:
    """A deep copy of `model` without gradients, inside torch.random.fork_rng over x's and the model's devices:
    measuring the copy (dropout draws included) leaves `model` and the generators as they were."""
    with torch.random.fork_rng(devices=cuda_devices(x, model)):
        work = copy.deepcopy(model)
        for p in work.parameters():
            p.grad = None  # deepcopy copies gradients: the copy's own step makes them
        yield work


def train_step(model: Callable[[torch.Tensor], Any], opt: torch.optim.Optimizer, x: torch.Tensor,
               loss_fn: Loss) -> Callable[[], None]:
    """One training step of `model` (a module, or any forward of x) on `x`, as a function: zero the gradients,
    forward, loss, backward, step; the kit's one training step (no name holds the loss: backward frees it)."""
    def run() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x)).backward()
        opt.step()
    return run


def train_steps(model: Callable[[torch.Tensor], Any], opt: torch.optim.Optimizer, x: torch.Tensor, loss_fn: Loss,
                steps: int) -> list[float]:
    """`steps` training steps as train_step takes them, and each one's loss: a curve to compare, not a step to
    measure (here a name holds each loss until backward has run, and its value is read after the step)."""
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def step_seconds(step: Callable[[], None], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of `step` on `device`."""
    return benchmark(step, warmup=warmup, repeats=repeats, device=device).median


def forward_seconds(module: nn.Module, args: Sequence[Any], repeats: int) -> float:
    """Median seconds of the module's forward on `args` recording a graph, as a recomputation runs it."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))

    def run() -> None:
        with torch.enable_grad():
            module(*[a.detach().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                     for a in args])
    return benchmark(run, warmup=1, repeats=repeats, device=device).median


def saved_by(model: nn.Module, x: torch.Tensor, loss_fn: Loss) -> tuple[dict[str, int], int]:
    """(bytes autograd saves per module, in all) over one forward and backward of `model` on `x` (the ledger);
    the gradients that backward makes are dropped after."""
    with Ledger(model=model) as ledger:
        loss_fn(model(x)).backward()
    model.zero_grad(set_to_none=True)
    return ledger.by_module(), ledger.total_bytes


def saved_under(saved: Mapping[str, int], fqn: str) -> int:
    """Saved bytes of module `fqn` and everything inside it, from `saved_by`'s per-module bytes."""
    return sum(b for m, b in saved.items() if m == fqn or m.startswith(fqn + "."))
