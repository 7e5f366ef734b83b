"""Exercise 3.4: the optimal schedule under a memory budget, against exhaustive search."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote
from labkit.checks.lab03 import hints as H
from labkit.checks.lab03.common import call


@dataclass(frozen=True)
class Costs:
    """The checker's own ChainCosts (plan reads only these fields)."""

    act: list[int]
    inp: list[int]
    fwd: list[float]
    extra: int = 0


def peak(schedule: list, costs: Costs) -> int:
    """peak_of, written again here so that the check does not trust the notebook's copy."""
    kept, worst = 0, 0
    for seg in schedule:
        if seg.recompute:  # act includes each layer's own input, the kept one too
            worst = max(worst, kept + sum(costs.act[seg.start:seg.stop]))
            kept += costs.inp[seg.start]
        else:
            kept += sum(costs.act[seg.start:seg.stop])
    return max(kept, worst) + costs.extra


def cost(schedule: list, costs: Costs) -> float:
    return sum(sum(costs.fwd[seg.start:seg.stop]) for seg in schedule if seg.recompute)


@dataclass(frozen=True)
class _Seg:
    start: int
    stop: int
    recompute: bool


def _every_schedule(n: int) -> Iterator[list[_Seg]]:
    """Every one-level schedule of n layers: each way to cut the chain, each segment stored or recomputed."""
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[i + 1 for i, cut in enumerate(cuts) if cut], n]
        for kinds in itertools.product([False, True], repeat=len(bounds) - 1):
            yield [_Seg(a, b, k) for a, b, k in zip(bounds, bounds[1:], kinds)]


def best_cost(costs: Costs, budget: int) -> float | None:
    """The least recompute cost over every schedule (None: none fits), by brute force."""
    fitting = [cost(s, costs) for s in _every_schedule(len(costs.act)) if peak(s, costs) <= budget]
    return min(fitting, default=None)


def cases() -> list[tuple[Costs, int]]:
    """Chains of 1 to 6 layers with small integer costs, from a fixed seed, and budgets around what fits, then
    chains whose bytes are whole units (as a profiled chain's are), at every schedule's peak and a byte under
    it, and under extra; under `labkit grade`, 12 more of up to 8 layers and 3 more in units from the run's
    seed."""
    out = _chains(np.random.default_rng(3), 24, 6) + _in_units(np.random.default_rng(4), 3)
    drawn = hidden("3.4")
    if drawn is None:
        return out
    rng = np.random.default_rng(drawn.randrange(2**32))
    return out + _chains(rng, 12, 8)[2:] + _in_units(rng, 3)


def _chains(rng: np.random.Generator, count: int, longest: int) -> list[tuple[Costs, int]]:
    """Two chains with a known trap, then `count` drawn of 1 to `longest` layers, each with a budget near a fit."""
    out = [(Costs([4, 4, 4, 4], [1, 1, 1, 1], [1.0, 1.0, 1.0, 1.0]), 9),  # uniform
           (Costs([5, 2, 5, 2], [1, 1, 1, 1], [0.0, 4.0, 0.0, 4.0], extra=1), 9)]  # heavy and light alternate
    for _ in range(count):
        costs = _drawn(rng, int(rng.integers(1, longest + 1)))
        out.append((costs, int(rng.integers(costs.extra, costs.extra + 3 * len(costs.act) + 6))))
    return out


def _drawn(rng: np.random.Generator, n: int, unit: int = 1) -> Costs:
    """A chain of n layers whose bytes are multiples of `unit`; act includes each layer's input."""
    inp = [int(v) for v in rng.integers(1, 4, n)]
    act = [i + int(v) for i, v in zip(inp, rng.integers(0, 5, n))]
    return Costs([a * unit for a in act], [i * unit for i in inp], [float(v) for v in rng.integers(0, 9, n)],
                 int(rng.integers(0, 3 * unit)))  # extra: any number of bytes, a unit's multiple or not


