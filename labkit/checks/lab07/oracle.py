"""Lab 07's oracle: every plan of a small profile, priced to the byte (peak_of written again) and in the spec's unit
(`_units` written again), so that Exercise 7.1's check trusts neither labkit.plans nor the notebook's given code."""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from labkit.plans import RECOMPUTE, Profile, Step


def _costs(s: Any, profile: Profile) -> tuple[int, int, float]:
    blocks = profile.blocks[s.start:s.stop]
    if s.how == RECOMPUTE:
        rebuilt = [sum(b.act for b in blocks[:k + 1]) + blocks[k].beside for k in range(len(blocks))]
        return blocks[0].inp, max(rebuilt), sum(b.fwd for b in blocks)
    o = blocks[0].ways()[s.how]
    return o.kept, o.held + blocks[0].beside, o.seconds


def peak(plan: list, profile: Profile) -> int:
    """peak_of, written again here so that the check does not trust labkit.plans.plan' copy."""
    kept, worst = 0, 0
    for s in plan:
        keep, need, _ = _costs(s, profile)
        worst = max(worst, kept + need)
        kept += keep
    return max(profile.floor, profile.base + kept, worst)


def seconds(plan: list, profile: Profile) -> float:
    return sum(_costs(s, profile)[2] for s in plan)


def every_plan(profile: Profile, i: int = 0) -> Iterator[list[Step]]:
    """Every plan of blocks [i, n): each block one way, or a recomputed segment [i, j) for every j."""
    n = len(profile.blocks)
    if i == n:
        yield []
        return
    for way in profile.blocks[i].ways():
        for rest in every_plan(profile, i + 1):
            yield [Step(i, i + 1, way), *rest]
    for j in range(i + 1, n + 1):
        for rest in every_plan(profile, j):
            yield [Step(i, j, RECOMPUTE), *rest]


def unit_of(profile: Profile, most: int) -> int:
    """The unit the spec counts bytes in: the common divisor of every way's kept and held and every block's inp and
    beside, unless the blocks' act + inp + beside come to more than `most` of it; then total / most, rounded up."""
    values = [v for b in profile.blocks for o in b.ways().values() for v in (o.kept, o.held)]
    values += [v for b in profile.blocks for v in (b.inp, b.beside)]
    common = max(1, math.gcd(*values))
    total = sum(b.act + b.inp + b.beside for b in profile.blocks)
    return common if total // common <= most else -(-total // most)


def _step_in_units(s: Step, profile: Profile, unit: int) -> tuple[int, int, float]:
    """(kept, need, seconds) of one step in `unit`: every byte count rounded up (a segment's need: the most of its
    rebuilt acts and a block's beside, over its blocks)."""
    up = lambda v: -(-v // unit)  # noqa: E731
    blocks = profile.blocks[s.start:s.stop]
    if s.how != RECOMPUTE:
        o = blocks[0].ways()[s.how]
        return up(o.kept), up(o.held) + up(blocks[0].beside), o.seconds
    rebuilt, need = 0, 0
    for b in blocks:
        rebuilt += up(b.act)
        need = max(need, rebuilt + up(b.beside))
    return up(blocks[0].inp), need, sum(b.fwd for b in blocks)


def in_units(plan: list, profile: Profile, budget: int, unit: int,
             priced: dict[Step, tuple[int, int, float]] | None = None) -> tuple[bool, int]:
    """(fits, kept): whether the plan fits the budget counted in `unit` (every byte count rounded up, the rooms
    budget // unit for a backward and (budget - base) // unit for what the blocks keep), and the units it keeps.
    priced: each step's _step_in_units, filled as steps are met (one per profile and unit)."""
    priced = {} if priced is None else priced
    room, kept, fits = budget // unit, 0, budget >= profile.floor and budget >= profile.base
    for s in plan:
        if s not in priced:
            priced[s] = _step_in_units(s, profile, unit)
        keep, need, _ = priced[s]
        fits = fits and kept + need <= room
        kept += keep
    return fits and kept <= (budget - profile.base) // unit, kept


def best_in_units(plans: list[list[Step]], profile: Profile, budget: int, unit: int) -> tuple[float, int] | None:
    """(least seconds, the least units kept among the plans of those seconds) of the plans that fit in `unit`,
    or None when none does."""
    priced: dict[Step, tuple[int, int, float]] = {}
    found = []
    for p in plans:
        fits, kept = in_units(p, profile, budget, unit, priced)
        if fits:
            found.append((sum(priced[s][2] for s in p), kept))
    if not found:
        return None
    least = min(s for s, _ in found)
    return least, min(k for s, k in found if s <= least + 1e-9)
