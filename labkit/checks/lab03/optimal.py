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


def simulate(ops: list[tuple], c: Costs, trace: list | None = None) -> tuple[int, float] | None:
    """(peak, forward cost) of ops ("F", i, drop), ("T", i), ("B", i), ("del", i); None if one cannot run.
    `trace` (a list) receives (op, the peak so far) after each op."""
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
        if trace is not None:
            trace.append(((kind, i, *drop), int(peak)))
    return (int(peak), cost) if 0 in grads else None


def first_over(ops: list[tuple], c: Costs, budget: int) -> tuple | None:
    """The first op whose moment takes the memory above `budget` (None: none does)."""
    trace: list = []
    simulate(ops, c, trace)
    return next((op for op, peak in trace if peak > budget), None)


OVER = {"F": H.OPT_FITS_F, "T": H.OPT_FITS_T, "B": H.OPT_FITS_B}  # the hint for the op that overflows


def layout(u: dict, n: int) -> tuple[int, int, Callable[[int, int], int]]:
    """The given code's table layout: a row's width (m = 0 .. width - 1), its pad, and where m = 0 of row (s, e) is."""
    width = u["top"] + int(u["x"].max()) + 1
    pad = int(max(u["x"].max() + u["tape"].max(), u["grad"].max() + u["x"].max() + u["loss"])) + 1
    return width, pad, lambda s, e: ((n + 1) * s + e) * (width + 2 * pad) + pad


def base_row(u: dict, s: int, n: int, width: int, fwd: float, late: bool = True) -> np.ndarray:
    """C(s, s+1, m) for m = 0 .. width - 1, as the text gives it: fwd where T s fits (t[s]) and B s fits after it
    (its output, its graph, b[s], and the loss when s is the chain's last layer), else inf."""
    m = np.arange(width)
    loss = u["loss"] if late and s == n - 1 else 0
    fits = (m >= u["t"][s]) & (m >= u["x"][s + 1] + u["tape"][s] + u["b"][s] + loss)
    return np.where(fits, fwd, np.inf)


def check_layout(best: np.ndarray, u: dict, n: int, what: str) -> None:
    """Every row (s, e) of best as the docstring lays it out: `pad` columns of inf before it, `pad` copies of its
    last value after it."""
    __tracebackhide__ = True
    width, pad, start = layout(u, n)
    if len(best) != (n + 1) * (n + 1) * (width + 2 * pad):
        raise CheckFailure("3.5", f"{what}: the entries of best", (n + 1) * (n + 1) * (width + 2 * pad), len(best),
                           H.OPT_SPEC)
    for s, e in ((s, e) for s in range(n) for e in range(s + 1, n + 1)):
        at = start(s, e)
        if not (np.isinf(best[at - pad:at]).all() and (best[at + width:at + width + pad] == best[at + width - 1]).all()):
            raise CheckFailure("3.5", f"{what}: the pads of row ({s}, {e}) of best", "inf before it, copies of its "
                               "last value after it", f"{_row(best[at - pad:at])} before, "
                               f"{_row(best[at + width:at + width + pad])} after", H.OPT_SPEC)


def check_base(best: np.ndarray, how: np.ndarray, u: dict, costs: Costs, what: str) -> None:
    """The tables' one-layer rows, (s, s+1), against the base case; `how` there: 0 where it fits, else -1."""
    __tracebackhide__ = True
    n = costs.n
    check_layout(best, u, n, what)
    width, _, start = layout(u, n)
    for s in range(n):
        want = base_row(u, s, n, width, costs.fwd[s])
        try:
            got = best[start(s, s + 1):start(s, s + 1) + width]
            chosen = how[s, s + 1, :width]
        except IndexError:
            raise CheckFailure("3.5", what, "tables in the given layout", f"best of {len(best)} entries, how of "
                               f"shape {getattr(how, 'shape', None)}", H.OPT_SPEC) from None
        if np.array_equal(got, want):
            if not np.array_equal(chosen, np.where(np.isfinite(want), 0, -1)):
                raise CheckFailure("3.5", f"{what}: how[{s}, {s + 1}] (the base case)", "0 where it fits, else -1",
                                   _row(chosen), H.OPT_HOW)
            continue
        same_fit = np.array_equal(np.isfinite(got), np.isfinite(want))
        hint = (H.OPT_LATE if np.array_equal(got, base_row(u, s, n, width, costs.fwd[s], late=False)) else
                H.OPT_BASE_COST if same_fit else H.OPT_BASE_FITS)
        raise CheckFailure("3.5", f"{what}: C({s}, {s + 1}, m) for m = 0..{width - 1} (the base case)", _row(want),
                           _row(got), hint)


