"""PyTorch's own planner for lab 07's question, run on the same model: torch.distributed._tools.sac_ilp.

Its pipeline, as PyTorch's tests run it (test/distributed/_tools/test_sac_ilp.py): ``MemTracker`` measures each
module's memory over a training step, ``RuntimeEstimator`` and ``SACEstimator`` each module's and each op's
runtime (on a copy of the model made of fake tensors), ``aggregate_stats`` and ``parse_module_info`` gather them
into a graph of modules, and ``sac_milp`` (an integer program, PuLP) picks which modules to checkpoint and what
fraction of each one's activation memory to discard under a budget in GiB; then, per module,
``get_optimal_checkpointing_policy_per_module`` picks which ops to save for that fraction, and the module runs
under PyTorch's selective checkpoint with that choice.

On CUDA every figure is PyTorch's own ("operator-level-benchmark": each op run and timed with CUDA events). Its
estimators time ops only with CUDA events (the roofline mode needs a CUDA device too), so on a CPU the kit fills
the one field they cannot: each op's runtime, timed by the kit's stopwatch on real tensors of the op's shapes,
as PyTorch's benchmark mode does on CUDA (``_cpu_estimate``). Memory, module order, what autograd saves, the
trade-off curves and the integer program are PyTorch's, unchanged. An op the stopwatch cannot run (on data it
cannot make up) stops the pipeline, named: sac_milp is never fed a runtime of 0 for it.

Two differences from lab 07's planner, by design of each: sac_milp's peak leaves out the optimizer's state
(torch/distributed/_tools/ilp_utils.py, get_peak_memory_runtime_baseline: "Memory does not include e.g.,
optimizer states, embedding tables, etc."), so its budget is not the meter's; and it decides per module and a
discard fraction, where lab 07 decides per block and a way.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from labkit.instruments.blocks import blocks_of, patched
from labkit.instruments.timing import benchmark
from labkit.planners.measuring import working_copy

__all__ = ["TorchStats", "torch_stats", "sac_decisions", "SacApplied"]


@dataclass
class TorchStats:
    """What sac_milp plans from: PyTorch's graph of modules (ilp_utils.Graph), each non-leaf module's SACStats
    (per op: name, runtime in ms, bytes, random, view, in-place), the candidates (the model's blocks and the
    modules inside them, as ModTracker names them)."""

    graph: Any
    sac_stats: Mapping[str, Any]
    units: list[str]
    baseline_bytes: int  # PyTorch's predicted peak without checkpointing (parameters, gradients, activations)


def torch_stats(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor],
                blocks: Any = None) -> TorchStats:
    """Run PyTorch's estimators on copies of `model` training on `x` with Adam (the model and the generators
    are left as they were) and gather what sac_milp needs; its candidates are the blocks (blocks_of(model,
    blocks)) and the modules inside them."""
    from torch.distributed._tools.ilp_utils import aggregate_stats, get_peak_memory_runtime_baseline, parse_module_info

    with working_copy(model, x) as work:
        opt = torch.optim.Adam(work.parameters())
        tracker = _memory(work, opt, x, loss_fn)
        runtime, sac, untimed = _estimators(work, x, loss_fn)
        if untimed:  # priced at 0 they would look free to recompute: sac_milp is not fed a guess
            raise ValueError(f"torch_stats: the stopwatch could not run {len(untimed)} op(s) on real tensors of their "
                             f"shapes ({', '.join(sorted(untimed)[:4])}); their runtimes are unknown, so sac_milp "
                             "is not run on this model here")
        info = aggregate_stats(work, tracker, runtime, sac, x.device)
    graph = parse_module_info(info)
    prefix = type(model).__name__
    found = [f"{prefix}.{fqn}" for fqn, _ in blocks_of(model, blocks)]
    units = [n["fqn"] for n in graph.nodes if not n["is_leaf"] and any(
        n["fqn"] == b or n["fqn"].startswith(b + ".") for b in found)]
    return TorchStats(graph, dict(sac.sac_mod_stats), units, get_peak_memory_runtime_baseline(graph)[0])


def _memory(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, loss_fn: Callable) -> Any:
    """MemTracker over the second of two steps (the first makes Adam's state), as PyTorch's test runs it."""
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker as mt:
        for i in range(2):
            loss_fn(model(x)).backward()
            if i == 1:
                last = mt.get_tracker_snapshot("current")
            opt.step()
            opt.zero_grad()
            if i == 0:
                mt.reset_mod_stats()
    # as the test does for POST_BW: a module with no backward (its inputs and outputs need no gradient, as a
    # Llama's rotary embedding) gets the step's last snapshot for the backward states it never reached
    for stats in tracker.memory_tracking.values():
        for state in (_ModState.PRE_BW, _ModState.PEAK_BW, _ModState.POST_BW):
            if state not in stats.snapshots:
                stats.snapshots.setdefault(state, []).append(copy.deepcopy(last))
    return tracker


def _estimators(model: nn.Module, x: torch.Tensor, loss_fn: Callable) -> tuple[Any, Any, set[str]]:
    """RuntimeEstimator over a forward and backward, and SACEstimator over a forward, of a fake copy of `model`
    (same module names), each op timed by PyTorch's benchmark mode on CUDA, by _cpu_estimate on a CPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator
    from torch.distributed._tools.sac_estimator import SACEstimator

    mode = FakeTensorMode(allow_non_fake_inputs=True)  # the loss may hold real tensors (the targets)
    fake = _fake_copy(model, mode)
    untimed: set[str] = set()
    estimate = None if x.is_cuda else (lambda f, a, k: _cpu_estimate(f, a, k, untimed))
    runtime, sac = RuntimeEstimator()("operator-level-benchmark"), SACEstimator()("operator-level-benchmark")
    if estimate is not None:
        runtime._estimate, sac._estimate_runtime = estimate, estimate
    with mode, contextlib.redirect_stdout(io.StringIO()):  # RuntimeEstimator prints its total on exit
        fx = mode.from_tensor(x)
        with runtime:
            loss_fn(fake(fx)).backward()
        with sac:
            loss = loss_fn(fake(fx))
        loss.backward()
    return runtime, sac, untimed


def _fake_copy(model: nn.Module, mode: Any) -> nn.Module:
    """A copy of `model` whose parameters and buffers are fake tensors of `mode` (same names, shapes, dtypes and
    devices): what PyTorch's estimators run on. (A deep copy inside the fake mode would not do: copying a real
    storage into a fake one is refused.)"""
    fake = copy.deepcopy(model)
    for module in fake.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = nn.Parameter(mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = mode.from_tensor(b)
    return fake


def _cpu_estimate(func: Any, args: Any, kwargs: Any, untimed: set[str]) -> tuple[Any, float]:
    """(func's fake result, its median milliseconds on real CPU tensors of the same shapes): PyTorch's benchmark
    estimate (RuntimeEstimator._maybe_run_and_benchmark_fallback_kernel) with the kit's stopwatch for CUDA
    events. View ops and ops that change a view's metadata cost nothing there, and here."""
    from torch.distributed._tools.runtime_estimator import _VIEW_OPS, RuntimeEstimator
    from torch.utils._mode_utils import no_dispatch
    from torch.utils._pytree import tree_map

    kwargs = kwargs or {}
    ms = 0.0
    if func._overloadpacket not in _VIEW_OPS and torch.Tag.inplace_view not in func.tags:
        fake_mode = RuntimeEstimator.fake_mode

        def real(e: Any) -> Any:
            if isinstance(e, torch.Tensor) and fake_mode.is_our_fake(e):
                make = torch.rand_like if e.is_floating_point() else torch.ones_like
                return make(e, device=e.fake_device)
            return e
        try:
            with no_dispatch():
                a, k = tree_map(real, (args, kwargs))
                ms = benchmark(lambda: func(*a, **k), warmup=1, repeats=3, device=torch.device("cpu")).median * 1e3
        except Exception:  # noqa: BLE001  (an op on data it cannot make up: named in TorchStats.untimed)
            untimed.add(str(func))
    return func(*args, **kwargs), ms


def sac_decisions(stats: TorchStats, budget_bytes: int) -> dict[str, float]:
    """sac_milp's choice at `budget_bytes` (its own peak, which leaves out the optimizer's state): module name ->
    the fraction of its activation memory to discard; {} where nothing needs checkpointing; a ValueError where
    its solver finds nothing that fits."""
    from torch.distributed._tools.sac_ilp import logger, sac_milp

    level = logger.level
    logger.setLevel(logging.CRITICAL)  # an infeasible budget is logged as an error there, raised here
    try:
        with _quiet_pulp():
            decisions, _, peak = sac_milp(copy.deepcopy(stats.graph), budget_bytes / 2**30, world_size=1,
                                          ac_units=stats.units)
    finally:
        logger.setLevel(level)
    if peak == -1:
        raise ValueError(f"sac_decisions: sac_milp finds nothing that fits {budget_bytes:,} B (its peak, without "
                         "the optimizer's state)")
    return decisions


class SacApplied:
    """A context manager, entered as often as needed: while inside, each module sac_milp chose runs under
    PyTorch's selective checkpoint, saving the ops that get_optimal_checkpointing_policy_per_module picks for 1 -
    its discard fraction (solved once, here). Each forward is held to the ops the estimator traced: one that runs
    another op is refused (a policy's choices are by position)."""

    def __init__(self, model: nn.Module, stats: TorchStats, decisions: Mapping[str, float]) -> None:
        from torch.distributed._tools.sac_ilp import get_optimal_checkpointing_policy_per_module

        prefix = type(model).__name__ + "."
        modules = {prefix + fqn: m for fqn, m in model.named_modules() if fqn}
        self.ways: list[tuple[nn.Module, Callable[..., Any]]] = []
        self.saved: dict[str, list[int]] = {}  # module -> 1 (save) or 0 (recompute) per op of its trace
        for fqn, discard in decisions.items():
            if fqn not in modules or fqn not in stats.sac_stats:
                raise ValueError(f"SacApplied: {fqn} is not a module of {type(model).__name__} that SACEstimator saw")
            ops = stats.sac_stats[fqn]
            with _quiet_pulp():
                save = get_optimal_checkpointing_policy_per_module(ops, memory_budget=max(0.0, 1 - discard))
            if len(save) != len(ops.func_names):
                raise ValueError(f"SacApplied: the per-op solver found no policy for {fqn} at discard {discard}")
            self.saved[fqn] = save
            self.ways.append((modules[fqn], _under_policy(modules[fqn].forward, ops.func_names, save, fqn)))
        self._entered: list[Any] = []

    def __enter__(self) -> SacApplied:
        ctx = patched(self.ways)
        ctx.__enter__()
        self._entered.append(ctx)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered.pop().__exit__(*exc)


@contextlib.contextmanager
def _quiet_pulp() -> Iterator[None]:
    """PuLP 3.3 warns that the API torch's sac_ilp calls is deprecated for PuLP 4 (the solver is unchanged):
    torch's to update, not the student's to read under every cell."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pulp(\.|$)")
        yield


def _under_policy(forward: Callable[..., Any], names: list[str], save: list[int], fqn: str) -> Callable[..., Any]:
    from torch.distributed._tools.sac_estimator import OPS_TO_ALWAYS_SKIP
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    def context_fn() -> Any:
        # forward and recomputation count apart: torch 2.11 asks the policy during recomputation too
        # (ctx.is_recompute True there); 2.13 asks in forward only, is_recompute always False
        at = {False: 0, True: 0}

        def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            if op in OPS_TO_ALWAYS_SKIP:  # not in the estimator's list (aten.clone among them): recomputed
                return CheckpointPolicy.PREFER_RECOMPUTE
            i = at[ctx.is_recompute]
            at[ctx.is_recompute] += 1
            if i >= len(names) or names[i] != op._overloadpacket.__name__:
                want = names[i] if i < len(names) else "no more ops"
                raise ValueError(f"sac_applied: {fqn} runs {op} as its op {i}, where SACEstimator traced {want}; "
                                 "its policy, chosen by position, would save other tensors")
            return CheckpointPolicy.MUST_SAVE if save[i] else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)

    return lambda *args, **kwargs: checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
