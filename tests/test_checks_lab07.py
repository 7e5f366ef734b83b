"""Tests for the checker of 07_capstone: it passes the reference and catches each planted bug with its own hint."""
from __future__ import annotations

import dataclasses
import inspect
import time

import pytest

import labkit.reference.capstone as R
from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.checks.lab07 import hints as H
from labkit.checks.lab07.planner import every_plan, peak, seconds
from labkit.plans import RECOMPUTE, Option, Step


def _fails(*args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        checks.ex_7_1(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


def _on(change):
    """The reference planner run on a changed copy of the profile: what a planner that misreads it returns."""
    return lambda profile, budget: R.plan_blocks(change(profile), budget)


def _held_is_kept(profile):
    blocks = tuple(dataclasses.replace(b, options={k: Option(o.kept, o.kept, o.seconds) for k, o in b.options.items()})
                   for b in profile.blocks)
    return dataclasses.replace(profile, blocks=blocks)


def _each_block(profile, **change):
    return dataclasses.replace(profile, blocks=tuple(dataclasses.replace(b, **change) for b in profile.blocks))


def _largest_beside(profile):
    """Every block's beside raised to the largest one (a planner that does not tell the blocks' apart): its plans
    fit, but it misses some."""
    return _each_block(profile, beside=max(b.beside for b in profile.blocks))


def _last_beside_peak(plan, profile):
    """peak_of with a segment's backward needing all its act beside its last block's beside only (no running
    maximum over its blocks)."""
    kept, worst = 0, 0
    for s in plan:
        blocks = profile.blocks[s.start:s.stop]
        if s.how == RECOMPUTE:
            keep, need = blocks[0].inp, sum(b.act for b in blocks) + blocks[-1].beside
        else:
            o = blocks[0].ways()[s.how]
            keep, need = o.kept, o.held + blocks[0].beside
        worst, kept = max(worst, kept + need), kept + keep
    return max(profile.floor, profile.base + kept, worst)


def _edited(old, new):
    """The reference planner with one line of its source replaced: a mistake a student's numpy could make."""
    source = inspect.getsource(R.plan_blocks)
    assert old in source, old
    scope = dict(vars(R))
    exec(source.replace(old, new), scope)  # noqa: S102
    return scope["plan_blocks"]


NEED = "need = np.maximum.accumulate(rebuilt[i + 1:] - rebuilt[i] + beside[i:])"


def _brute(family, peak=peak):
    """A planner by brute force over the plans `family` allows: the cheapest of them that fits (by `peak`), or
    None."""
    def plan(profile, budget):
        if len(profile.blocks) > 8:
            return R.plan_blocks(profile, budget)
        fits = [p for p in every_plan(profile) if family(p, profile) and peak(p, profile) <= budget]
        return min(fits, key=lambda p: seconds(p, profile)) if fits else None
    return plan


def _greedy(profile, budget):
    """Keep each block while everything kept so far fits, else recompute it alone."""
    plan, kept = [], profile.base
    for i, b in enumerate(profile.blocks):
        how = "keep" if kept + b.act <= budget else RECOMPUTE
        kept += b.act if how == "keep" else b.inp
        plan.append(Step(i, i + 1, how))
    return plan if peak(plan, profile) <= budget else None


def _mutating(profile, budget):
    plan = R.plan_blocks(profile, budget)
    for b in profile.blocks:
        b.options.pop("offload", None)  # a dict inside the frozen dataclass
    return plan


def _slow(profile, budget):
    if len(profile.blocks) == 200:
        time.sleep(5.2)
    return R.plan_blocks(profile, budget)


def _raises(profile, budget):
    raise IndexError("index 3 is out of bounds for axis 0 with size 3")


BUGS = {
    "held ignored": (_on(_held_is_kept), H.PLAN_FITS),
    "floor ignored": (_on(lambda p: dataclasses.replace(p, floor=0)), H.PLAN_NONE),
    "base ignored": (_on(lambda p: dataclasses.replace(p, base=0)), H.PLAN_NONE),
    "beside ignored": (_on(lambda p: _each_block(p, beside=0)), H.PLAN_FITS),
    "the largest beside for every block": (_on(_largest_beside), H.PLAN_OPTIMAL),
    "a segment's last beside only": (_brute(lambda plan, p: True, peak=_last_beside_peak), H.PLAN_NONE),
    "no running maximum": (_edited(NEED, "need = rebuilt[i + 1:] - rebuilt[i] + beside[i:]"), H.PLAN_NONE),
    "strict <": (lambda p, b: R.plan_blocks(p, b - 1), H.PLAN_OPTIMAL),
    "one-block segments only": (_brute(lambda plan, p: all(s.stop == s.start + 1 for s in plan)), H.PLAN_OPTIMAL),
    "no selective or offload": (_brute(lambda plan, p: all(s.how in ("keep", RECOMPUTE) for s in plan)), H.PLAN_OPTIMAL),
    "greedy": (_greedy, H.PLAN_OPTIMAL),
    "always recompute": (_brute(lambda plan, p: all(s.how == RECOMPUTE for s in plan)), H.PLAN_OPTIMAL),
    "reversed": (lambda p, b: None if (r := R.plan_blocks(p, b)) is None else r[::-1], H.PLAN_COVER),
    "a tuple": (lambda p, b: None if (r := R.plan_blocks(p, b)) is None else tuple(r), H.PLAN_COVER),
    "way renamed": (lambda p, b: None if (r := R.plan_blocks(p, b)) is None else
                    [dataclasses.replace(s, how="full") if s.how == RECOMPUTE else s for s in r], H.PLAN_COVER),
    "mutates the profile": (_mutating, H.PLAN_MUTATES),
    "slow": (_slow, H.PLAN_SLOW),
    "raises": (_raises, H.PLAN_SPEC),
}


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_fails_with_its_hint(bug):
    fn, hint = BUGS[bug]
    failure = _fails(fn)
    assert failure.hint == hint, failure


def test_a_failure_names_the_profile_and_budget():
    failure = _fails(BUGS["strict <"][0])
    assert "plan_blocks([(act=" in str(failure) and "budget=" in str(failure)


def test_a_result_passed_instead_of_the_function_is_named():
    failure = _fails([Step(0, 1, "keep")])
    assert "a function" in str(failure) and "plan_blocks" in str(failure)
