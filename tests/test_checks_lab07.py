"""Tests for the checker of 07_capstone: it passes the reference and catches each planted bug with its own hint.

Checker strength (docs/maintainers.md, "Checker strength"): `tools/mutants.py labkit/reference/capstone.py
tests/test_checks_lab07.py`, seed 1: 6 of 10 killed; seed 2: 25 of 30. Every survivor was read (and run against
the reference on 180 drawn profiles, 6 budgets and 3 units each); all equivalent, none GPU-only (numpy only):
- `start = np.full((n + 1, top + 1), -1)` and `how = ...`, any 1 -> 2: a row or a column more, or another marker
  of "not reached", is never read: the walk back reads only states a step reached.
- `here = best[i, : reached[-1] + 1]` with + 2: one more entry of best[i], unreached (inf), and every width w
  stays capped by top + 1 - kept: an inf is never better than what is there.
- least_budget's `low, high = high + 1, 2 * high` with high - 1: a lower bound one byte looser than known;
  bisection still ends at the least budget (fitting is monotone in the budget), one step later.
- `better = new < old` with <=: on a tie of seconds at the same kept units a later way replaces an earlier one,
  another plan of the same seconds and units, which the spec does not choose between.
- the segment's `w = min(top + 1 - kept, here.size, room + 1 - int(need[0]))` with room + 1 + need[0]: a bound
  the mask `fits` (m <= room - need[j], need growing with j) already enforces.
- `if rows == 0 or w <= 0` with w < 0: at w == 0 the update covers no column.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import signal
import time

from pathlib import Path

import pytest

import labkit.reference.capstone as R
from labkit.course.catalog import LABS
from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.checks.base import hidden_cases
from labkit.checks.lab07 import hints as H
from labkit.checks.lab07.planner import Case, _check, cases, every_plan, peak, seconds
from labkit.plans import (
    KEEP, OFFLOAD, RECOMPUTE, SCHEMES, SELECTIVE, BlockCosts, Option, Profile, Step, check_budget, scheme_plan,
)


@contextlib.contextmanager
def within(seconds: int):
    """A TimeoutError after `seconds`: a planted bug that loops forever fails here rather than hang the run."""
    def stop(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _fails(*args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info, within(120):
        checks.ex_7_1(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


def _on(change):
    """The reference planner run on a changed copy of the profile: what a planner that misreads it returns."""
    return lambda profile, budget, most=4096: R.plan_blocks(change(profile), budget, most)


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


ROOT = Path(__file__).resolve().parent.parent
EDITED: list[str] = []  # every line a planted bug replaces (test_every_planted_line_is_in_the_solution)


def _edited(old, new):
    """The reference planner with one line of its source replaced: a mistake a student's numpy could make. Made
    when first called; where the reference no longer has the line (tools/mutants.py changed it), the test is
    skipped: the planted bug cannot be made, and what the change does is the other tests' to show."""
    EDITED.append(old)

    def plan(profile, budget, most=4096):
        source = inspect.getsource(R.plan_blocks)
        if old not in source:
            pytest.skip(f"the reference no longer has {old!r}")
        scope = dict(vars(R))
        exec(source.replace(old, new), scope)  # noqa: S102
        return scope["plan_blocks"](profile, budget, most)
    return plan


NEED = "need = np.maximum.accumulate(rebuilt[i + 1:] - rebuilt[i] + beside[i:])"


def _brute(family, peak=peak):
    """A planner by brute force over the plans `family` allows: the cheapest of them that fits (by `peak`), or
    None."""
    def plan(profile, budget, most=4096):
        if len(profile.blocks) > 8:
            return R.plan_blocks(profile, budget, most)
        fits = [p for p in every_plan(profile) if family(p, profile) and peak(p, profile) <= budget]
        return min(fits, key=lambda p: seconds(p, profile)) if fits else None
    return plan


