"""Exercises 4.2 and 4.3: greedy and knapsack planners, against the checker's own greedy and exhaustive search."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from collections.abc import Callable, Sequence
from typing import Any

from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote
from labkit.checks.lab04 import hints as H
from labkit.checks.lab04.common import call, expect_error, profiles, record
from labkit.instruments.ops import OpRecord


def _keepable(r: OpRecord) -> bool:
    return r.output_bytes > 0 and not r.is_view and not r.mutated


def _candidates(ops: Sequence[OpRecord]) -> list[OpRecord]:
    """Lab 04's candidates, written again: keepable, and no random op before a random op that is not."""
    never = [i for i, r in enumerate(ops) if r.random and not _keepable(r)]
    return [r for i, r in enumerate(ops) if _keepable(r) and not (r.random and never and i < never[-1])]


def _bytes(r: OpRecord) -> int:
    return 0 if r.is_output else r.output_bytes


def _random_ok(ops: Sequence[OpRecord], keep: frozenset[str] | set[str]) -> bool:
    kinds = [r.key in keep for r in ops if r.random]
    return kinds == sorted(kinds)


def greedy(ops: Sequence[OpRecord], budget: int, later_first: bool = False) -> frozenset[str]:
    """The greedy of Exercise 4.2, written again here so that the check does not trust the notebook's; later_first:
    ties broken toward the later op (a mistake, to name it)."""
    items = _candidates(ops)
    keep = {r.key for r in items}
    order = {r.key: i for i, r in enumerate(items)}
    for r in sorted(items, key=lambda r: (-_bytes(r) / r.seconds, -order[r.key] if later_first else order[r.key])):
        if sum(_bytes(q) for q in items if q.key in keep) <= budget:
            break
        keep.discard(r.key)
        if r.random:
            keep -= {q.key for q in items[:items.index(r)] if q.random}
    return frozenset(keep)


def best_seconds(ops: Sequence[OpRecord], budget: int) -> float:
    """The most seconds any allowed subset of the candidates keeps within `budget` bytes, by brute force."""
    items, best = _candidates(ops), 0.0
    for pick in itertools.product([False, True], repeat=len(items)):
        keep = {r.key for r, p in zip(items, pick) if p}
        if sum(_bytes(r) for r in items if r.key in keep) <= budget and _random_ok(ops, keep):
            best = max(best, sum(r.seconds for r in items if r.key in keep))
    return best


