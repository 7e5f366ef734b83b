"""Exercise 6.2: BatchNorm's running statistics updated once per step under recomputation."""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit.checks.base import CheckFailure, need_callable, passed, trap
from labkit.checks.lab06 import hints as H
from labkit.checks.lab06.oracle import difference
from labkit.instruments.harness import Report, compare_step, per_block, plain


class _Net(nn.Module):
    """Two Conv2d + BatchNorm2d blocks and two BatchNorm1d blocks, the last ending in its BatchNorm: every kind the
    patch must find, and a rerun that stops early (non-reentrant: nothing after the BatchNorm needs rebuilding)."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(6)
            self.blocks = nn.ModuleList([
                nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
                nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=0.3), nn.ReLU()),
                nn.Sequential(nn.Flatten(2), nn.BatchNorm1d(4), nn.Tanh()),
                nn.Sequential(nn.Tanh(), nn.BatchNorm1d(4))])  # ends in BatchNorm: a rerun stops inside it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _input() -> torch.Tensor:
    return torch.randn(6, 4, 5, 5, generator=torch.Generator().manual_seed(7))


SCHEMES = {"non-reentrant": lambda f, x: checkpoint(f, x, use_reentrant=False),
           "reentrant": lambda f, x: checkpoint(f, x, use_reentrant=True)}


def _twice(model: nn.Module, scheme) -> nn.Module:
    """`model` after two training steps under `scheme` (its buffers say how often BatchNorm updated)."""
    x = _input().requires_grad_()
    for _ in range(2):
        scheme(model, x).square().mean().backward()
    return model


def _batchnorms(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers()}


def _judge(label: str, report: Report) -> None:
    __tracebackhide__ = True
    if report.error:
        raise CheckFailure("6.2", label, "a step that runs", report.error, H.BN_RERUN)
    bad = report.failures
    if not bad:
        return
    first = bad[0]
    if not first.name.startswith("buffer"):
        raise CheckFailure("6.2", label, f"{first.name} bitwise equal to the plain step's", str(first), H.BN_OUTPUT)
    if any(d.detail.startswith("missing") for d in bad):  # a num_batches_tracked still None after the step
        raise CheckFailure("6.2", label, "every buffer as after a plain step", str(first), H.BN_RESTORE)
    stats = [d for d in bad if "running_" in d.name]
    if stats and all(not d.detail and d.max_rel < 1e-4 for d in stats):
        raise CheckFailure("6.2", label, "every buffer bitwise equal to the plain step's", str(stats[0]),
                           H.BN_MOMENTUM)
    if all(d.name.startswith(("buffer blocks.2.", "buffer blocks.3.")) for d in bad):  # only the BatchNorm1ds
        raise CheckFailure("6.2", label, "every buffer bitwise equal to the plain step's", str(first), H.BN_ALL)
    raise CheckFailure("6.2", label, "every buffer bitwise equal to the plain step's", str(first), H.BN_TWICE)


def ex_6_2(batchnorm_once: Callable[..., Any]) -> None:
    """Exercise 6.2: after batchnorm_once, a checkpointed step leaves every buffer as a plain step does."""
    __tracebackhide__ = True
    need_callable("6.2", "batchnorm_once", batchnorm_once)
    model = _Net()
    with trap("6.2", "batchnorm_once(model)", H.BN_SPEC):
        patched = batchnorm_once(model)
    if patched is not model:
        raise CheckFailure("6.2", "batchnorm_once(model)", "model itself, patched in place",
                           f"{type(patched).__name__} {patched!r:.60}", H.BN_SPEC)
    for (name, bn), before in zip(_batchnorms(model), _batchnorms(_Net())):
        if bn.momentum != before[1].momentum:
            raise CheckFailure("6.2", f"{name}.momentum after batchnorm_once", before[1].momentum, bn.momentum,
                               H.BN_MOMENTUM)
    # a plain step of the patched model updates the statistics as an unpatched one does, step after step
    with trap("6.2", "two plain training steps of the patched model", H.BN_SPEC):
        got = _buffers(_twice(copy.deepcopy(model), plain))
    want = _buffers(_twice(_Net(), plain))
    for name, w in want.items():
        d = difference(f"buffer {name}", w, got.get(name))
        if not d.bitwise:
            hint = H.BN_RESTORE if d.detail == "" and "num_batches" in name and d.max_abs == 1 else H.BN_ALWAYS
            raise CheckFailure("6.2", "after two plain training steps of the patched model",
                               f"{name} as without the patch", str(d), hint)
    reports = {}
    for kind, wrap in SCHEMES.items():
        with trap("6.2", f"a step under the {kind} checkpoint", H.BN_SPEC):
            reports[kind] = compare_step(model, _input(), per_block(wrap), difference=difference)
    frozen = any(d.detail.startswith("missing") for d in reports["non-reentrant"].failures)  # judged below
    if reports["reentrant"].ok and reports["non-reentrant"].failures and not frozen:
        raise CheckFailure("6.2", "a step under the non-reentrant checkpoint, against a plain step",
                           "every buffer bitwise equal", str(reports["non-reentrant"].failures[0]), H.BN_DETECT)
    for kind, report in reports.items():
        _judge(f"a step under the {kind} checkpoint, against a plain step", report)
    # and the rerun's change is undone: two checkpointed steps in a row end where two plain ones do
    for kind, wrap in SCHEMES.items():
        got = _buffers(_twice(copy.deepcopy(model), per_block(wrap)))
        for name, w in want.items():
            d = difference(f"buffer {name}", w, got.get(name))
            if not d.bitwise:
                raise CheckFailure("6.2", f"after two steps under the {kind} checkpoint",
                                   f"{name} as after two plain steps", str(d), H.BN_RESTORE)
    passed("6.2", "every BatchNorm (1d and 2d) updates its statistics once per step, under both of PyTorch's "
                  "checkpoints and without one, step after step")