def _greedy(profile, budget, most=4096):
    """Keep each block while everything kept so far fits, else recompute it alone."""
    plan, kept = [], profile.base
    for i, b in enumerate(profile.blocks):
        how = "keep" if kept + b.act <= budget else RECOMPUTE
        kept += b.act if how == "keep" else b.inp
        plan.append(Step(i, i + 1, how))
    return plan if peak(plan, profile) <= budget else None


def _mutating(profile, budget, most=4096):
    plan = R.plan_blocks(profile, budget, most)
    for b in profile.blocks:
        b.options.pop("offload", None)  # a dict inside the frozen dataclass
    return plan


def _slow(profile, budget, most=4096):
    if len(profile.blocks) == 200:
        time.sleep(5.2)
    return R.plan_blocks(profile, budget, most)


def _raises(profile, budget, most=4096):
    raise IndexError("index 3 is out of bounds for axis 0 with size 3")


def _refuses_zero(profile, budget, most=4096):
    """The kit's check_budget called first, as plan_for does: 0 raises where the spec wants None."""
    return R.plan_blocks(profile, check_budget(budget, "plan_blocks"), most)


UNITS = "unit = _units(profile, most)"
BELOW = "if profile.floor > budget or profile.base > budget:"
ARGMIN = "int(np.argmin(best[n]))"

BUGS = {
    "held ignored": (_on(_held_is_kept), H.PLAN_FITS),
    "floor ignored": (_on(lambda p: dataclasses.replace(p, floor=0)), H.PLAN_NONE),
    "base ignored": (_on(lambda p: dataclasses.replace(p, base=0)), H.PLAN_NONE),
    # issue 50: a budget between floor and base crashed such a planner in grading and passed the notebook's check
    "only the floor tested": (_edited(BELOW, "if profile.floor > budget:"), H.PLAN_NONE),
    "only base tested": (_edited(BELOW, "if profile.base > budget:"), H.PLAN_NONE),
    "budget 0 refused": (_refuses_zero, H.PLAN_ZERO),
    "beside ignored": (_on(lambda p: _each_block(p, beside=0)), H.PLAN_FITS),
    "the largest beside for every block": (_on(_largest_beside), H.PLAN_MISSED),
    "a segment's last beside only": (_brute(lambda plan, p: True, peak=_last_beside_peak), H.PLAN_NONE),
    "no running maximum": (_edited(NEED, "need = rebuilt[i + 1:] - rebuilt[i] + beside[i:]"), H.PLAN_NONE),
    "strict <": (lambda p, b, most=4096: R.plan_blocks(p, b - 1, most), H.PLAN_MISSED),
    "strict < where something else fits": (lambda p, b, most=4096: R.plan_blocks(p, b - 1, most) or
                                           R.plan_blocks(p, b, most), H.PLAN_STRICT),
    "base in the backward's room": (_edited("room = budget // unit", "room = (budget - profile.base) // unit"),
                                    H.PLAN_MISSED),
    # issue 50: "bytes counted in 256 units whatever `most` says: a plan that fits but is not the cheapest"
    "256 units whatever most says": (_edited(UNITS, "unit = _units(profile, 256)"), H.PLAN_UNITS),
    "most ignored": (_edited(UNITS, "unit = _units(profile, 4096)"), H.PLAN_UNITS),
    "bytes, never units": (_edited(UNITS, "unit = 1"), H.PLAN_UNITS),
    "rounded down": (_edited("up = lambda v: -(-v // unit)", "up = lambda v: v // unit"), H.PLAN_FITS),
    # issue 50: "the largest m on a tie (the spec says the smallest)"
    "the largest m on a tie": (_edited(ARGMIN, "int(best[n].size - 1 - np.argmin(best[n][::-1]))"), H.PLAN_TIE),
    "one-block segments only": (_brute(lambda plan, p: all(s.stop == s.start + 1 for s in plan)), H.PLAN_MISSED),
    "no selective or offload": (_brute(lambda plan, p: all(s.how in ("keep", RECOMPUTE) for s in plan)), H.PLAN_MISSED),
    "greedy": (_greedy, H.PLAN_MISSED),
    "always recompute": (_brute(lambda plan, p: all(s.how == RECOMPUTE for s in plan)), H.PLAN_OPTIMAL),
    "reversed": (lambda p, b, most=4096: None if (r := R.plan_blocks(p, b, most)) is None else r[::-1], H.PLAN_COVER),
    "a tuple": (lambda p, b, most=4096: None if (r := R.plan_blocks(p, b, most)) is None else tuple(r), H.PLAN_COVER),
    "way renamed": (lambda p, b, most=4096: None if (r := R.plan_blocks(p, b, most)) is None else
                    [dataclasses.replace(s, how="full") if s.how == RECOMPUTE else s for s in r], H.PLAN_COVER),
    "mutates the profile": (_mutating, H.PLAN_MUTATES),
    "slow": (_slow, H.PLAN_SLOW),
    "raises": (_raises, H.PLAN_SPEC),
}