def _fill_in_units(items: Sequence[OpRecord], budget: int, most: int) -> float:
    """The most seconds a subset of `items` keeps within `budget` counted as Exercise 4.3's fill counts: units of
    the weights' gcd, or of ceil(budget / most) bytes where that would need more than `most` units, each weight
    rounded up (by brute force over the subsets)."""
    weights = [_bytes(r) for r in items]
    unit = math.gcd(*weights) or 1
    if budget // unit > most:
        unit = -(-budget // most)
    units = [-(-w // unit) for w in weights]
    return max(sum(r.seconds for r, p in zip(items, pick) if p)
               for pick in itertools.product([False, True], repeat=len(items))
               if sum(u for u, p in zip(units, pick) if p) <= budget // unit)


def best_in_units(ops: Sequence[OpRecord], budget: int, most: int) -> float:
    """The seconds Exercise 4.3's knapsack keeps: the best suffix of the random candidates, charged in bytes, plus
    what _fill_in_units keeps of the others in the bytes left."""
    items = _candidates(ops)
    rand, rest = [r for r in items if r.random], [r for r in items if not r.random]
    best = -1.0
    for first in range(len(rand) + 1):
        left = budget - sum(_bytes(r) for r in rand[first:])
        if left >= 0:
            best = max(best, _fill_in_units(rest, left, most) + sum(r.seconds for r in rand[first:]))
    return best


def _label(ops: Sequence[OpRecord], budget: int) -> str:
    shown = ", ".join(f"{r.key}{' (view)' if r.is_view else ' (output)' if r.is_output else ''}"
                      f"{' (in place)' if r.in_place else ''}{' (changed later)' if r.mutated else ''}: "
                      f"{r.output_bytes} B {r.seconds * 1e3:g} ms" for r in ops)
    return f"[{shown}], budget={budget}"


def _result(ex: str, what: str, got: Any, ops: Sequence[OpRecord], spec: str, only: str) -> frozenset[str]:
    __tracebackhide__ = True
    if not isinstance(got, (frozenset, set)) or not all(isinstance(k, str) for k in got):
        raise CheckFailure(ex, what, "a frozenset of op keys", f"{type(got).__name__} {got!r:.80}", spec)
    allowed = {r.key for r in _candidates(ops)}
    if set(got) - allowed:
        raise CheckFailure(ex, what, f"keys among the candidates {sorted(allowed)}", sorted(got), only)
    return frozenset(got)


def _bad_budgets(ex: str, fn: Callable[..., Any], ops: Sequence[OpRecord]) -> None:
    __tracebackhide__ = True
    expect_error(ex, "budget=-1", ValueError, "-1", H.BUDGET_CHECK, lambda: fn(ops, -1))
    expect_error(ex, "budget=1.5", TypeError, "1.5", H.BUDGET_CHECK, lambda: fn(ops, 1.5))


def _hidden_profiles(ex: str) -> list[tuple[list[OpRecord], int]]:
    """labkit grade: profiles drawn from a seed the student never saw (none in a notebook)."""
    rng = hidden(ex)
    return [] if rng is None else profiles(12, 9, seed=rng.randrange(2 ** 32))


@remote
def ex_4_2(greedy_keep: Callable[..., Any]) -> None:
    """Exercise 4.2: greedy_keep keeps what the checker's greedy keeps, on made-up profiles."""
    __tracebackhide__ = True
    need_callable("4.2", "greedy_keep", greedy_keep)
    # dropping the second dropout first (the most bytes per second) must drop the first one too
    # ... and two candidates with the same bytes per second, of which dropping one is enough: the earlier goes
    cases = [([record("native_dropout", 0, 64, 9e-3, random=True), record("add", 0, 64, 1e-3),
               record("native_dropout", 1, 128, 1e-3, random=True)], 128),
             ([record("add", 0, 64, 1e-3), record("mul", 0, 64, 1e-3), record("gelu", 0, 64, 4e-3)], 128),
             *profiles(), *_hidden_profiles("4.2")]
    for ops, budget in cases:
        what = f"greedy_keep({_label(ops, budget)})"
        got = _result("4.2", what, call("4.2", what, H.GREEDY_SPEC, greedy_keep, ops, budget), ops, H.GREEDY_SPEC,
                      H.GREEDY_CANDIDATES)
        want = greedy(ops, budget)
        if got != want:
            hint = H.GREEDY_RANDOM if not _random_ok(ops, got) else \
                H.GREEDY_TIES if got == greedy(ops, budget, later_first=True) else H.GREEDY_ORDER
            raise CheckFailure("4.2", what, sorted(want), sorted(got), hint)
    _bad_budgets("4.2", greedy_keep, cases[0][0])
    passed("4.2", f"greedy_keep keeps what greedy by bytes per second keeps on {len(cases)} profiles, ties to the "
                  "earlier op; bad budgets refused")


@remote
def ex_4_3(knapsack_keep: Callable[..., Any]) -> None:
    """Exercise 4.3: knapsack_keep fits the budget and keeps the most seconds, as exhaustive search finds."""
    __tracebackhide__ = True
    need_callable("4.3", "knapsack_keep", knapsack_keep)
    # two dropouts where the best set without the suffix rule keeps the first and recomputes the second
    # ... and nn.Dropout on a CPU after a kept-worthy dropout: bernoulli_, in place, is always recomputed
    cases = [([record("native_dropout", 0, 128, 9e-3, random=True), record("add", 0, 64, 1e-3),
               record("native_dropout", 1, 128, 1e-3, random=True)], 192),
             ([record("native_dropout", 0, 128, 9e-3, random=True), record("empty_like", 0, 64, 1e-3, mutated=True),
               record("bernoulli_", 0, 0, 1e-3, random=True, in_place=True), record("mul", 0, 64, 1e-3)], 512),
             *profiles(seed=6), *_hidden_profiles("4.3")]
    for ops, budget in cases:
        what = f"knapsack_keep({_label(ops, budget)})"
        got = _result("4.3", what, call("4.3", what, H.KNAP_SPEC, knapsack_keep, ops, budget), ops, H.KNAP_SPEC,
                      H.KNAP_CANDIDATES)
        used = sum(_bytes(r) for r in ops if r.key in got)
        if used > budget:
            raise CheckFailure("4.3", f"{what}: bytes kept", f"at most {budget}", used, H.KNAP_FITS)
        if not _random_ok(ops, got):
            raise CheckFailure("4.3", f"{what}: the random ops kept", "a suffix of them (random_ok)", sorted(got),
                               H.KNAP_RANDOM)
        kept, best = sum(r.seconds for r in ops if r.key in got), best_seconds(ops, budget)
        if kept < best - 1e-12:
            raise CheckFailure("4.3", f"{what}: seconds kept", f"{best * 1e3:g} ms", f"{kept * 1e3:g} ms",
                               H.KNAP_OPTIMAL)
    for ops, budget, most in _unit_cases():  # counted in units: each set fits, and keeps what the units allow
        what = f"knapsack_keep({_label(ops, budget)}, most={most})"
        got = _result("4.3", what, call("4.3", what, H.KNAP_SPEC, knapsack_keep, ops, budget, most=most), ops,
                      H.KNAP_SPEC, H.KNAP_CANDIDATES)
        used = sum(_bytes(r) for r in ops if r.key in got)
        if used > budget:
            raise CheckFailure("4.3", f"{what}: bytes kept", f"at most {budget}", used, H.KNAP_FITS)
        kept, best = sum(r.seconds for r in ops if r.key in got), best_in_units(ops, budget, most)
        if not math.isclose(kept, best, rel_tol=1e-9, abs_tol=1e-12):
            raise CheckFailure("4.3", f"{what}: seconds kept, counted in units as the spec says", f"{best * 1e3:g} ms",
                               f"{kept * 1e3:g} ms", H.KNAP_MOST if kept > best else H.KNAP_OPTIMAL)
    _bad_budgets("4.3", knapsack_keep, cases[0][0])
    passed("4.3", f"knapsack_keep fits the budget and keeps the most seconds on {len(cases)} profiles, as "
                  "exhaustive search finds; counted in units (gcd, or ceil(budget / most)) it keeps what the spec's "
                  "rounding allows and stays within budget")


def _unit_cases() -> list[tuple[list[OpRecord], int, int]]:
    """Budgets counted in units: (ops, budget, most), the small ones first (a `fill` without the cap is slow on
    the big ones). Ops of 300, 300, 301 and 150 bytes within 901: the gcd (1) would need 901 units, more than
    most=8, so units of 113 bytes, in which two fit (in bytes three would; rounded down, all four, which do not
    fit in bytes); three ops of 300 bytes within 900: units of 300 (the gcd) fit in most, and all three fit;
    made-up profiles with bytes far above `most` units; and drawn ones in grading."""
    ms = [record(name, 0, nbytes, 1e-3) for name, nbytes in (("add", 300), ("mul", 300), ("gelu", 301), ("div", 150))]
    even = [record(name, 0, 300, 1e-3) for name in ("add", "mul", "gelu")]
    cases = [(ms, 901, 8), (even, 900, 8)]
    for ops, _ in profiles(12, 9, seed=8):
        big = [replace(r, output_bytes=r.output_bytes * 1009 + 7 if r.output_bytes else 0) for r in ops]
        cases.append((big, sum(_bytes(r) for r in _candidates(big)) * 2 // 3, 8))
    rng = hidden("4.3")
    if rng is not None:  # labkit grade: profiles and caps drawn from a seed the student never saw
        for ops, _ in profiles(8, 7, seed=rng.randrange(2 ** 32)):
            scale = rng.randrange(3, 40)
            big = [replace(r, output_bytes=r.output_bytes * scale + rng.randrange(0, 9) if r.output_bytes else 0)
                   for r in ops]
            total = sum(_bytes(r) for r in _candidates(big))
            cases.append((big, rng.randrange(0, total + 2), rng.choice([4, 8, 16, 64])))
    return cases
