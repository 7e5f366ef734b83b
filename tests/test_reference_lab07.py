"""Lab 07's reference planner (labkit.reference.capstone) held against an independent brute force: every plan of
a drawn small Profile (every split of its blocks into recomputed segments and single-block ways) is listed and
priced with labkit.plans' own check_plan, peak_of and seconds_of, at the byte unit plan_blocks counts in, exact
(the common divisor of the byte counts, the default on small profiles) or coarse (a small `most`: byte counts
rounded up). Held: the plan is never over budget and never costlier than any plan brute force fits within the
budget less the rounding's worst case (see `slack`: 0 at an exact unit, (n + 1) * (u - 1) bytes at a coarse
one); it is None exactly when brute force fits nothing within that; least_budget is the least budget plan_blocks
accepts (budget - 1 refused) and, at an exact unit, the least peak of any plan; plan_for raises a ValueError
naming it.
"""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import labkit.reference.capstone as C
from labkit.checks.lab07.planner import every_plan  # the checker's enumeration of every plan
from labkit.plans import (
    KEEP, OFFLOAD, SELECTIVE, BlockCosts, Option, Profile, Step, check_plan, peak_of, scheme_plan, seconds_of,
)

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def priced(profile: Profile) -> list[tuple[int, float]]:
    """(peak_of, seconds_of) of every plan, each checked by check_plan."""
    plans = list(every_plan(profile))
    assert all(check_plan(p, profile) == p for p in plans)
    assert len({tuple(p) for p in plans}) == len(plans)
    return [(peak_of(p, profile), seconds_of(p, profile)) for p in plans]


def unit_of(profile: Profile, most: int) -> tuple[int, bool]:
    """The planner's unit as its docstring says, and whether it divides every byte count (rounding is exact)."""
    values = [v for b in profile.blocks for o in b.ways().values() for v in (o.kept, o.held)]
    values += [v for b in profile.blocks for v in (b.inp, b.beside, b.act)]
    g = max(1, math.gcd(*values))
    total = sum(b.act + b.inp + b.beside for b in profile.blocks)
    unit = g if total // g <= most else -(-total // most)
    return unit, all(v % unit == 0 for v in values)


def slack(profile: Profile, most: int) -> int:
    """Bytes of budget the rounding may cost a plan: 0 at an exact unit, else (n + 1) * (u - 1).

    plan_blocks rounds every byte count up to the unit u and the budget down. One moment of a plan sums at most
    n + 1 rounded terms (the top of the step: one kept count per step; a block's backward: one per step before
    it, plus its held and beside, or a segment's rebuilt acts and beside), each over-counted by at most u - 1
    bytes, so a plan whose peak_of is at most budget - (n + 1) * (u - 1) is always admitted. At an exact unit
    (u divides every byte count) nothing is lost. A coarse unit can thus refuse a budget that brute force fits
    by more than one unit (the last test: by 100 B, units of 51 B), though by less than n + 1 units.
    """
    unit, exact = unit_of(profile, most)
    return 0 if exact else (len(profile.blocks) + 1) * (unit - 1)


@st.composite
def profiles(draw, most_blocks: int = 5) -> Profile:
    """Small profiles: byte counts of a drawn scale (an exact unit above 1) or jittered (gcd 1), every block
    with selective, some with offload; seconds in quarters, so sums are exact."""
    scale, jitter = draw(st.sampled_from([1, 8, 64])), draw(st.integers(0, 2)) == 0
    nbytes = lambda lo, hi: draw(st.integers(lo, hi)) * scale + (draw(st.integers(0, 3)) if jitter else 0)  # noqa: E731
    secs = lambda hi: draw(st.integers(0, hi)) / 4  # noqa: E731
    blocks = []
    for _ in range(draw(st.integers(1, most_blocks))):
        inp = nbytes(0, 6)
        act = inp + nbytes(0, 20)
        kept = draw(st.integers(inp, act))
        options = {SELECTIVE: Option(kept, max(kept, act - scale * draw(st.integers(0, 2))), secs(8))}
        if draw(st.booleans()):
            options[OFFLOAD] = Option(0, act, secs(16))
        blocks.append(BlockCosts(act, inp, secs(16), options, nbytes(0, 12)))
    return Profile(tuple(blocks), nbytes(0, 10), nbytes(0, 40), 1.0)


MOST = st.sampled_from([2, 5, 16, 4096, 4096])  # 4096, the default: exact on these sizes unless jittered