def _row(values: np.ndarray) -> str:
    """A row of a table, short: runs of one value written once."""
    out, last, count = [], None, 0
    for v in list(values) + [object()]:
        if count and v != last:
            out.append(f"{last:g}" + (f" x{count}" if count > 1 else ""))
            count = 0
        last, count = v, count + 1
    return "[" + ", ".join(out) + "]"


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
    bytes; four of them again in units of 2 bytes (rounded); then chains whose forward runs (F), or whose tapes
    (T), reach far above their outputs, so that what that op has alive decides what fits; under `labkit grade`,
    6 more chains, 10 whose forward runs and 6 whose tapes reach far, of up to 6 layers, from the run's seed."""
    out = [(c, b, 1) for c, b in _chains(np.random.default_rng(35), 12, 6)]
    out += [(c, b, 2) for c, b, _ in out[1:5]]
    out += [(c, b, 1) for reach, count in (("F", 6), ("T", 4))
            for c, b in _chains(np.random.default_rng(0), count, 5, reach)[1:]]
    drawn = hidden("3.5")
    if drawn is None:
        return out
    rng = np.random.default_rng(drawn.randrange(2**32))
    return out + [(c, b, 1) for reach, count in (("", 6), ("F", 10), ("T", 6)) for c, b in _chains(rng, count, 6, reach)[1:]]


def _chains(rng: np.random.Generator, count: int, longest: int, reach: str = "") -> list[tuple[Costs, list[int]]]:
    """A uniform chain, then `count` drawn of 1 to `longest` layers, each with every budget at which the best
    changes. reach "F" or "T": 3 to `longest` layers, each such op reaching 4 to 15 units above its output (the
    other at most one), inputs of 1 to 6 units, small gradients."""
    out = [(Costs([2] * 5, [2] * 5, [0] * 4, [2] * 4, [2] * 4, [2] * 4, [1.0] * 4, 1), [])]  # uniform, 4 layers
    for _ in range(count):
        n = int(rng.integers(3 if reach else 1, longest + 1))
        x = [int(v) for v in rng.integers(1, 7 if reach else 4, n + 1)]
        more = lambda base, least, most: [b + int(v) for b, v in zip(base, rng.integers(least, most, n))]  # noqa: E731
        grad = [int(v) for v in rng.integers(1, 3 if reach else 5, n)] + [1]  # a gradient's bytes apart from its tensor's
        far, near = more(x[1:], 4, 16), more(x[1:], 0, 2)
        f, t = {"F": (far, near), "T": (near, far)}.get(reach, (more(x[1:], 0, 6), more(x[1:], 0, 7)))
        out.append((Costs(x, grad, [int(v) for v in rng.integers(0, 2 if reach else 3, n)], f, t,
                          more(grad[:n], 0, 3 if reach else 4), [float(v) for v in rng.integers(1, 6, n)],
                          int(rng.integers(0, 3))), []))
    for costs, budgets in out:
        peaks = sorted({r[0] for r in (simulate(ops, costs) for ops in schedules(costs.n)) if r})
        budgets += [peaks[0] - 1, *peaks]
    return out


