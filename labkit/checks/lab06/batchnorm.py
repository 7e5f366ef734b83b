"""Exercise 6.2: BatchNorm's running statistics updated once per step under recomputation."""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit.checks.base import CheckFailure, hidden, need_callable, passed, trap
from labkit.checks.lab06 import hints as H
from labkit.checks.lab06.oracle import difference
from labkit.instruments.harness import Report, compare_step, per_block, plain

BatchNorm = nn.modules.batchnorm._BatchNorm
PUBLIC = (0.1, 0.3, 0.1, 0.1, None, 0.1)  # the momenta of _Net's six BatchNorms: one a cumulative average (None)


class _Net(nn.Module):
    """Every kind of BatchNorm the patch must find, and every way a rerun meets one, in seven blocks:
    BatchNorm2d twice, a BatchNorm1d, one that ends its block (a non-reentrant rerun stops inside it, before its
    forward hook), one of momentum `momenta[4]` (None in the public net: a cumulative average), and one module run
    in the last two blocks, ending both (a rerun finds it still frozen by the rerun before it)."""

    def __init__(self, momenta: tuple[float | None, ...] = PUBLIC, seed: int = 6) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            shared = nn.BatchNorm1d(4, momentum=momenta[5])
            self.blocks = nn.ModuleList([
                nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=momenta[0]), nn.ReLU()),
                nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=momenta[1]), nn.ReLU()),
                nn.Sequential(nn.Flatten(2), nn.BatchNorm1d(4, momentum=momenta[2]), nn.Tanh()),
                nn.Sequential(nn.Tanh(), nn.BatchNorm1d(4, momentum=momenta[3])),  # a rerun stops inside it
                nn.Sequential(nn.BatchNorm1d(4, momentum=momenta[4]), nn.Tanh()),
                nn.Sequential(nn.Tanh(), shared),
                nn.Sequential(nn.Tanh(), shared)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


SCHEMES = {"non-reentrant": lambda f, x: checkpoint(f, x, use_reentrant=False),
           "reentrant": lambda f, x: checkpoint(f, x, use_reentrant=True)}


def _twice(model: nn.Module, x: torch.Tensor, scheme) -> nn.Module:
    """`model` after two training steps on `x` under `scheme` (its buffers say how often BatchNorm updated)."""
    x = x.detach().requires_grad_()
    for _ in range(2):
        scheme(model, x).square().mean().backward()
    return model


def _batchnorms(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, BatchNorm)]


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers()}


def _spy(model: nn.Module) -> list[tuple[bool, bool]]:
    """What each BatchNorm is when a rerun calls it, after the answer's own pre-hooks: (training,
    track_running_stats), one pair per call inside backward (the hooks travel with the harness's copies)."""
    seen: list[tuple[bool, bool]] = []

    def look(bn: nn.Module, args: Any) -> None:
        if torch._C._current_graph_task_id() != -1:  # inside backward: a rerun
            seen.append((bn.training, bn.track_running_stats))
    for _, bn in _batchnorms(model):
        bn.register_forward_pre_hook(look)
    return seen