def test_the_reference_passes_the_public_cases_and_the_hidden_ones(capsys):
    with within(120):
        checks.ex_7_1(R.plan_blocks)
        public = len(cases())
        with hidden_cases(1):
            assert len(cases()) > public
            checks.ex_7_1(R.plan_blocks)
    assert capsys.readouterr().out.count("[ex 7.1] passed") == 2


# ---------------------------------------------------------------- the given code beside the exercise
# tools/mutants.py plants bugs in the whole reference module, so the given functions around plan_blocks (the
# fixed schemes, best_plan, least_budget, plan_for) are held here too, on cases that tell each bug apart.

def _blocks(*acts, inp=1, selective=True):
    way = lambda a: {SELECTIVE: Option(inp, a, 0.25)} if selective else {}  # noqa: E731
    return tuple(BlockCosts(a, inp, 1.0, way(a)) for a in acts)


COARSE = Profile(tuple(BlockCosts(101, 1, 1.0) for _ in range(4)), 0, 0, 1.0)  # 408 B: units of 51 B at most=8


def test_fixed_plans_are_the_schemes_each_block_has():
    both = Profile(_blocks(3, 3, 3, 3), 0, 0, 1.0)
    assert R.fixed_plans(both) == [scheme_plan(name, 4) for name in SCHEMES]
    one_without = Profile(_blocks(3, 3) + _blocks(3, selective=False) + _blocks(3), 0, 0, 1.0)
    assert R.fixed_plans(one_without) == [scheme_plan(name, 4) for name in SCHEMES if name != "selective"]


def test_best_plan_takes_a_scheme_that_fits_to_the_byte_where_the_unit_loses_it():
    # recomputing each block alone peaks at 3 + 101 B; in units of 51 B plan_blocks counts 255 B and refuses it
    assert R.plan_blocks(COARSE, 104, 8) is None
    assert R.best_plan(COARSE, 104, 8) == scheme_plan("full", 4)
    assert R.best_plan(COARSE, 103, 8) is None
    assert R.best_plan(COARSE, 2**20, 8) == [Step(i, i + 1, KEEP) for i in range(4)]
    # at 204 B sqrt_n fits to the byte (203 B) at 2 s; in units it keeps 5 of 51 B, and plan_blocks's plan costs 3 s
    assert R.best_plan(COARSE, 204, 8) == scheme_plan("sqrt_n", 4)
    assert seconds(R.plan_blocks(COARSE, 204, 8), COARSE) == 3.0


@pytest.mark.parametrize("profile, most, least", [
    (COARSE, 8, 104), (COARSE, 4096, 104),
    (Profile((BlockCosts(1, 1, 1.0),), 0, 0, 1.0), 4096, 1),  # one byte: the least budget is 1
    (Profile(_blocks(7, 5, 9, 4), 3, 40, 1.0), 4096, 40),  # the floor decides
    (Profile(_blocks(70, 50, 90, 40, inp=7), 30, 0, 1.0), 4096, 104),  # found by doubling from base, then bisection
])
def test_least_budget_is_the_least_budget_best_plan_accepts(profile, most, least):
    with within(60):
        assert R.least_budget(profile, most) == least
    assert R.best_plan(profile, least, most) is not None and R.best_plan(profile, least - 1, most) is None
    assert least == min(peak(p, profile) for p in every_plan(profile))