def _read_schedule(best: np.ndarray, how: Any, u: dict, costs: Costs, budget: int, value: float, what: str) -> None:
    """The schedule read back from `how` runs, fits the budget (else: the op that does not fit) and costs `value`."""
    __tracebackhide__ = True
    ops = read_back(how, u, 0, costs.n, u["top"], costs.n)
    result = None if ops is None else simulate(ops, costs)
    if result is None:
        raise CheckFailure("3.5", f"{what}: the schedule read back from how", "ops that run",
                           "a choice of nothing, or a split outside the layers", diagnose(best, how, u, costs))
    over = first_over(ops, costs, budget)
    if over is not None:
        shown = " ".join(str(part) for part in over[:2])
        raise CheckFailure("3.5", f"{what}: the schedule read back from how", f"a peak at most {budget}",
                           f"peak {result[0]}, first over the budget at {shown} ({_ops(ops)})", OVER[over[0]])
    if abs(result[1] - value) > 1e-9:
        raise CheckFailure("3.5", f"{what}: the schedule read back from how", f"a cost of {value:g}, the table's",
                           f"{result[1]:g}", diagnose(best, how, u, costs))


def diagnose(best: np.ndarray, how: Any, u: dict, costs: Costs) -> str:
    """Why the tables disagree with themselves, along the schedule `how` chooses from the top: at some (s, e, m),
    best is no way's cost from the parts' rows at the memory the text gives them (the memory shifts are wrong),
    or it is one, but not the way how names."""
    n, fwd = costs.n, costs.fwd
    width, pad, start = layout(u, n)

    def at(s: int, e: int, m: int) -> float:
        return float(best[start(s, e) + min(m, width - 1)]) if m >= 0 else np.inf

    def ways(s: int, e: int, m: int) -> dict[int, tuple[float, list]]:
        """Each way's cost from the parts' rows, and the parts: {0: tape, s': forward to s'}."""
        out = {0: (fwd[s] + (at(s + 1, e, m - int(u["tape"][s] + u["x"][s + 1])) if e > s + 1 else 0.0),
                   [(s + 1, e, m - int(u["tape"][s] + u["x"][s + 1]))] if e > s + 1 else [])}
        freed = int(u["grad_down"][e]) if e < n else -int(u["x"][n]) - u["loss"]
        for split in range(s + 1, e):
            parts = [(split, e, m - int(u["x"][split])), (s, split, m + freed - int(u["grad"][split]))]
            out[split] = (sum(fwd[s:split]) + sum(at(*p) for p in parts), parts)
        return out

    todo = [(0, n, int(u["top"]))]
    while todo:
        s, e, m = todo.pop()
        here, options = at(s, e, m), ways(s, e, m)
        if not np.isfinite(here):
            continue
        if not any(abs(cost - here) <= 1e-9 for cost, _ in options.values()):
            return H.OPT_SHIFTS
        chosen = int(how[s, e, min(max(m, 0), how.shape[2] - 1)])
        if chosen not in options or abs(options[chosen][0] - here) > 1e-9:
            return H.OPT_HOW
        todo += options[chosen][1]
    return H.OPT_HOW


def _ops(ops: list[tuple]) -> str:
    text = ", ".join(" ".join(str(part) for part in op[:2]) for op in ops)
    return text if len(text) <= 160 else text[:157] + "..."


@remote
def ex_3_5(optimal_tables: Callable[..., Any]) -> None:
    """Exercise 3.5: the tables' base case is the text's; their least cost is exhaustive search's at every
    budget, and the schedule read back from them fits and costs that much."""
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
            check_base(best, how, u, costs, what)
            fits = [cost for peak, cost in simulated if peak <= budget]
            if unit > 1:  # rounded: it may miss what fits by a unit, but what it says must fit and cost that
                fits = fits if np.isfinite(value) else []
            if fits and (not np.isfinite(value) or (unit == 1 and value > min(fits) + 1e-9)):
                raise CheckFailure("3.5", f"{what}: the least cost", min(fits), value, H.OPT_OPTIMAL)
            if np.isfinite(value):  # what it found must fit, even where exhaustive search says nothing does
                _read_schedule(best, how, u, costs, budget, value, what)
    longest = max(c.n for c, _, _ in checked)
    passed("3.5", f"optimal_tables matches exhaustive search over every persistent schedule on {len(checked)} "
                  f"chains of up to {longest} layers (four again in 2-byte units; forward runs and tapes that reach "
                  "far among them), at every budget where the best changes; the base case is the text's; the "
                  "schedules read back fit and cost that")
