"""The optimal persistent schedule of a chain (Beaumont et al., "Optimal checkpointing for heterogeneous
chains", 2019, the dynamic program behind rotor): measured, decided, run.

A persistent schedule is a list of ops on the chain's layers (Op): forwards without a graph (F), forwards
that record the layer's graph (T), backwards (B) and letting a kept input go (del); a layer may be recomputed
several times, and every input it keeps stays until it is let go. `profile_ops` measures what the model needs
(OpCosts: each layer's tensor bytes and the bytes each op reaches above what was alive, with the meter, and
its forward seconds), `simulate` says what a list of ops will peak at and cost, exactly as `run_ops` runs
them, and `optimal_ops` is the dynamic program over (first layer, last layer, memory) that finds the ops with
the least forward cost whose simulated peak fits a budget; `tables_for` fills its tables once for a chain and
reads them back at every budget up to the largest (lab 03 solves 10-14 budgets of one chain).

The dynamic program's recurrence, `optimal_tables`, is lab 03's Exercise 3.5: it is imported through
labkit.labs (docs/design.md, "The package"), and this module does the rest (the units, the schedule read back
from the tables). tests/test_persistent.py holds the executor's measured peak to the simulated one to the
byte and its gradients bitwise to the plain chain's, and the dynamic program to exhaustive search over every
persistent schedule of short chains, simulated.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from labkit.instruments.meter import MemoryMeter
from labkit.instruments.timing import benchmark

@dataclass(frozen=True)
class Op:
    """One operation of a persistent schedule on a chain, on layer `layer`:
    "F" forward without a graph (x[layer+1] from x[layer]; `drop`: x[layer] is let go after, unless a graph
    holds it); "T" forward recording the layer's graph (taped); "B" the layer's backward (its gradient in from
    above, out to below; its graph, its output and the gradient in are let go after); "del" let a kept
    x[layer] go."""

    kind: str
    layer: int
    drop: bool = False


@dataclass(frozen=True)
class OpCosts:
    """What the optimal schedule knows of a chain of n layers, all measured (profile_ops).

    x[i] (n + 1 entries): bytes of the input of layer i, x[n] the chain's output; grad[i]: bytes of the
    gradient of x[i] (grad[n] is the loss's gradient, counted in `loss`); tape[i]: bytes layer i's graph keeps
    besides its input and output; f_over, t_over, b_over: the most bytes above what was alive before that an
    F, a T and a B of layer i reach while they run (their output included); fwd[i]: cost of one forward of
    layer i (seconds, or any unit); loss: bytes alive through backward besides (the loss and its gradient)."""

    x: list[int]
    grad: list[int]
    tape: list[int]
    f_over: list[int]
    t_over: list[int]
    b_over: list[int]
    fwd: list[float]
    loss: int = 0

    def __post_init__(self) -> None:
        n = len(self.fwd)
        lengths = {"x": len(self.x), "grad": len(self.grad)}
        if n == 0 or any(v != n + 1 for v in lengths.values()) or any(
                len(getattr(self, k)) != n for k in ("tape", "f_over", "t_over", "b_over")):
            raise ValueError(f"OpCosts: x and grad need n + 1 entries, the others n, n >= 1; got n = {n}, "
                             f"{lengths}")
        values = [*self.x, *self.grad, *self.tape, *self.f_over, *self.t_over, *self.b_over, self.loss]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values) or min(self.fwd) < 0:
            raise ValueError("OpCosts: bytes must be ints >= 0 and costs >= 0")

    @property
    def n(self) -> int:
        return len(self.fwd)


def simulate(ops: Sequence[Op], costs: OpCosts) -> tuple[int, float]:
    """(peak bytes above the chain's input, forward cost) of running `ops` in a step that holds the output
    until its backward ends (`out = run_ops(...); out.sum().backward()`, as lk.bench's steps do), exactly as
    run_ops holds and lets go of tensors; ValueError on an op that cannot run, or would make again an input
    that exists (two storages where the model counts one)."""
    n, c = costs.n, costs
    live, taped, grads = {0}, set(), {n}  # kept inputs/outputs x[i]; taped layers; gradients present
    peak = cost = 0.0
    backward = False

    def alive() -> int:
        xs = live | taped | {i + 1 for i in taped}
        return (sum(c.x[i] for i in xs if i != 0) + sum(c.tape[i] for i in taped)
                + sum(c.grad[i] for i in grads if i != n) + (c.loss if backward else 0)
                + (c.x[n] if backward else 0) * (n not in xs))  # the step holds the output through backward

    for op in ops:
        i = op.layer
        if not (isinstance(op, Op) and isinstance(i, int) and 0 <= i < n + (op.kind == "del")):
            raise ValueError(f"simulate: {op!r} is not an Op on a layer in 0..{n - 1}")
        before = alive()
        if op.kind in ("F", "T"):
            if i not in live:
                raise ValueError(f"simulate: {op!r} needs x[{i}], which is not kept")
            if i + 1 in live or i in taped:
                raise ValueError(f"simulate: {op!r} would make x[{i + 1}] again while it exists")
            peak = max(peak, before + (c.f_over[i] if op.kind == "F" else c.t_over[i]))
            cost += c.fwd[i]
            live.add(i + 1)
            if op.kind == "T":
                taped.add(i)
            elif op.drop and i != 0:
                live.discard(i)
        elif op.kind == "B":
            if i not in taped or i + 1 not in grads:
                raise ValueError(f"simulate: {op!r} needs layer {i} taped and the gradient of x[{i + 1}]")
            if not backward:  # the first backward: the loss and its gradient exist from here
                backward = True
                peak = max(peak, before + c.loss)
                before = alive()
            peak = max(peak, before + c.b_over[i])
            taped.discard(i)
            live.discard(i + 1)
            if i + 1 != n:
                grads.discard(i + 1)
            grads.add(i)
        elif op.kind == "del":
            if i not in live or i in (0, n) or i in taped or i - 1 in taped:
                raise ValueError(f"simulate: {op!r} lets go of x[{i}], which is not a kept input (or a graph "
                                 "holds it)")
            live.discard(i)
        else:
            raise ValueError(f"simulate: unknown op kind {op.kind!r}; allowed: F, T, B, del")
        peak = max(peak, alive())
    if 0 not in grads:
        raise ValueError("simulate: the ops never reach the gradient of the chain's input (B of layer 0)")
    return int(peak), cost


class _RunOps(torch.autograd.Function):
    """run_ops's step: forward runs the ops before the first backward, backward the rest."""

    @staticmethod
    def forward(ctx, x, layers, ops, on_op, *params):  # noqa: ANN001
        ctx.layers, ctx.on_op = layers, on_op
        ctx.live, ctx.tapes, ctx.grads = {0: x.detach()}, {}, {}
        first = next(k for k, op in enumerate(ops) if op.kind == "B")
        ctx.rest = ops[first:]
        _run(ctx, ops[:first])
        return ctx.live.pop(len(layers))  # the caller's: kept here it would make a cycle through ctx

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001
        ctx.grads[len(ctx.layers)] = grad_out
        _run(ctx, ctx.rest)
        grad_in = ctx.grads.pop(0)
        ctx.live = ctx.tapes = ctx.grads = None
        return (grad_in, None, None, None) + (None,) * (len(ctx.needs_input_grad) - 4)


def _run(ctx, ops) -> None:  # noqa: ANN001
    n = len(ctx.layers)
    for op in ops:
        if ctx.on_op is not None:
            ctx.on_op(op, "start")
        i = op.layer
        if op.kind == "F":
            with torch.no_grad():
                ctx.live[i + 1] = ctx.layers[i](ctx.live[i])
            if op.drop and i != 0:
                del ctx.live[i]
        elif op.kind == "T":
            leaf = ctx.live[i].detach().requires_grad_()
            with torch.enable_grad():
                out = ctx.layers[i](leaf)
            ctx.tapes[i] = (leaf, out)
            ctx.live[i + 1] = out.detach()
        elif op.kind == "B":
            leaf, out = ctx.tapes.pop(i)
            torch.autograd.backward(out, ctx.grads[i + 1])
            ctx.grads[i] = leaf.grad
            del leaf, out
            ctx.live.pop(i + 1, None)
            if i + 1 != n:
                del ctx.grads[i + 1]
        else:  # "del"
            del ctx.live[i]
        if ctx.on_op is not None:
            ctx.on_op(op, "end")


def run_ops(layers: Sequence[torch.nn.Module], x: torch.Tensor, ops: Sequence[Op],
            on_op: Callable[[Op, str], None] | None = None) -> torch.Tensor:
    """The chain's output, computed as `ops` say; its backward runs the rest of them. Checked by simulate
    first (an op that cannot run is a ValueError before anything runs). on_op(op, "start" | "end") is called
    around each op (profile_ops marks the meter's timeline with it). A recomputed layer runs again as it is:
    no random state or autocast is restored (as torch.utils.checkpoint does), so the layers must compute the
    same each time (lab 03's chains have no dropout)."""
    layers = _chain(layers, "run_ops")
    ops = list(ops)
    if any(not isinstance(op, Op) for op in ops) or not any(op.kind == "B" for op in ops):
        raise ValueError("run_ops: ops must be a list of Op with at least one backward")
    zero = [0] * len(layers)
    simulate(ops, OpCosts([0] * (len(layers) + 1), [0] * (len(layers) + 1), zero, zero, zero, zero,
                          [0.0] * len(layers)))
    params = [p for layer in layers if isinstance(layer, torch.nn.Module) for p in layer.parameters()]
    return _RunOps.apply(x, layers, ops, on_op, *params)


def store_all(n: int) -> list[Op]:
    """Every layer taped in forward, then backward: a plain step as ops (no recomputation)."""
    return [Op("T", i) for i in range(n)] + [Op("B", i) for i in reversed(range(n))]


def _split(s: int, split: int, right: list[Op], left: list[Op]) -> list[Op]:
    """Forward from x[s] to x[split] without a graph, keep x[split], run `right` (layers [split, ..)), let
    x[split] go, run `left` (layers [s, split), from x[s] again)."""
    return [Op("F", s), *(Op("F", j, drop=True) for j in range(s + 1, split)), *right, Op("del", split), *left]


def revolve_model(n: int, slots: int) -> tuple[OpCosts, int]:
    """A uniform chain of n steps in Revolve's model (Griewank and Walther, 2000) as (OpCosts, budget): the
    optimal persistent schedule's forward cost there is Revolve's least number of forward steps with `slots`
    checkpoint slots, each step's taped forward included. Revolve keeps states in its slots and tapes a step
    only just before its reverse, the tape held besides the slots; so here a kept state is one unit, a taped
    step (its output included) slots + 1 units, and the budget 2 * slots + 1: one tape fits beside every slot,
    two never do. Gradients and what ops reach are nothing. Two counts differ and cancel: Revolve's x[0] takes
    a slot and its state being advanced is free; here the caller holds x[0] and the state takes its unit."""
    if isinstance(n, bool) or isinstance(slots, bool) or not isinstance(n, int) or not isinstance(slots, int) \
            or n < 1 or slots < 1:
        raise ValueError(f"revolve_model: n and slots must be ints >= 1, got n={n!r}, slots={slots!r}")
    tape = slots + 1  # a taped step's graph and output together; x[n], the chain's output, is the step's
    zeros = [0] * n
    costs = OpCosts([1] * n + [0], [0] * (n + 1), [tape - 1] * (n - 1) + [tape], zeros, zeros, zeros, [1.0] * n)
    return costs, slots + tape


def segments_ops(schedule: Sequence, n: int) -> list[Op]:
    """A one-level schedule (lab 03's Segments: stored, or recomputed once) as ops: a stored segment's layers
    taped in forward; a recomputed one run without a graph, its input kept, and taped again in backward."""
    def rest(k: int) -> list[Op]:
        if k == len(schedule):
            return []
        seg = schedule[k]
        if not seg.recompute:
            return [*(Op("T", i) for i in range(seg.start, seg.stop)), *rest(k + 1),
                    *(Op("B", i) for i in reversed(range(seg.start, seg.stop)))]
        taped = [*(Op("T", i) for i in range(seg.start, seg.stop)),
                 *(Op("B", i) for i in reversed(range(seg.start, seg.stop)))]
        return _split(seg.start, seg.stop, rest(k + 1), taped) if seg.stop < n else taped
    bounds = [(g.start, g.stop) for g in schedule]
    if not bounds or bounds[0][0] != 0 or bounds[-1][1] != n or any(
            a >= b for a, b in bounds) or any(b != c for (_, b), (c, _) in zip(bounds, bounds[1:])):
        raise ValueError(f"segments_ops: the segments must cover layers 0..{n} in order, each non-empty, got "
                         f"{list(schedule)}")
    return rest(0)


def recursive_ops(n: int, s: int = 0) -> list[Op]:
    """Chen et al.'s recursion as ops: the first half run without a graph and its end kept, the second half
    done the same way, then the first half again, recursively; one layer is taped and back-propagated."""
    if n - s == 1:
        return [Op("T", s), Op("B", s)]
    mid = s + (n - s) // 2
    return _split(s, mid, recursive_ops(n, mid), recursive_ops(mid, s))


def all_schedules(n: int, s: int = 0) -> Iterator[list[Op]]:
    """Every persistent schedule of layers [s, n) (the space optimal_ops searches), for exhaustive search."""
    for rest in ([[]] if n == s + 1 else all_schedules(n, s + 1)):
        yield [Op("T", s), *rest, Op("B", s)]
    for split in range(s + 1, n):
        for right in all_schedules(n, split):
            for left in all_schedules(split, s):
                yield _split(s, split, right, left)


def profile_ops(chain: torch.nn.Sequential, x: torch.Tensor, repeats: int = 3) -> OpCosts:
    """OpCosts of `chain` at input `x`, measured: the meter's bytes around each op of two steps (every
    layer run without a graph; every layer taped, then back-propagated), and each layer's median forward
    seconds (no graph). A layer whose bytes the model cannot hold (an F whose output is not one new tensor of
    its bytes, a graph that seems to keep less than nothing: its output a view of its input) is refused,
    naming it."""
    layers = _chain(chain, "profile_ops")
    n = len(layers)
    with torch.no_grad():
        hs = [x.detach()]
        for layer in layers:
            hs.append(layer(hs[-1]))
    sizes = [h.untyped_storage().nbytes() for h in hs]
    found: dict[tuple[str, int], tuple[int, int, int]] = {}

    def step(ops: list[Op]) -> None:
        with MemoryMeter(chain, x, history=True) as meter:
            marks = {}

            def on_op(op: Op, when: str) -> None:
                if when == "start":
                    marks[op] = (meter.live, len(meter.timeline))
                else:
                    before, start = marks.pop(op)
                    top = max([e.live_bytes for e in meter.timeline[start:]], default=before)
                    found[op.kind, op.layer] = (before, max(top, meter.live), meter.live)
            out = run_ops(layers, x, ops, on_op)
            out.sum().backward()

    with torch.random.fork_rng(devices=[]):
        for p in chain.parameters():
            p.grad = torch.zeros_like(p)
        x.grad = torch.zeros_like(x)
        with MemoryMeter(chain, x, history=True) as meter, torch.no_grad():  # F: each layer without a graph
            h = hs[0]
            for i, layer in enumerate(layers):
                before, start = meter.live, len(meter.timeline)
                h = layer(h)
                top = max([e.live_bytes for e in meter.timeline[start:]], default=before)
                found["F", i] = (before, top, meter.live)
            del h
        step(store_all(n))
    f_over, t_over, b_over, tape, grad = [], [], [], [], [0] * (n + 1)
    for i in range(n):
        before, top, after = found["F", i]
        if after - before != sizes[i + 1] - (sizes[i] if i else 0):
            raise ValueError(f"profile_ops: layer {i}'s forward leaves {after - before:,} B more alive, not its "
                             f"output's {sizes[i + 1]:,} B less its input's: its output shares memory")
        f_over.append(top - before)
        before, top, after = found["T", i]
        t_over.append(top - before)
        tape.append(after - before - sizes[i + 1])
        if tape[-1] < 0:
            raise ValueError(f"profile_ops: layer {i} ({type(layers[i]).__name__}) taped leaves {after - before:,} B "
                             f"more alive, less than its output's {sizes[i + 1]:,} B: its output shares its input's "
                             "memory (a view), which the model cannot count")
    for i in reversed(range(n)):  # B: the gradient it leaves is what it adds, less what it lets go
        before, top, after = found["B", i]
        b_over.append(top - before)
        grad[i] = after - before + tape[i] + (sizes[i + 1] + grad[i + 1] if i + 1 < n else 0)
    b_over.reverse()
    fwd = []
    for i, layer in enumerate(layers):
        with torch.no_grad():
            fwd.append(benchmark(lambda layer=layer, h=hs[i]: layer(h), warmup=1, repeats=repeats).median)
    loss = 2 * hs[-1].element_size()  # the loss (a sum) and its gradient, one element each
    return OpCosts(sizes, grad, tape, f_over, t_over, b_over, fwd, loss)


SLACK = 8  # units above the budget's the DP also fills, each tried against the exact simulation


def _op_units(costs: OpCosts, budget: int, most: int = 2048) -> dict:
    """The DP's memory in units: the common divisor of every amount, or, when the budget would need more than
    `most` units, the least power of two that needs at most `most` (a tensor's bytes are a multiple of a large
    power of two, so tensors stay exact and a few bytes of a scalar or a bias round up to one unit). What a
    step takes is rounded up and what it lets go rounded down, so a schedule the DP finds fits never runs over
    the budget; with the common divisor nothing is rounded."""
    c = costs
    values = [v for v in (*c.x, *c.grad, *c.tape, *c.f_over, *c.t_over, *c.b_over, c.loss) if v] or [1]
    unit = math.gcd(*values)  # every amount is a multiple of it: budget // unit loses nothing
    if budget // unit > most:  # a power of two: tensors' bytes are multiples of large ones, so they stay exact
        unit = 1 << (-(-budget // most) - 1).bit_length()
    up = lambda vs: np.array([-(-v // unit) for v in vs], dtype=np.int64)  # noqa: E731
    down = lambda vs: np.array([v // unit for v in vs], dtype=np.int64)  # noqa: E731
    return {"unit": unit, "top": budget // unit if budget >= 0 else -1, "x": up(c.x),
            "grad": up(c.grad), "grad_down": down(c.grad), "tape": up(c.tape), "f": up(c.f_over),
            "t": up(c.t_over), "b": up(c.b_over), "loss": -(-c.loss // unit)}


def _budget(budget: int, who: str) -> int:
    """`budget` if it is an int of bytes, else the TypeError optimal_ops has always given."""
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise TypeError(f"{who}: budget must be an int of bytes, got {type(budget).__name__}")
    return budget


@dataclass(frozen=True, eq=False)
class OpTables:
    """The dynamic program's tables of one chain, filled once (tables_for) in the unit of the largest budget they
    serve, `most_budget`, and read back at any budget: `ops(budget)` is optimal_ops's answer in that unit."""

    costs: OpCosts
    most_budget: int
    u: dict
    best: np.ndarray | None  # None: most_budget is below zero, no budget to fill for
    how: np.ndarray | None
    root: int

    def ops(self, budget: int) -> list[Op] | None:
        """The persistent schedule with the least forward cost (in these tables' unit) whose simulated peak is at
        most `budget`, or None if none fits; ValueError on a budget above most_budget that storing everything
        does not fit (the tables do not reach it)."""
        budget, costs = _budget(budget, "OpTables.ops"), self.costs
        if simulate(store_all(costs.n), costs)[0] <= budget:  # one forward pass, the least any schedule runs
            return store_all(costs.n)
        if budget > self.most_budget:
            raise ValueError(f"OpTables.ops: budget {budget:,} B is over the {self.most_budget:,} B these tables "
                             "were filled for; allowed: at most that, or storing everything's peak and above")
        if budget < 0 or self.best is None:
            return None
        top = budget // self.u["unit"]
        # the rounding is on the safe side, so the ops at `top` units fit; a few units more may still fit the
        # budget exactly (the bytes a rounding added were never there): the most that does, simulated, is best
        for m in range(top + SLACK, top - 1, -1):
            if np.isfinite(self.best[self.root + m]):
                ops = _rebuild(self.how, self.u, 0, costs.n, m, costs.n)
                peak = simulate(ops, costs)[0]
                if peak <= budget:
                    return ops
                if m == top:
                    raise ValueError(f"optimal_ops: the tables' schedule at {top} units peaks at {peak:,} B, over "
                                     f"the budget of {budget:,} B: the tables (or the costs: an op's reach must "
                                     "cover what it leaves alive) are optimistic")
        return None

    def least(self) -> int | None:
        """The simulated peak of the schedule these tables fit in the fewest units (the least budget they find
        a schedule for, to their unit), or None if they fit none up to most_budget's units (and SLACK more)."""
        if self.best is None:
            return None
        finite = np.isfinite(self.best[self.root:self.root + self.u["top"] + SLACK + 1])
        if not finite.any():
            return None
        ops = _rebuild(self.how, self.u, 0, self.costs.n, int(np.argmax(finite)), self.costs.n)
        return simulate(ops, self.costs)[0]


def tables_for(costs: OpCosts, most_budget: int, tables: Callable | None = None, most: int = 2048) -> OpTables:
    """The dynamic program's tables of `costs` for every budget up to `most_budget`, filled once by `tables`
    (lab 03's Exercise 3.5, optimal_tables, unless given) in most_budget's unit (_op_units: at most about `most`
    units up to it, storing everything's peak if that is less; exact with the amounts' common divisor), so
    that `.ops(budget)` reads each budget's schedule back without filling again. A budget below most_budget
    is counted in the same unit, coarser for it than optimal_ops(costs, budget) counts (bench optimal measures
    what that costs: cost_against_8192_units_max)."""
    if tables is None:
        from labkit.labs.sqrt_n import optimal_tables as tables
    most_budget = _budget(most_budget, "tables_for")
    peak = simulate(store_all(costs.n), costs)[0]
    u = _op_units(costs, min(most_budget, peak), most)
    if most_budget < 0:
        return OpTables(costs, most_budget, u, None, None, 0)
    best, how, root = tables(costs, {**u, "top": u["top"] + SLACK})  # and the units above it ops() tries
    return OpTables(costs, most_budget, u, best, how, root)


def optimal_ops(costs: OpCosts, budget: int, tables: Callable | None = None, most: int = 2048) -> list[Op] | None:
    """The persistent schedule with the least forward cost whose simulated peak is at most `budget`, or None
    if none fits: Beaumont et al.'s dynamic program over first layer, last layer and memory, filled by
    `tables` (lab 03's Exercise 3.5, optimal_tables, unless given), memory counted in at most about `most`
    units (_op_units: exact with the amounts' common divisor; with a coarser unit, an amount that is not a
    multiple of it rounds up, and the least cost is the least in those units). The schedule is simulated
    before it is returned: tables that give one over the budget are a ValueError, never a schedule. One fill
    per call: for several budgets of one chain, tables_for fills once and reads each back."""
    budget = _budget(budget, "optimal_ops")
    if simulate(store_all(costs.n), costs)[0] <= budget:  # no table needed
        return store_all(costs.n)
    return tables_for(costs, budget, tables, most).ops(budget)


def least_budget(costs: OpCosts, tables: Callable | None = None) -> int | None:
    """The least budget optimal_ops finds a schedule for, to the unit it counts in: the tables filled once at
    storing everything's peak give the least memory any schedule needs, and that schedule's simulated peak is
    returned (tables_for(costs, that peak).least())."""
    return tables_for(costs, simulate(store_all(costs.n), costs)[0], tables).least()


def _rebuild(how: np.ndarray, u: dict, s: int, e: int, m: int, n: int) -> list[Op]:
    """The ops of how[s, e] at m units (the choices optimal_tables made), recursively."""
    m = min(m, how.shape[2] - 1)
    choice = int(how[s, e, m]) if m >= 0 else -1
    if choice < 0:
        raise RuntimeError(f"optimal_ops: no choice at layers [{s}, {e}) with {m} units (an inconsistent table)")
    if choice == 0:
        inner = _rebuild(how, u, s + 1, e, m - int(u["tape"][s] + u["x"][s + 1]), n) if e > s + 1 else []
        return [Op("T", s), *inner, Op("B", s)]
    freed = int(u["grad_down"][e]) if e < n else -int(u["x"][n]) - u["loss"]
    return ([Op("F", s), *(Op("F", j, drop=True) for j in range(s + 1, choice))]
            + _rebuild(how, u, choice, e, m - int(u["x"][choice]), n) + [Op("del", choice)]
            + _rebuild(how, u, s, choice, m + freed - int(u["grad"][choice]), n))


def _chain(layers: Sequence[Callable[[torch.Tensor], torch.Tensor]], who: str) -> list:
    """Lab 03's check_chain: the layers as a list, or the error it gives."""
    from labkit.labs.sqrt_n import check_chain

    return check_chain(layers, who)
