"""Lab 04's knapsack inside torch.compile, beside the partitioner's own solvers: `python -m labkit bench compile`.

Each block of lab 04's long stack is compiled (labkit.instruments.compiled: the min-cut partitioner, then eager
kernels) under activation_memory_budget at each of BUDGETS, with each solver of SOLVERS: "planner" is lab 04's
knapsack_keep run as a CustomKnapsackSolver (labkit.planners.solver), the others the partitioner's built-in
"dp", "greedy" and "ilp"; two more settings are measured on request: "planner-eager", the same planner with the
random candidates planned by its eager rule and nothing tagged (as torch's own solvers treat them), and "policy",
dp with a selective checkpoint policy that tags every random op MUST_SAVE (labkit.planners.solver). Per setting: the
meter's peak over one training step (after the one that compiled), the bytes forward saves for backward
(lab 04's saved_after_forward), the step time over the plain eager step's
(medians of alternating pairs), whether the gradients equal the plain eager step's bit for bit (`bitwise`: never
with dropout on, as the decomposed forward draws other masks), whether loss and gradients equal those of the same
blocks compiled at budget 1 under the same seed (`same_as_budget_1`: the step that ran the same forward and
recomputed nothing), how many random ops ran in backward (`backward_draws`: each a draw no forward made,
pytorch/pytorch#190758), and, for the planners, how often the partitioner called it. The budget is a fraction of
the span the partitioner normalises by, not of the peak: the bench says whether each solver's peak falls as its
budget falls (`peak_monotone`), which nothing guarantees (pytorch/pytorch#197838 reports a lower budget raising
the peak 4x on a llama-style model).
"""
from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from labkit.bench.lab02 import stack_step
from labkit.bench.lab04 import long_stack, saved_after_forward
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.compiled import Compiled, RandomDraws, metered_backend, outside_meters
from labkit.instruments.meter import MemoryMeter
from labkit.instruments.timing import compare
from labkit.models import GPTStack

__all__ = ["BUDGETS", "SETTINGS", "SOLVERS", "budget_one", "solver_rows", "compile_solvers", "compile_tags"]

BUDGETS = (0.1, 0.2, 0.4, 0.5)  # the cpu profile's stack: the knapsack runs from 0.1 to 0.4; at 0.5 a relaxed cut
SOLVERS = ("planner", "dp", "greedy", "ilp")
SETTINGS = SOLVERS + ("planner-eager", "policy")  # what solver_rows measures on request (see the module's doc)