def _in_units(rng: np.random.Generator, count: int) -> list[tuple[Costs, int]]:
    """`count` chains of 2 to 5 layers in units of 4 to 64 B, each at every schedule's peak and one byte under it
    (the budget then ends inside a unit: rounded up, it would let that peak in), and one byte under extra."""
    out = []
    for _ in range(count):
        costs = _drawn(rng, int(rng.integers(2, 6)), int(rng.choice([4, 8, 64])))
        peaks = sorted({peak(s, costs) for s in _every_schedule(len(costs.act))})
        out += [(costs, b) for b in [costs.extra - 1, *sorted({p - d for p in peaks for d in (1, 0)})]]
    return out


def unit_of(costs: Costs, most: int = 4096) -> int:
    """The unit the given _slots counts a chain's bytes in: their common divisor, or, for a chain that would need
    more than `most` of them, total/most rounded up (written again here, as peak is)."""
    total = sum(costs.act) + sum(costs.inp)
    unit = max(1, math.gcd(*costs.act, *costs.inp))
    return -(-total // most) if total // unit > most else unit


def _covers(schedule: Any, n: int) -> bool:
    try:
        bounds = [(s.start, s.stop) for s in schedule]
    except (TypeError, AttributeError):
        return False
    return bool(bounds) and bounds[0][0] == 0 and bounds[-1][1] == n and \
        all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))


def _judge(got: Any, want: float | None, costs: Costs, budget: int, what: str) -> None:
    """A CheckFailure unless plan's answer `got` is what brute force found (`want`: the least cost, None: none fits)."""
    __tracebackhide__ = True
    n = len(costs.act)
    if got is None:
        if want is not None:
            raise CheckFailure("3.4", what, f"a schedule recomputing {want:g}", "None", H.PLAN_MISSED)
        return
    if not _covers(got, n):
        raise CheckFailure("3.4", f"{what}: the segments", f"layers 0..{n} covered in order", f"{got!r:.100}",
                           H.PLAN_COVER)
    if peak(got, costs) > budget:
        unit = unit_of(costs)  # over by less than the unit the budget ends in: the budget was rounded up
        up = peak(got, costs) - costs.extra <= -(-(budget - costs.extra) // unit) * unit
        expected = "None (nothing fits)" if want is None else f"at most {budget}"
        raise CheckFailure("3.4", f"{what}: peak_of the schedule", expected, peak(got, costs),
                           H.PLAN_ROUND if up else H.PLAN_NONE if want is None else H.PLAN_FITS)
    if want is None:
        raise CheckFailure("3.4", what, "None (nothing fits)", f"{got!r:.100}", H.PLAN_NONE)
    if cost(got, costs) > want + 1e-9:
        raise CheckFailure("3.4", f"{what}: recompute_cost", want, cost(got, costs), H.PLAN_OPTIMAL)


@remote
def ex_3_4(plan: Callable[..., Any]) -> None:
    """Exercise 3.4: plan returns the least-recompute schedule that fits the budget, or None, like brute force."""
    __tracebackhide__ = True
    need_callable("3.4", "plan", plan)
    checked = cases()
    for costs, budget in checked:
        what = f"plan(ChainCosts(act={costs.act}, inp={costs.inp}, fwd={costs.fwd}, extra={costs.extra}), {budget})"
        _judge(call("3.4", what, H.PLAN_SPEC, plan, costs, budget), best_cost(costs, budget), costs, budget, what)
    chains = {(tuple(c.act), tuple(c.inp), tuple(c.fwd), c.extra) for c, _ in checked}
    longest = max(len(c.act) for c, _ in checked)
    passed("3.4", f"plan matches exhaustive search on {len(chains)} chains of up to {longest} layers at "
                  f"{len(checked)} budgets (whole units of 4 to 64 B among them, and under extra): least recompute, "
                  "fits the budget, None when nothing fits")
