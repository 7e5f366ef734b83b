"""Exercise 3.5: the optimal persistent schedule's tables, against exhaustive search over every schedule.

The checker's own ops, simulation and enumeration (written apart from labkit.planners.persistent, so that the
check does not trust the kit's copy): small chains with integer costs counted in bytes (one unit each), every
persistent schedule simulated, and the student's tables read back into ops and simulated the same way.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote
from labkit.checks.lab03 import hints as H
from labkit.checks.lab03.common import call


@dataclass(frozen=True)
class Costs:
    """The checker's own OpCosts (optimal_tables reads n and fwd)."""

    x: list[int]
    grad: list[int]
    tape: list[int]
    f_over: list[int]
    t_over: list[int]
    b_over: list[int]
    fwd: list[float]
    loss: int = 0

    @property
    def n(self) -> int:
        return len(self.fwd)


def units(c: Costs, budget: int, unit: int = 1) -> dict:
    """The amounts in `unit`s (what optimal_tables is given): what is taken rounded up, what is let go down."""
    up = lambda v: np.array([-(-a // unit) for a in v], dtype=np.int64)  # noqa: E731
    down = lambda v: np.array([a // unit for a in v], dtype=np.int64)  # noqa: E731
    return {"unit": unit, "top": budget // unit, "x": up(c.x), "grad": up(c.grad), "grad_down": down(c.grad),
            "tape": up(c.tape), "f": up(c.f_over), "t": up(c.t_over), "b": up(c.b_over),
            "loss": -(-c.loss // unit)}


def simulate(ops: list[tuple], c: Costs) -> tuple[int, float] | None:
    """(peak, forward cost) of ops ("F", i, drop), ("T", i), ("B", i), ("del", i); None if one cannot run."""
    n = c.n
    live, taped, grads, back = {0}, set(), {n}, False
    peak = cost = 0.0

    def alive() -> int:
        xs = live | taped | {i + 1 for i in taped}
        held = sum(c.x[i] for i in xs if i) + sum(c.tape[i] for i in taped) + sum(c.grad[i] for i in grads if i != n)
        return held + (c.loss + (c.x[n] if n not in xs else 0) if back else 0)

    for kind, i, *drop in ops:
        before = alive()
        if kind in ("F", "T"):
            if i not in live:
                return None
            peak, cost = max(peak, before + (c.f_over if kind == "F" else c.t_over)[i]), cost + c.fwd[i]
            live.add(i + 1)
            taped |= {i} if kind == "T" else set()
            if kind == "F" and drop and drop[0] and i:
                live.discard(i)
        elif kind == "B":
            if i not in taped or i + 1 not in grads:
                return None
            if not back:
                back, peak = True, max(peak, before + c.loss)
                before = alive()
            peak = max(peak, before + c.b_over[i])
            taped.discard(i)
            live.discard(i + 1)
            grads = (grads - ({i + 1} if i + 1 != n else set())) | {i}
        else:
            live.discard(i)
        peak = max(peak, alive())
    return (int(peak), cost) if 0 in grads else None


def _split(s: int, split: int, right: list, left: list) -> list:
    return [("F", s, False), *(("F", j, True) for j in range(s + 1, split)), *right, ("del", split), *left]


def schedules(e: int, s: int = 0) -> Iterator[list]:
    """Every persistent schedule of layers [s, e)."""
    for rest in ([[]] if e == s + 1 else schedules(e, s + 1)):
        yield [("T", s), *rest, ("B", s)]
    for split in range(s + 1, e):
        for right in schedules(e, split):
            for left in schedules(split, s):
                yield _split(s, split, right, left)


def read_back(how: Any, u: dict, s: int, e: int, m: int, n: int) -> list | None:
    """The ops the student's `how` chooses, or None where it chooses nothing or an impossible split."""
    choice = int(how[s, e, min(m, how.shape[2] - 1)]) if m >= 0 else -1
    if choice == 0:
        inner = read_back(how, u, s + 1, e, m - int(u["tape"][s] + u["x"][s + 1]), n) if e > s + 1 else []
        return None if inner is None else [("T", s), *inner, ("B", s)]
    if not s < choice < e:
        return None
    freed = int(u["grad_down"][e]) if e < n else -int(u["x"][n]) - u["loss"]
    right = read_back(how, u, choice, e, m - int(u["x"][choice]), n)
    left = read_back(how, u, s, choice, m + freed - int(u["grad"][choice]), n)
    return None if right is None or left is None else _split(s, choice, right, left)


def cases() -> list[tuple[Costs, list[int], int]]:
    """Chains of 1 to 6 layers from a fixed seed, each with the budgets at which the best schedule changes, in
    bytes; four of them again in units of 2 bytes (rounded); under `labkit grade`, 6 more of up to 6 layers
    from the run's seed."""
    out = [(c, b, 1) for c, b in _chains(np.random.default_rng(35), 12, 6)]
    out += [(c, b, 2) for c, b, _ in out[1:5]]
    drawn = hidden("3.5")
    return out if drawn is None else out + [(c, b, 1) for c, b in
                                            _chains(np.random.default_rng(drawn.randrange(2**32)), 6, 6)]


def _chains(rng: np.random.Generator, count: int, longest: int) -> list[tuple[Costs, list[int]]]:
    out = [(Costs([2] * 5, [2] * 5, [0] * 4, [2] * 4, [2] * 4, [2] * 4, [1.0] * 4, 1), [])]  # uniform, 4 layers
    for _ in range(count):
        n = int(rng.integers(1, longest + 1))
        x = [int(v) for v in rng.integers(1, 4, n + 1)]
        more = lambda base, most=3: [b + int(v) for b, v in zip(base, rng.integers(0, most, n))]  # noqa: E731
        grad = [int(v) for v in rng.integers(1, 5, n)] + [1]  # a gradient's bytes apart from its tensor's
        out.append((Costs(x, grad, [int(v) for v in rng.integers(0, 3, n)], more(x[1:], 6), more(x[1:], 7),
                          more(grad[:n], 4), [float(v) for v in rng.integers(1, 6, n)], int(rng.integers(0, 3))), []))
    for costs, budgets in out:
        peaks = sorted({r[0] for r in (simulate(ops, costs) for ops in schedules(costs.n)) if r})
        budgets += [peaks[0] - 1, *peaks]
    return out


@remote
def ex_3_5(optimal_tables: Callable[..., Any]) -> None:
    """Exercise 3.5: the tables' least cost is exhaustive search's at every budget, and the schedule read
    back from them fits and costs that much."""
    __tracebackhide__ = True
    need_callable("3.5", "optimal_tables", optimal_tables)
    checked = cases()
    for costs, budgets, unit in checked:
        simulated = [r for r in (simulate(ops, costs) for ops in schedules(costs.n)) if r]
        for budget in budgets:
            what = f"optimal_tables(OpCosts({costs}), units of {unit} B at budget {budget} B)"
            u = units(costs, budget, unit)
            got = call("3.5", what, H.OPT_SPEC, optimal_tables, costs, u)
            try:
                best, how, root = got  # under `labkit grade` the arrays come back as tensors
                best, how = np.asarray(best, dtype=float), np.asarray(how)
                value = float(best[root + u["top"]])
            except (TypeError, ValueError, IndexError):
                raise CheckFailure("3.5", what, "(best, how, root) as the given code returns them", f"{got!r:.80}",
                                   H.OPT_SPEC) from None
            fits = [cost for peak, cost in simulated if peak <= budget]
            if unit > 1:  # rounded: it may miss what fits by a unit, but what it says must fit and cost that
                fits = fits if np.isfinite(value) else []
            if not fits:
                if np.isfinite(value):
                    raise CheckFailure("3.5", f"{what}: the least cost", "inf (nothing fits)", value, H.OPT_FITS)
                continue
            if not np.isfinite(value) or (unit == 1 and value > min(fits) + 1e-9):
                raise CheckFailure("3.5", f"{what}: the least cost", min(fits), value, H.OPT_OPTIMAL)
            ops = read_back(how, u, 0, costs.n, u["top"], costs.n)
            result = None if ops is None else simulate(ops, costs)
            if result is None:
                raise CheckFailure("3.5", f"{what}: the schedule read back from how", "ops that run",
                                   "a choice of nothing, or a split outside the layers", H.OPT_HOW)
            if result[0] > budget or abs(result[1] - value) > 1e-9:
                raise CheckFailure("3.5", f"{what}: the schedule read back from how",
                                   f"a peak at most {budget} costing {value:g}",
                                   f"peak {result[0]}, cost {result[1]:g}", H.OPT_FITS)
    longest = max(c.n for c, _, _ in checked)
    passed("3.5", f"optimal_tables matches exhaustive search over every persistent schedule on {len(checked)} "
                  f"chains of up to {longest} layers (four again in 2-byte units), at every budget where the best "
                  "changes; the schedules read back fit and cost that")