@given(profiles(), MOST, st.data())
@SETTINGS
def test_the_plan_fits_and_is_no_costlier_than_any_plan_brute_force_fits_within_the_rounding(profile, most, data):
    assert C._units(profile, most) == unit_of(profile, most)[0]  # the unit the tolerance is derived for
    costs = priced(profile)
    tol = slack(profile, most)
    edges = sorted({q for p, _ in costs for q in (p - 1, p, p + tol - 1, p + tol) if q >= 1} | {1})  # where fits flip
    low, high = max(1, min(p for p, _ in costs) - 2), max(edges) + 1
    budget = data.draw(st.one_of(st.sampled_from(edges), st.floats(0, 1).map(lambda f: int(low + f * (high - low)))),
                       label="budget")
    got = C.plan_blocks(profile, budget, most)
    fits = [s for p, s in costs if p <= budget]  # what any correct planner may choose from
    sure = [s for p, s in costs if p + tol <= budget]  # what rounding up cannot lose
    if got is None:
        assert not sure, (budget, tol, min(p for p, _ in costs))
        return
    assert check_plan(got, profile) == got
    assert peak_of(got, profile) <= budget
    assert fits and seconds_of(got, profile) >= min(fits) - 1e-9
    if sure:
        assert seconds_of(got, profile) <= min(sure) + 1e-9
    if tol == 0:  # an exact unit: the optimum of brute force, and None only when nothing fits (sure == fits)
        assert seconds_of(got, profile) == pytest.approx(min(fits), abs=1e-9)


@given(profiles(), MOST)
@SETTINGS
def test_least_budget_is_the_least_budget_the_planner_accepts(profile, most):
    least = C.least_budget(profile, most)
    assert C.best_plan(profile, least, most) is not None
    assert least == 1 or C.best_plan(profile, least - 1, most) is None
    lowest = max(1, min(p for p, _ in priced(profile)))  # the least peak of any plan
    assert lowest <= least <= lowest + slack(profile, most)
    if slack(profile, most) == 0:
        assert least == lowest


@given(profiles(most_blocks=4), st.integers(1, 400))
@example(Profile(tuple(BlockCosts(act, 0, 0.0, {SELECTIVE: Option(0, act, 0.0)}, beside)
                       for act, beside in ((1280, 0), (1280, 0), (768, 769))), 0, 0, 1.0), 1)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_plan_for_is_best_plan_or_a_value_error_naming_the_least_budget(profile, budget):
    # best_plan, not plan_blocks: at a fixed scheme's own peak plan_blocks's rounding can lose a plan that a scheme
    # checked to the byte keeps (hypothesis found one: three blocks, least budget 1,537 B, plan_blocks None there)
    want = C.best_plan(profile, budget)
    if want is not None:
        assert C.plan_for(profile, budget) == want and peak_of(want, profile) <= budget
        return
    least = C.least_budget(profile)
    assert least > budget
    with pytest.raises(ValueError, match=re.escape(f"budget={budget:,} B")) as info:
        C.plan_for(profile, budget)
    assert f"the least that fits is {least:,} B ({least / 2**20:.2f} MiB)" in str(info.value)
    assert f"budget={budget:,} B ({budget / 2**20:.2f} MiB)" in str(info.value)
    assert C.plan_for(profile, least) == C.best_plan(profile, least) is not None


def test_a_coarse_unit_refuses_budgets_brute_force_fits_by_more_than_one_unit_within_the_bound():
    # four blocks of 101 B kept and a 1 B input: 408 B in at most 8 units makes units of 51 B, 101 B rounds up
    # to 102 and 1 B to 51; recomputing each block alone peaks at 3 + 101 B, counted as 255 B, and the least
    # plan_blocks accepts is 204 B (4 units: blocks 0-1 as one segment, 2 and 3 alone, a true peak of 202 B).
    # best_plan checks the fixed schemes to the byte: full recomputation fits at its own peak, 104 B
    profile = Profile(tuple(BlockCosts(101, 1, 1.0) for _ in range(4)), 0, 0, 1.0)
    assert C._units(profile, 8) == unit_of(profile, 8)[0] == 51 and not unit_of(profile, 8)[1]
    lowest = min(p for p, _ in priced(profile))
    assert lowest == 104
    assert C.plan_blocks(profile, 203, 8) is None and C.plan_blocks(profile, 204, 8) is not None
    assert C.plan_blocks(profile, lowest + 51, 8) is None and C.plan_blocks(profile, 2**20, 8) == [
        Step(i, i + 1, KEEP) for i in range(4)]
    assert C.least_budget(profile, 8) == lowest
    assert C.best_plan(profile, lowest, 8) == scheme_plan("full", 4)
    assert C.least_budget(profile) == lowest  # the default most: an exact unit of 1 B


def test_plan_for_names_both_budgets_in_mebibytes_too():
    profile = Profile(tuple(BlockCosts(3 * 2**20, 2**20, 1.0) for _ in range(3)), 0, 0, 1.0)
    least = C.least_budget(profile)
    with pytest.raises(ValueError) as info:
        C.plan_for(profile, 2**20)
    assert f"budget={2**20:,} B (1.00 MiB)" in str(info.value)
    assert f"the least that fits is {least:,} B ({least / 2**20:.2f} MiB)" in str(info.value) and least > 2**20
