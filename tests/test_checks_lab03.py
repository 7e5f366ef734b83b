"""Tests for the checkers of 03_sqrt_n: they pass the reference and catch each planted bug with its own hint."""
from __future__ import annotations

import math

import pytest

import labkit.reference.sqrt_n as S
from labkit import checks
from labkit.checks import CheckFailure, NotAttempted


def _fails(check, *args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value




# ---------------------------------------------------------------- 3.1
def _segments(bounds_of, last_plain=False, fixed=False, validate=True):
    """checkpoint_segments with one piece changed: how bounds are cut, the last segment, the checkpoint used."""
    def bug(layers, x, segments, checkpoint=S.checkpoint):
        layers = S.check_chain(layers, "checkpoint_segments") if validate else list(layers)
        n = len(layers)
        if validate and not (isinstance(segments, int) and not isinstance(segments, bool) and 1 <= segments <= n):
            raise ValueError(f"segments={segments!r} must be an int from 1 to {n}")
        bounds = bounds_of(n, segments)
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            run = S.run_layers(layers[a:b])
            if last_plain and i == len(bounds) - 2:
                x = run(x)
            else:
                x = (S.checkpoint if fixed else checkpoint)(run, x)
        return x
    return bug


EVEN = lambda n, k: [i * n // k for i in range(k + 1)]  # noqa: E731
FLOOR = lambda n, k: [i * (n // k) for i in range(k)] + [n]  # noqa: E731


def segments_twice(layers, x, segments, checkpoint=S.checkpoint):
    """Runs the whole chain once more in forward, outside any checkpoint."""
    S.run_layers(list(layers))(x.detach())
    return S.checkpoint_segments(layers, x, segments, checkpoint)


@pytest.mark.parametrize("bug, keyword, what", [
    (_segments(EVEN, last_plain=True), "the last one too", "segments checkpointed"),
    (_segments(FLOOR), "the docstring's bounds", "the layers the segments start at"),
    (_segments(EVEN, fixed=True), "the checkpoint function passed in", "calls of the checkpoint"),
    (segments_twice, "once in forward", "forward calls of each layer"),
    (_segments(EVEN, validate=False), "ValueError that names the value", "checkpoint_segments(<3 layers>, x, 0)"),
])
def test_ex_3_1_catches(bug, keyword, what):
    err = _fails(checks.ex_3_1, bug)
    assert keyword in err.hint and what in err.what, err


# ---------------------------------------------------------------- 3.2
def peak_floor(n, k, a, b, e):
    return k * a + (n // k) * b + e


def peak_no_extra(n, k, a, b, e):
    return k * a + -(-n // k) * b


def peak_extra_input(n, k, a, b, e):
    return (k + 1) * a + -(-n // k) * b + e


def peak_float(n, k, a, b, e):
    return float(k * a + math.ceil(n / k) * b + e)


def best_rounded(n, a, b):
    return max(1, round(math.sqrt(n)))


@pytest.mark.parametrize("args, keyword", [
    ((peak_floor, S.best_segments), "ceil(n/k)"), ((peak_no_extra, S.best_segments), "add extra_bytes"),
    ((peak_extra_input, S.best_segments), "k segments keep k inputs"), ((peak_float, S.best_segments), "Python ints"),
    ((S.segment_peak, best_rounded), "search k = 1..n"),
])
def test_ex_3_2_catches(args, keyword):
    err = _fails(checks.ex_3_2, *args)
    assert keyword in err.hint, err


# ---------------------------------------------------------------- 3.3
def recursive_ceil(layers, x, checkpoint=S.checkpoint):
    layers = list(layers)
    if len(layers) == 1:
        return layers[0](x)
    mid = -(-len(layers) // 2)
    x = checkpoint(lambda h: recursive_ceil(layers[:mid], h, checkpoint), x)
    return recursive_ceil(layers[mid:], x, checkpoint)


def recursive_flat_first_half(layers, x, checkpoint=S.checkpoint):
    """The first half is checkpointed as one plain segment: no recursion inside it."""
    layers = list(layers)
    if len(layers) == 1:
        return layers[0](x)
    mid = len(layers) // 2
    x = checkpoint(S.run_layers(layers[:mid]), x)
    return recursive_flat_first_half(layers[mid:], x, checkpoint)


def recursive_fixed_checkpoint(layers, x, checkpoint=S.checkpoint):
    return S.checkpoint_recursive(layers, x)


def recursive_inner_default(layers, x, checkpoint=S.checkpoint):
    """The inner call drops the checkpoint passed in: the levels below the top use the default one."""
    layers = list(layers)
    if len(layers) == 1:
        return layers[0](x)
    mid = len(layers) // 2
    x = checkpoint(lambda h: S.checkpoint_recursive(layers[:mid], h), x)
    return recursive_inner_default(layers[mid:], x, checkpoint)


@pytest.mark.parametrize("bug, keyword", [
    (recursive_ceil, "the first half is the shorter one"), (recursive_flat_first_half, "each half must recurse"),
    (recursive_fixed_checkpoint, "pass the checkpoint argument down"),
    (recursive_inner_default, "pass the checkpoint argument down"),
])
def test_ex_3_3_catches(bug, keyword):
    err = _fails(checks.ex_3_3, bug)
    assert keyword in err.hint, err


# ---------------------------------------------------------------- 3.4
def plan_greedy(costs, budget):
    """Stores layers while they fit, then recomputes the rest as one segment: fits, but not optimal."""
    schedule = S.plan(costs, budget)
    if schedule is None:
        return None
    everything = [S.Segment(0, len(costs.act), True)]
    return everything if S.peak_of(everything, costs) <= budget else schedule


def plan_ignores_inputs(costs, budget):
    """Plans as if a checkpoint kept nothing: schedules that do not fit."""
    free = S.ChainCosts(costs.act, [0] * len(costs.act), costs.fwd, costs.extra)
    return S.plan(free, budget)


def plan_never(costs, budget):
    return None


def plan_always(costs, budget):
    return S.plan(costs, budget) or [S.Segment(0, len(costs.act), True)]


def plan_unmerged_gaps(costs, budget):
    schedule = S.plan(costs, budget)
    return None if schedule is None else schedule[1:]


@pytest.mark.parametrize("bug, keyword", [
    (plan_greedy, "recomputes more than the best one"), (plan_ignores_inputs, "must fit"),
    (plan_never, "recomputes more than the best one"), (plan_always, "return None when nothing fits"),
    (plan_unmerged_gaps, "cover the chain in order"),
])
def test_ex_3_4_catches(bug, keyword):
    err = _fails(checks.ex_3_4, bug)
    assert keyword in err.hint, err


def _tables(old: str, new: str):
    """The reference optimal_tables with one bug planted: `old` in its source replaced by `new`."""
    import inspect
    import textwrap

    import numpy as np

    source = textwrap.dedent(inspect.getsource(S.optimal_tables))
    assert old in source, old
    space = {"np": np}
    exec(compile(source.replace(old, new), "<planted>", "exec"), space)
    return space["optimal_tables"]


TABLE_BUGS = {
    "no forward runs": _tables("            if length > 1:  # 2.", "            if False:  # 2."),
    "no loss": _tables("            late = u[\"loss\"] if e == n else 0", "            late = 0"),
    "the left part given the parent's memory": _tables("+ freed - late - g[splits]", "+ 0"),
    "how never says a split": _tables("splits[k[better]]", "0"),
}


def test_ex_3_5_passes_the_reference_and_refuses_a_stub():
    checks.ex_3_5(S.optimal_tables)

    def stub(costs, u):
        raise NotImplementedError("Exercise 3.5: the optimal persistent schedule")
    with pytest.raises(NotAttempted):
        checks.ex_3_5(stub)


@pytest.mark.parametrize("bug, keyword", [
    ("no forward runs", "the least cost is lower"), ("no loss", "everything it has alive fits"),
    ("the left part given the parent's memory", "everything it has alive fits"),
    ("how never says a split", "how[s, e, m] must say"),
], ids=lambda v: v if " " in v else "")
def test_ex_3_5_catches(bug, keyword):
    err = _fails(checks.ex_3_5, TABLE_BUGS[bug])
    assert keyword in err.hint, err


def test_each_planted_bug_has_its_own_hint():
    cases = [(checks.ex_3_1, (b,)) for b in (_segments(EVEN, last_plain=True), _segments(FLOOR),
                                             _segments(EVEN, fixed=True), segments_twice,
                                             _segments(EVEN, validate=False))]
    cases += [(checks.ex_3_2, a) for a in ((peak_floor, S.best_segments), (peak_no_extra, S.best_segments),
                                           (peak_extra_input, S.best_segments), (peak_float, S.best_segments),
                                           (S.segment_peak, best_rounded))]
    cases += [(checks.ex_3_3, (b,)) for b in (recursive_ceil, recursive_flat_first_half, recursive_fixed_checkpoint)]
    cases += [(checks.ex_3_4, (b,)) for b in (plan_greedy, plan_ignores_inputs, plan_always, plan_unmerged_gaps)]
    cases += [(checks.ex_3_5, (TABLE_BUGS[b],)) for b in ("no forward runs", "no loss", "how never says a split")]
    hints = [_fails(check, *args).hint for check, args in cases]
    assert len(set(hints)) == len(hints), [h for h in hints if hints.count(h) > 1]