def test_the_default_most_is_4096_units():
    """4,097 B with no common divisor is one byte too many for 4096 units of 1 B: plan_blocks, best_plan and
    least_budget count it in units of 2 B unless told otherwise, and find a least budget 2 B above the exact one."""
    profile = Profile((BlockCosts(706, 385, 0.25, {SELECTIVE: Option(420, 706, 0.0), OFFLOAD: Option(0, 706, 0.25)},
                                  257),
                       BlockCosts(907, 287, 1.5, {SELECTIVE: Option(890, 907, 1.0)}, 1555)), 689, 737, 1.0)
    assert sum(b.act + b.inp + b.beside for b in profile.blocks) == 4097 and R._units(profile, 4096) == 2
    assert R.least_budget(profile) == R.least_budget(profile, 4096) == 2464 and R.least_budget(profile, 4097) == 2462
    assert R.best_plan(profile, 2463) is None is R.plan_blocks(profile, 2463)
    assert R.best_plan(profile, 2463, 4097) is not None


def test_plan_for_is_best_plan_or_an_error_naming_the_least_budget_in_bytes_and_mebibytes():
    profile = Profile(tuple(BlockCosts(3 * 2**20, 2**20, 1.0) for _ in range(3)), 0, 0, 1.0)
    least = R.least_budget(profile)
    assert R.plan_for(profile, least) == R.best_plan(profile, least)
    with pytest.raises(ValueError) as info, within(60):
        R.plan_for(profile, 2 * 2**20 + 2**19)
    assert str(info.value) == (f"plan_for: no plan fits budget=2,621,440 B (2.50 MiB); the least that fits is "
                               f"{least:,} B ({least / 2**20:.2f} MiB)") and least == 5 * 2**20
    with pytest.raises(ValueError, match=r"plan_for: budget=0 \(int\) must be a positive int"):
        R.plan_for(profile, 0)
    with pytest.raises(TypeError, match="plan_for: profile must be a labkit.plans.Profile, got list"):
        R.plan_for(list(profile.blocks), 2**30)


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


def test_none_where_a_plan_fits_names_that_mistake_not_a_slower_plan():
    failure = _fails(lambda profile, budget, most=4096: None)
    assert failure.hint == H.PLAN_MISSED and failure.got == "None" and "slower" not in failure.hint


def test_budget_zero_and_budgets_between_base_and_floor_are_public_cases():
    """Issue 50: grading caught a planner that crashes between floor and base; the notebook's check did not."""
    public = cases()
    assert any(c.budget == 0 for c in public)
    assert any(c.profile.floor <= c.budget < c.profile.base for c in public)
    assert any(c.profile.base <= c.budget < c.profile.floor for c in public)


HIDDEN_ALONE = ["only the floor tested", "budget 0 refused", "256 units whatever most says", "most ignored",
                "the largest m on a tie", "rounded down", "strict < where something else fits"]


@pytest.mark.parametrize("bug", HIDDEN_ALONE)
def test_the_hidden_cases_alone_catch_each_promise_broken(bug):
    """labkit grade's cases (labkit.checks.base.hidden), without the public ones, hold every promise too."""
    public = len(cases())
    with hidden_cases(3):
        drawn = cases()[public:]
    fn, hint = BUGS[bug]
    hints = set()
    with within(120):
        for case in drawn:
            try:
                _check(fn, case)
            except CheckFailure as e:
                hints.add(e.hint)
            if hint in hints:
                break
    assert hint in hints, (bug, hints)


def test_every_planted_line_is_in_the_solution():
    """The lines _edited replaces are the solution's own (a stale one would skip its test)."""
    import nbformat

    lab = next(lab for lab in LABS if lab.number == "07")
    code = "".join(c.source for c in nbformat.read(lab.solution(ROOT), as_version=4).cells if c.cell_type == "code")
    assert EDITED and all(line in code for line in EDITED), [line for line in EDITED if line not in code]
