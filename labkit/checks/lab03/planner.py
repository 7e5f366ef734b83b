"""Exercise 3.4: the optimal schedule under a memory budget, against exhaustive search."""
from __future__ import annotations

import itertools
from collections.abc import Callable
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


def best_cost(costs: Costs, budget: int) -> float | None:
    """The least recompute cost over every schedule (None: none fits), by brute force."""
    n, best = len(costs.act), None
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[i + 1 for i, cut in enumerate(cuts) if cut], n]
        for kinds in itertools.product([False, True], repeat=len(bounds) - 1):
            schedule = [_Seg(a, b, k) for a, b, k in zip(bounds, bounds[1:], kinds)]
            if peak(schedule, costs) <= budget:
                c = cost(schedule, costs)
                best = c if best is None else min(best, c)
    return best


def cases() -> list[tuple[Costs, int]]:
    """Chains of 1 to 6 layers with small integer costs, from a fixed seed, and budgets around what fits; under
    `labkit grade`, 12 more of up to 8 layers from the run's seed."""
    out = _chains(np.random.default_rng(3), 24, 6)
    drawn = hidden("3.4")
    return out if drawn is None else out + _chains(np.random.default_rng(drawn.randrange(2**32)), 12, 8)[2:]


def _chains(rng: np.random.Generator, count: int, longest: int) -> list[tuple[Costs, int]]:
    """Two chains with a known trap, then `count` drawn of 1 to `longest` layers, each with a budget near a fit."""
    out = [(Costs([4, 4, 4, 4], [1, 1, 1, 1], [1.0, 1.0, 1.0, 1.0]), 9),  # uniform
           (Costs([5, 2, 5, 2], [1, 1, 1, 1], [0.0, 4.0, 0.0, 4.0], extra=1), 9)]  # heavy and light alternate
    for _ in range(count):
        n = int(rng.integers(1, longest + 1))
        inp = [int(v) for v in rng.integers(1, 4, n)]
        costs = Costs([i + int(v) for i, v in zip(inp, rng.integers(0, 5, n))], inp,  # act includes the input
                      [float(v) for v in rng.integers(0, 9, n)], int(rng.integers(0, 3)))
        out.append((costs, int(rng.integers(costs.extra, costs.extra + 3 * n + 6))))
    return out


def _covers(schedule: Any, n: int) -> bool:
    try:
        bounds = [(s.start, s.stop) for s in schedule]
    except (TypeError, AttributeError):
        return False
    return bool(bounds) and bounds[0][0] == 0 and bounds[-1][1] == n and \
        all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))


@remote
def ex_3_4(plan: Callable[..., Any]) -> None:
    """Exercise 3.4: plan returns the least-recompute schedule that fits the budget, or None, like brute force."""
    __tracebackhide__ = True
    need_callable("3.4", "plan", plan)
    checked = cases()
    for costs, budget in checked:
        what = f"plan(ChainCosts(act={costs.act}, inp={costs.inp}, fwd={costs.fwd}, extra={costs.extra}), {budget})"
        got = call("3.4", what, H.PLAN_SPEC, plan, costs, budget)
        want = best_cost(costs, budget)
        if got is None:
            if want is not None:
                raise CheckFailure("3.4", what, f"a schedule recomputing {want:g}", "None", H.PLAN_OPTIMAL)
            continue
        if want is None:
            raise CheckFailure("3.4", what, "None (nothing fits)", f"{got!r:.100}", H.PLAN_NONE)
        if not _covers(got, len(costs.act)):
            raise CheckFailure("3.4", f"{what}: the segments", f"layers 0..{len(costs.act)} covered in order",
                               f"{got!r:.100}", H.PLAN_COVER)
        if peak(got, costs) > budget:
            raise CheckFailure("3.4", f"{what}: peak_of the schedule", f"at most {budget}", peak(got, costs),
                               H.PLAN_FITS)
        if cost(got, costs) > want + 1e-9:
            raise CheckFailure("3.4", f"{what}: recompute_cost", want, cost(got, costs), H.PLAN_OPTIMAL)
    longest = max(len(c.act) for c, _ in checked)
    passed("3.4", f"plan matches exhaustive search on {len(checked)} chains of up to {longest} layers: least "
                  "recompute, fits the budget, None when nothing fits")