def _kinds(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Buffer-name prefixes of the net's BatchNorm1ds, its cumulative averages and its shared module."""
    named = _batchnorms(model)
    return {"1d": tuple(f"buffer {n}." for n, m in named if isinstance(m, nn.BatchNorm1d)),
            "none": tuple(f"buffer {n}." for n, m in named if m.momentum is None),
            "shared": (f"buffer {named[-1][0]}.",)}


def _judge(label: str, report: Report, kinds: dict[str, tuple[str, ...]]) -> None:
    """Fail, with the hint of the mistake it shows, unless `report` (a checkpointed step against a plain one) is
    bitwise equal throughout."""
    __tracebackhide__ = True
    if report.error:
        raise CheckFailure("6.2", label, "a step that runs", report.error, H.BN_RAISED)
    bad = report.failures
    if not bad:
        return
    first = bad[0]
    if not first.name.startswith("buffer"):
        raise CheckFailure("6.2", label, f"{first.name} bitwise equal to the plain step's", str(first), H.BN_OUTPUT)
    for kind, hint in (("shared", H.BN_SHARED), ("none", H.BN_NONE)):
        if kinds[kind] and all(d.name.startswith(kinds[kind]) for d in bad):
            raise CheckFailure("6.2", label, "every buffer bitwise equal to the plain step's", str(first), hint)
    if any(d.detail.startswith("missing") for d in bad):  # a num_batches_tracked still None after the step
        raise CheckFailure("6.2", label, "every buffer as after a plain step", str(first), H.BN_RESTORE)
    stats = [d for d in bad if "running_" in d.name]
    if stats and all(not d.detail and d.max_rel < 1e-4 for d in stats):
        raise CheckFailure("6.2", label, "every buffer bitwise equal to the plain step's", str(stats[0]),
                           H.BN_MOMENTUM)
    if all(d.name.startswith(kinds["1d"]) for d in bad):  # only the BatchNorm1ds
        raise CheckFailure("6.2", label, "every buffer bitwise equal to the plain step's", str(first), H.BN_ALL)
    raise CheckFailure("6.2", label, "every buffer bitwise equal to the plain step's", str(first), H.BN_TWICE)


def _patched(batchnorm_once: Callable[..., Any], make: Callable[[], _Net], net: str) -> _Net:
    """A net from `make`, patched by the answer, which must return it with every momentum as it was."""
    __tracebackhide__ = True
    model = make()
    with trap("6.2", f"batchnorm_once({net})", H.BN_SPEC):
        patched = batchnorm_once(model)
    if patched is not model:
        raise CheckFailure("6.2", f"batchnorm_once({net})", "model itself, patched in place",
                           f"{type(patched).__name__} {patched!r:.60}", H.BN_SPEC)
    for (name, bn), (_, before) in zip(_batchnorms(model), _batchnorms(make())):
        if bn.momentum != before.momentum:
            raise CheckFailure("6.2", f"{name}.momentum after batchnorm_once", before.momentum, bn.momentum,
                               H.BN_MOMENTUM)
    return model


def _plain_steps(model: _Net, make: Callable[[], _Net], x: torch.Tensor, net: str) -> dict[str, torch.Tensor]:
    """Two plain steps of the patched `model` end where two of an unpatched net do; their buffers."""
    __tracebackhide__ = True
    with trap("6.2", f"two plain training steps of the patched {net}", H.BN_SPEC):
        got = _buffers(_twice(copy.deepcopy(model), x, plain))
    want = _buffers(_twice(make(), x, plain))
    for name, w in want.items():
        d = difference(f"buffer {name}", w, got.get(name))
        if not d.bitwise:
            hint = H.BN_RESTORE if d.detail == "" and "num_batches" in name and d.max_abs == 1 else H.BN_ALWAYS
            raise CheckFailure("6.2", f"after two plain training steps of the patched {net}",
                               f"{name} as without the patch", str(d), hint)
    return want


def _one_step(model: _Net, x: torch.Tensor, net: str) -> None:
    """One checkpointed step of the patched `model` is the plain step, under both checkpoints (by the harness),
    every BatchNorm still training and tracking in the rerun."""
    __tracebackhide__ = True
    seen = _spy(model)
    reports = {}
    for kind, wrap in SCHEMES.items():
        with trap("6.2", f"a step of the {net} under the {kind} checkpoint", H.BN_SPEC):
            reports[kind] = compare_step(model, x, per_block(wrap), difference=difference)
    for i, hint in ((0, H.BN_EVAL), (1, H.BN_RERUN)):  # in a rerun: eval(), then track_running_stats off
        if any(not pair[i] for pair in seen):
            raise CheckFailure("6.2", f"BatchNorm in a rerun of the {net}, under a checkpoint",
                               ("training", "track_running_stats")[i] + " True, as in the forward", False, hint)
    kinds = _kinds(model)
    frozen = any(d.detail.startswith("missing") for d in reports["non-reentrant"].failures)  # judged below
    # right under the reentrant checkpoint but for the module of two blocks (its reruns come in reverse order),
    # wrong under the non-reentrant one elsewhere: the answer tells a rerun by grad mode, off in reentrant forwards
    near = not reports["reentrant"].error and all(d.name.startswith(kinds["shared"])
                                                  for d in reports["reentrant"].failures)
    if near and any(not d.name.startswith(kinds["shared"]) for d in reports["non-reentrant"].failures) \
            and not frozen:
        raise CheckFailure("6.2", f"a step of the {net} under the non-reentrant checkpoint, against a plain step",
                           "every buffer bitwise equal", str(reports["non-reentrant"].failures[0]), H.BN_DETECT)
    for kind, report in reports.items():
        _judge(f"a step of the {net} under the {kind} checkpoint, against a plain step", report, kinds)


def _two_steps(model: _Net, make: Callable[[], _Net], x: torch.Tensor, want: dict[str, torch.Tensor],
               net: str) -> None:
    """The rerun's change is undone: two checkpointed steps in a row end where two plain ones do (`want`), every
    momentum as it was."""
    __tracebackhide__ = True
    for kind, wrap in SCHEMES.items():
        with trap("6.2", f"two steps of the {net} under the {kind} checkpoint", H.BN_SPEC):
            after = _twice(copy.deepcopy(model), x, per_block(wrap))
        for (name, bn), (_, before) in zip(_batchnorms(after), _batchnorms(make())):
            if bn.momentum != before.momentum:
                raise CheckFailure("6.2", f"{name}.momentum after two steps of the {net} under the {kind} checkpoint",
                                   before.momentum, bn.momentum, H.BN_NONE if before.momentum is None else H.BN_RESTORE)
        got = _buffers(after)
        for name, w in want.items():
            d = difference(f"buffer {name}", w, got.get(name))
            if not d.bitwise:
                raise CheckFailure("6.2", f"after two steps of the {net} under the {kind} checkpoint",
                                   f"{name} as after two plain steps", str(d), H.BN_RESTORE)


def _input(seed: int = 7, batch: int = 6) -> torch.Tensor:
    return torch.randn(batch, 4, 5, 5, generator=torch.Generator().manual_seed(seed))


Net = tuple[str, Callable[[], _Net], torch.Tensor]  # (what the labels call it, how to make it, its input)


def _public() -> list[Net]:
    """The net every notebook checks, and its input."""
    return [("net", _Net, _input())]


def _hidden() -> list[Net]:
    """Under `labkit grade`, a net drawn afresh (its momenta, one at least None, its weights) and its input."""
    drawn = hidden("6.2")
    if drawn is None:
        return []
    # None anywhere but in the BatchNorms that end their blocks, where a rerun stops early: what a rerun leaves
    # frozen there is another mistake than a None taken for nothing stashed, and the hints tell them apart so
    momenta = [drawn.choice([0.05, 0.1, 0.3] + [None] * (i not in (3, 5))) for i in range(len(PUBLIC))]
    momenta[drawn.choice([0, 1, 2, 4])] = None
    seed = drawn.randrange(2**31)
    return [("drawn net", lambda: _Net(tuple(momenta), seed), _input(drawn.randrange(2**31), drawn.randint(3, 8)))]


def ex_6_2(batchnorm_once: Callable[..., Any]) -> None:
    """Exercise 6.2: after batchnorm_once, a checkpointed step leaves every buffer as a plain step does."""
    __tracebackhide__ = True
    need_callable("6.2", "batchnorm_once", batchnorm_once)
    for net, make, x in _public() + _hidden():
        model = _patched(batchnorm_once, make, net)
        want = _plain_steps(model, make, x, net)
        _one_step(model, x, net)
        _two_steps(model, make, x, want, net)
    passed("6.2", "every BatchNorm (1d and 2d, momentum=None, one module in two blocks) updates its statistics "
                  "once per step, under both of PyTorch's checkpoints and without one, step after step")