def _grads(model: GPTStack, x: torch.Tensor, run_block: Callable) -> list[torch.Tensor]:
    stack_step(model, x, run_block)()
    return [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


def _plain(block: torch.nn.Module, y: torch.Tensor) -> torch.Tensor:
    return block(y)


def _solver(name: str, keep: Callable | None) -> Any:
    """The partitioner's solver setting for `name`: the planner as a CustomKnapsackSolver, dp under the policy,
    else the name."""
    if name == "policy":
        return "dp"
    if not name.startswith("planner"):
        return name
    from labkit.planners.solver import planner_solver

    if keep is None:
        raise ValueError(f"solver_rows: the {name} row needs keep= (lab 04's knapsack_keep)")
    return planner_solver(keep, name, random="planner" if name == "planner-eager" else "save")


def _forward(block: torch.nn.Module, name: str) -> Callable:
    """What `name` compiles of a block: its forward, or under "policy" a selective checkpoint of it whose policy
    tags every random op MUST_SAVE."""
    if name != "policy":
        return block.forward
    from torch.utils.checkpoint import checkpoint

    from labkit.planners.solver import random_saved_context

    return lambda y: checkpoint(block.forward, y, use_reentrant=False, context_fn=random_saved_context)


def budget_one(model: GPTStack, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Loss and gradients of one step of the blocks compiled at budget 1 (the default partition, nothing recomputed
    that the allowlist bans), dropout seeded as every step here: what a setting that ran the same forward and
    recomputed nothing of it trains."""
    compiled = {id(b): Compiled(b.forward, 1.0) for b in model.blocks}
    run = lambda block, y: compiled[id(block)](y)  # noqa: E731
    stack_step(model, x, run)()  # compiles
    return _loss(model, x, run), _grads(model, x, run)


def _loss(model: GPTStack, x: torch.Tensor, run: Callable) -> torch.Tensor:
    with torch.no_grad():
        return stack_step(model, x, run, backward=False)().square().mean()


def solver_row(model: GPTStack, x: torch.Tensor, name: str, budget: float, keep: Callable | None,
               repeats: int, reference: tuple[torch.Tensor, list[torch.Tensor]] | None = None) -> dict[str, Any]:
    """One setting at one budget, measured (see the module's doc); reference: budget_one's (made here if None);
    repeats=0: no step time (step_ratio None); a setting that fails is a row saying why."""
    try:
        with _quiet_wrap():
            return _measured_row(model, x, name, budget, keep, repeats, reference)
    except Exception as e:  # noqa: BLE001 - a solver PyTorch refuses (or a torch without custom solvers): a row
        return {"solver": name, "budget": budget, "error": f"{type(e).__name__}: {e}"[:300]}


@contextlib.contextmanager
def _quiet_wrap() -> Any:
    """torch._higher_order_ops.wrap's warning about in-place ops in a checkpoint under compile, silenced: the
    blocks here have none."""
    quiet = logging.getLogger("torch._higher_order_ops.wrap")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        yield
    finally:
        quiet.setLevel(level)


def _measured_row(model: GPTStack, x: torch.Tensor, name: str, budget: float, keep: Callable | None, repeats: int,
                  reference: tuple[torch.Tensor, list[torch.Tensor]] | None) -> dict[str, Any]:
    """solver_row's measurement; its errors are solver_row's rows."""
    solver = _solver(name, keep)
    compiled = {id(b): Compiled(_forward(b, name), budget, solver=solver) for b in model.blocks}
    run = lambda block, y: compiled[id(block)](y)  # noqa: E731
    stack_step(model, x, run)()  # compiles every block: the partitioner runs here
    loss, want = reference if reference is not None else budget_one(model, x)
    with contextlib.ExitStack() as ran:
        for c in compiled.values():
            ran.enter_context(c.check_ran(f"compile budget {budget:g} with {name}"))
        with MemoryMeter(model, x, device=x.device) as meter:
            stack_step(model, x, run)()
        kept = saved_after_forward(model, x, run)
        with RandomDraws() as draws:
            got = _grads(model, x, run)
        bitwise = all(map(torch.equal, _grads(model, x, _plain), got))
        same = torch.equal(_loss(model, x, run), loss) and all(map(torch.equal, got, want))
        ratio = None if repeats == 0 else compare(stack_step(model, x, _plain), stack_step(model, x, run),
                                                  repeats=repeats, warmup=1, device=x.device).ratio
    row = {"solver": name, "budget": budget, "measured_peak": meter.peak, "kept_after_forward": kept,
           "step_ratio": None if ratio is None else round(ratio, 4),
           "bitwise": bitwise, "same_as_budget_1": same, "backward_draws": draws.count("backward")}
    if name.startswith("planner"):
        row["solver_calls"] = solver.calls  # the partitioner asked it, once per block's graph (0: no knapsack ran)
        row["random_offered"] = len(solver.random_offered)  # random candidates among what it was offered
        row["random_tagged"] = len(solver.random_tagged)  # random nodes outside them it tagged MUST_SAVE
    return row


def solver_rows(model: GPTStack, x: torch.Tensor, keep: Callable | None, budgets: Sequence[float] = BUDGETS,
                solvers: Sequence[str] = SOLVERS, repeats: int = 5,
                reference: tuple[torch.Tensor, list[torch.Tensor]] | None = None) -> list[dict[str, Any]]:
    """Every setting of `solvers` (among SETTINGS) at every budget on `model` (see the module's doc); keep: lab 04's
    knapsack_keep; reference: budget_one(model, x), made here if None."""
    unknown = [s for s in solvers if s not in SETTINGS]
    if unknown:
        raise ValueError(f"solver_rows: solvers {unknown} are not among {', '.join(SETTINGS)}")
    reference = reference if reference is not None else budget_one(model, x)
    return [solver_row(model, x, name, b, keep, repeats, reference) for b in budgets for name in solvers]


def peak_monotone(rows: Sequence[dict[str, Any]]) -> dict[str, bool | None]:
    """Per solver: whether its measured peak never rises as its budget falls (None: a row without a peak)."""
    out: dict[str, bool | None] = {}
    for name in dict.fromkeys(r["solver"] for r in rows):
        mine = sorted((r for r in rows if r["solver"] == name), key=lambda r: r["budget"])
        peaks = [r.get("measured_peak") for r in mine]
        out[name] = None if None in peaks else all(a <= b for a, b in zip(peaks, peaks[1:]))
    return out


def compile_solvers(size: Sizes | None = None) -> dict[str, Any]:
    """`bench compile`: the solvers list (name, budget, measured_peak, step_ratio, bitwise, same_as_budget_1,
    backward_draws) with lab 04's planner among them and the two settings beside it, the plain step's peak, and
    whether each solver's peak is monotone in the budget."""
    from labkit.labs.selective import knapsack_keep

    size = size or sizes()
    model, x = long_stack(size)
    with MemoryMeter(model, x, device=x.device) as meter:
        stack_step(model, x, _plain)()
    rows = solver_rows(model, x, knapsack_keep, solvers=SETTINGS, repeats=max(3, size.repeats // 2))
    return {"solvers": rows, "plain_peak": meter.peak, "peak_monotone": peak_monotone(rows),
            "torch": torch.__version__, "config": {"s": model.cfg.seq, "b": model.cfg.batch,
                                                   "h": model.cfg.hidden, "n_layers": model.cfg.n_layers}}


def _entered(context_fn: Callable[[], Any]) -> Any:
    """context_fn(): under torch.compile a checkpoint's context_fn must be a function or a functools.partial."""
    return context_fn()


def compile_tags(block: torch.nn.Module, x: torch.Tensor, context_fn: Callable[[], Any]) -> dict[str, Any]:
    """What torch.compile does with a selective checkpoint of `block`: the policy (context_fn, as
    torch.utils.checkpoint takes it) tags each node of the traced joint graph (node.meta["recompute"]), and the
    partitioner (min-cut, at activation_memory_budget 1) chooses what forward saves.

    Per tag: how many nodes carry it ("tagged"), how many of those forward saved ("saved"), how many the backward
    graph runs again ("rebuilt"), how many are matrix products ("matmuls") and of those how many backward runs
    again ("matmuls_rebuilt"); and of the tagged nodes neither saved nor rebuilt, the multi-output ones
    ("tuples": a tuple is never saved, its getitems are) and the others ("unread": backward reads only what
    forward saved or what it runs again, so none of these). Besides:
    the saved values that are graph inputs ("saved_inputs": the block's input, its weights), the RNG states the
    forward saves for backward ("saved_rng_states": run_and_save_rng_state's, for a random op the policy made
    recomputable), and ops saved with no tag."""
    import functools

    import torch.fx as fx
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.utils.checkpoint import checkpoint

    seen: dict[str, Any] = {}

    def partition(joint: fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        fwd, bwd = min_cut_rematerialization_partition(joint, inputs, **kwargs)
        out = next(n for n in fwd.graph.nodes if n.op == "output").args[0]
        seen["saved"] = [a for a in out[kwargs["num_fwd_outputs"]:] if isinstance(a, fx.Node)]
        seen["joint"] = [n for n in joint.graph.nodes if n.op == "call_function"]
        seen["backward"] = {n.name for n in bwd.graph.nodes if n.op == "call_function"}
        return fwd, bwd

    backend = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=partition,
                           decompositions=core_aten_decompositions())
    context = functools.partial(_entered, context_fn)
    # under a meter (a whole notebook measured) dynamo would refuse to compile: the graphs run inside it instead
    run = torch.compile(lambda y: checkpoint(block, y, use_reentrant=False, context_fn=context),
                        backend=metered_backend(backend), fullgraph=True, dynamic=False)
    with _quiet_wrap(), outside_meters():
        result = run(x.detach().requires_grad_())
    result.sum().backward()
    return _tag_counts(seen)


def _tag_counts(seen: dict[str, Any]) -> dict[str, Any]:
    """compile_tags' figures from what its partition saw (see compile_tags)."""
    nodes, saved, backward = seen["joint"], {n.name for n in seen["saved"]}, seen["backward"]
    tag = {n.name: str(n.meta.get("recompute")).removeprefix("CheckpointPolicy.") for n in nodes
           if n.meta.get("recompute") is not None}
    out: dict[str, Any] = {}
    for name in sorted(set(tag.values())):
        mine = [n for n in nodes if tag.get(n.name) == name]
        left = [n for n in mine if n.name not in saved and n.name not in backward]
        matmuls = [n for n in mine if getattr(n.target, "__name__", "").split(".")[0] in ("mm", "bmm", "addmm")]
        out[name] = {"tagged": len(mine), "saved": sum(n.name in saved for n in mine),
                     "rebuilt": sum(n.name in backward for n in mine),
                     "tuples": sum(isinstance(n.meta.get("val"), (tuple, list)) for n in left),
                     "unread": sum(not isinstance(n.meta.get("val"), (tuple, list)) for n in left),
                     "matmuls": len(matmuls), "matmuls_rebuilt": sum(n.name in backward for n in matmuls)}
    joint = {n.name: n for n in nodes}
    out["saved_inputs"] = sum(n.op == "placeholder" for n in seen["saved"])  # the input, the weights
    out["saved_rng_states"] = sum(n.op != "placeholder" and n.name not in joint and n.target is operator.getitem
                                  and "rng_state" in str(n.args[0].target) for n in seen["saved"])
    out["saved_untagged_ops"] = sum(n.name in joint and n.name not in tag for n in seen["saved"])
    return out
