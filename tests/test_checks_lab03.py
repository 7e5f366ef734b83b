"""Tests for the checkers of 03_sqrt_n: they pass the reference and catch each planted bug with its own hint."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import labkit.reference.sqrt_n as S
from labkit import checks
from labkit.checks import CheckFailure, NotAttempted

# Checker strength (docs/maintainers.md, "Checker strength"): tools/mutants.py labkit/reference/sqrt_n.py
# tests/test_checks_lab03.py, --sample 10 --seed 1 and --sample 30 --seed 2. The module's given code is planted in
# too, so the end of this file holds it to the checkers' own oracles and rig. The survivors, read, equivalent:
# - plan, `came = np.full(..., -1)` -> `-2`: came is read only along the walk back from a finite best, and each
#   (i, m) on that walk was written when its best was; the initial value is never read.
# - best_segments, `range(1, n_layers + 1)` -> `n_layers + 2`: k = n + 1 peaks at (n + 1)·a + b against n·a + b at
#   k = n, never less for input_bytes >= 0, and min keeps the smaller k on a tie.


def _fails(check, *args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


# ---------------------------------------------------------------- the reference passes
@pytest.mark.parametrize("seed", [None, 7], ids=["notebook", "graded"])
@pytest.mark.parametrize("check, args", [
    (checks.ex_3_1, (S.checkpoint_segments,)), (checks.ex_3_2, (S.segment_peak, S.best_segments)),
    (checks.ex_3_3, (S.checkpoint_recursive,)), (checks.ex_3_4, (S.plan,)), (checks.ex_3_5, (S.optimal_tables,)),
], ids=["3.1", "3.2", "3.3", "3.4", "3.5"])
def test_the_reference_passes(check, args, seed, capsys):
    """In the notebook (public cases) and as `labkit grade` runs it (its hidden cases too)."""
    from labkit.checks.base import hidden_cases

    with hidden_cases(seed):
        check(*args)
    assert capsys.readouterr().out.startswith(f"[ex {check.__name__[3:].replace('_', '.')}] passed")




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
    (_segments(EVEN), "TypeError naming the value", "checkpoint_segments(<3 layers>, x, 2.0)"),  # ValueError for 2.0
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


def _solution_source(name: str) -> str:
    """The definition of `name` as the solution notebook writes it. The bugs below are planted in that text, not
    in labkit/reference/sqrt_n.py's: tools/mutants.py plants its own bugs in the module, never in the notebook."""
    import ast

    import nbformat

    solution = Path(__file__).resolve().parent.parent / "solutions" / "03_sqrt_n.ipynb"
    for cell in nbformat.read(solution, as_version=4).cells:
        tree = ast.parse(cell.source) if cell.cell_type == "code" and f"def {name}(" in cell.source else None
        for node in tree.body if tree else ():
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return ast.get_source_segment(cell.source, node)
    raise LookupError(f"no def {name}( in {solution.name}")


def _planted(fn, old: str, new: str):
    """The solution's `fn` with one bug planted: `old` in its text replaced by `new`, run among the reference
    module's names."""
    source = _solution_source(fn.__name__)
    assert old in source, old
    space = dict(vars(S))
    exec(compile(source.replace(old, new), "<planted>", "exec"), space)
    return space[fn.__name__]


plan_rounds_budget_up = _planted(S.plan, "top = room // unit", "top = -(-room // unit)")  # issue 50


@pytest.mark.parametrize("bug, keyword", [
    (plan_greedy, "recomputes more than the best one"), (plan_ignores_inputs, "must fit"),
    (plan_never, "plan returned None, but a schedule fits"), (plan_always, "return None when nothing fits"),
    (plan_unmerged_gaps, "cover the chain in order"), (plan_rounds_budget_up, "must be rounded down"),
])
def test_ex_3_4_catches(bug, keyword):
    err = _fails(checks.ex_3_4, bug)
    assert keyword in err.hint, err


def _hidden_only(monkeypatch, module, seed: int) -> None:
    """module.cases() gives only the cases `labkit grade` draws from `seed`, the public ones left out."""
    from labkit.checks.base import hidden_cases

    public = len(module.cases())
    with hidden_cases(seed):
        drawn = module.cases()[public:]
    assert drawn
    monkeypatch.setattr(module, "cases", lambda: drawn)


@pytest.mark.parametrize("seed", range(4))
def test_ex_3_4_the_budget_rounded_up_fails_the_hidden_cases_alone(monkeypatch, seed):
    from labkit.checks.lab03 import planner

    _hidden_only(monkeypatch, planner, seed)
    assert "must be rounded down" in _fails(checks.ex_3_4, plan_rounds_budget_up).hint


def _tables(old: str, new: str):
    """The reference optimal_tables with one bug planted: `old` in its source replaced by `new`."""
    return _planted(S.optimal_tables, old, new)


TABLE_BUGS = {
    "no forward runs": _tables("            if length > 1:  # 2.", "            if False:  # 2."),
    "no loss": _tables("            late = u[\"loss\"] if e == n else 0", "            late = 0"),
    "the left part given the parent's memory": _tables("+ freed - late - g[splits]", "+ 0"),
    "the right part given the parent's memory": _tables("best[(start(splits, e) - x[splits])[:, None] + m]",
                                                        "best[(start(splits, e))[:, None] + m]"),
    "how never says a split": _tables("splits[k[better]]", "0"),
    # issue 50: a forward run's moments without their inputs
    "an F without its input": _tables("need = np.maximum.accumulate(np.where(js > s, x[js], 0) + f[js])",
                                      "need = np.maximum.accumulate(f[js])"),
    # the base case written as the longer parts' tape (issue 50: its hint pointed at the memory shifts)
    "the base case with a gradient arriving": _tables("(g[s + 1] - freed if length > 1 else 0)", "(g[s + 1] - freed)"),
    "the base case without B": _tables("fits = (m >= t[s]) & (m >= x[s + 1]",
                                       "fits = (m >= t[s]) & (length == 1) | (m >= t[s]) & (m >= x[s + 1]"),
    "the base case costing nothing": _tables("if length > 1 else 0.0", "if length > 1 else -fwd[s]"),
    "a tape without the loss": _tables("+ b[s] + late + (g", "+ b[s] + (late if length == 1 else 0) + (g"),
    "a longer part's tape unchecked": _tables("fits = (m >= t[s]) & (m >= x[s + 1]",
                                              "fits = ((m >= t[s]) | (length > 1)) & (m >= x[s + 1]"),
    "the given pads after a row left inf": _tables("best[at + width:at + width + pad] = cost, cost[-1]",
                                                   "best[at + width:at - width + pad] = cost, cost[-1]"),
}


def test_ex_3_5_refuses_a_stub():
    def stub(costs, u):
        raise NotImplementedError("Exercise 3.5: the optimal persistent schedule")
    with pytest.raises(NotAttempted):
        checks.ex_3_5(stub)


@pytest.mark.parametrize("bug, keyword", [
    ("no forward runs", "the least cost is lower"), ("no loss", "the loss and its gradient exist"),
    ("the left part given the parent's memory", "give each part the memory it has"),
    ("the right part given the parent's memory", "give each part the memory it has"),
    ("how never says a split", "how[s, e, m] must say"),
    ("an F without its input", "its input x[j]"),
    ("the base case with a gradient arriving", "the base case: C(s, s+1, m) is finite exactly where"),
    ("the base case without B", "the base case: C(s, s+1, m) is finite exactly where"),
    ("the base case costing nothing", "the base case: C(s, s+1, m) costs"),
    ("a tape without the loss", "B s fits only where"),
    ("a longer part's tape unchecked", "T s fits only where"),
    ("the given pads after a row left inf", "fills the given tables"),
], ids=lambda v: v if " " in v else "")
def test_ex_3_5_catches(bug, keyword):
    err = _fails(checks.ex_3_5, TABLE_BUGS[bug])
    assert keyword in err.hint, err


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("bug, keyword", [("an F without its input", "its input x[j]"),
                                          ("a longer part's tape unchecked", "T s fits only where")])
def test_ex_3_5_what_fits_fails_the_hidden_cases_alone(monkeypatch, seed, bug, keyword):
    from labkit.checks.lab03 import optimal

    _hidden_only(monkeypatch, optimal, seed)
    assert keyword in _fails(checks.ex_3_5, TABLE_BUGS[bug]).hint


def test_each_planted_bug_has_its_own_hint():
    cases = [(checks.ex_3_1, (b,)) for b in (_segments(EVEN, last_plain=True), _segments(FLOOR),
                                             _segments(EVEN, fixed=True), segments_twice,
                                             _segments(EVEN, validate=False), _segments(EVEN))]
    cases += [(checks.ex_3_2, a) for a in ((peak_floor, S.best_segments), (peak_no_extra, S.best_segments),
                                           (peak_extra_input, S.best_segments), (peak_float, S.best_segments),
                                           (S.segment_peak, best_rounded))]
    cases += [(checks.ex_3_3, (b,)) for b in (recursive_ceil, recursive_flat_first_half, recursive_fixed_checkpoint)]
    cases += [(checks.ex_3_4, (b,)) for b in (plan_greedy, plan_ignores_inputs, plan_never, plan_always,
                                             plan_unmerged_gaps, plan_rounds_budget_up)]
    cases += [(checks.ex_3_5, (TABLE_BUGS[b],)) for b in (
        "no forward runs", "no loss", "the left part given the parent's memory", "how never says a split",
        "an F without its input", "the base case with a gradient arriving", "the base case costing nothing",
        "a tape without the loss", "a longer part's tape unchecked")]
    hints = [_fails(check, *args).hint for check, args in cases]
    assert len(set(hints)) == len(hints), [h for h in hints if hints.count(h) > 1]


# ---------------------------------------------------------------- the given code the checks stand on
# tools/mutants.py plants bugs in the whole reference module, the notebook's given code too. The checkers' cases run
# through some of it (check_chain, run_layers, _slots) and their oracles are the rest written again (planner.peak,
# cost and unit_of; optimal.layout): here the given code is held to those oracles and to the checkers' rig, so that
# a checker never judges by a model other than the one the notebook states, and the later cells (one-level
# schedules run and measured) run what the checkers assume.
def _chain_costs(c):
    return S.ChainCosts(c.act, c.inp, c.fwd, c.extra)


def test_the_given_model_is_the_checker_s_own():
    from labkit.checks.lab03 import planner

    rng = np.random.default_rng(0)
    for _ in range(12):
        c = planner._drawn(rng, int(rng.integers(1, 6)), unit=int(rng.choice([1, 4])))
        for schedule in planner._every_schedule(len(c.act)):
            given = [S.Segment(s.start, s.stop, s.recompute) for s in schedule]
            assert S.peak_of(given, _chain_costs(c)) == planner.peak(schedule, c)
            assert S.recompute_cost(given, _chain_costs(c)) == planner.cost(schedule, c)
    for act, inp in [([8, 12], [4, 4]), ([2048, 2047], [1, 1]), ([2047, 2047], [1, 1]), ([10_007, 3], [5, 1])]:
        c = planner.Costs(act, inp, [1.0] * len(act))
        unit = planner.unit_of(c)
        assert S._slots(_chain_costs(c)) == (unit, [-(-a // unit) for a in act], [-(-i // unit) for i in inp])


def test_least_budget_and_schedule_for_are_the_brute_force_least():
    from labkit.checks.lab03 import planner

    rng = np.random.default_rng(1)
    for unit in (1, 1, 4, 8):
        c = planner._drawn(rng, int(rng.integers(1, 5)), unit=unit)
        least = next(b for b in range(c.extra, c.extra + sum(c.act) + 1) if planner.best_cost(c, b) is not None)
        costs = _chain_costs(c)
        assert S.least_budget(costs) == least
        assert planner.cost(S.schedule_for(costs, least), c) == planner.best_cost(c, least)
        with pytest.raises(ValueError, match=f"budget={least - 1:,} B; the least that fits is {least:,} B"):
            S.schedule_for(costs, least - 1)
    for budget in (1e9, True, "9"):
        with pytest.raises(TypeError, match="budget must be an int of bytes"):
            S.schedule_for(costs, budget)


def test_chain_costs_refuses_what_the_model_cannot_hold():
    assert S.ChainCosts([3], [1], [1.0]).extra == 0
    for act, inp, fwd, extra in [([1, 2], [1], [1.0, 1.0], 0), ([], [], [], 0), ([1], [-1], [1.0], 0),
                                 ([1], [1], [-1.0], 0), ([1], [1], [1.0], -1)]:
        with pytest.raises(ValueError, match="ChainCosts: "):
            S.ChainCosts(act, inp, fwd, extra)


@pytest.mark.parametrize("n, k", [(5, 2), (7, 3), (4, 4), (1, 1)])
def test_uniform_schedule_is_checkpoint_segments_bounds(n, k):
    bounds = [i * n // k for i in range(k + 1)]
    assert S.uniform_schedule(n, k) == [S.Segment(a, b, True) for a, b in zip(bounds, bounds[1:])]


def test_run_schedule_runs_each_segment_as_it_says():
    """Stored segments plainly (one forward), recomputed ones under the checkpoint given (two), gradients exact."""
    from labkit.checks.lab03.common import grads, plain_grads, weighted, widening_chain
    from labkit.checks.lab03.segments import Recorder

    layers, x = widening_chain(6)
    want = plain_grads(layers, x)
    schedule = [S.Segment(0, 2, False), S.Segment(2, 3, True), S.Segment(3, 4, False), S.Segment(4, 6, True)]
    record = Recorder()
    weighted(S.run_schedule(layers, x, schedule, record)).backward()
    assert record.starts == [2, 4]
    assert [layer.calls for layer in layers] == [1, 1, 2, 1, 2, 2]
    assert all(torch.equal(a, b) for a, b in zip(want, grads(layers, x)))
    for bad in ([], [S.Segment(0, 3, True)], [S.Segment(1, 6, True)], [S.Segment(0, 3, False), S.Segment(2, 6, True)],
                [S.Segment(0, 0, True), S.Segment(0, 6, True)], [S.Segment(0, 3, True), S.Segment(4, 6, True)]):
        with pytest.raises(ValueError, match="must cover layers 0..6 in order, each non-empty"):
            S.run_schedule(layers, x, bad)


def test_profile_chain_measures_what_the_planner_is_told():
    """Each layer's act from the ledger (its own input included), its input's bytes, its FLOPs, and extra: three
    inputs' bytes, the largest layer's parameters, the loss and its gradient; the caller's generator unmoved."""
    from torch.utils.flop_counter import FlopCounterMode

    from labkit.instruments import saved_tensors
    from labkit.models import layer_chain

    chain = layer_chain("HLH", 8)  # Linear+GELU, GELU alone, Linear+GELU: each keeps its own input
    x = torch.ones(3, 8, requires_grad=True)
    state = torch.get_rng_state()
    costs = S.profile_chain(chain, x)
    assert torch.equal(torch.get_rng_state(), state)
    assert costs.inp == [3 * 8 * 4] * 3
    by_module = saved_tensors(chain, x, model=chain).by_module()
    assert costs.act == [sum(b for m, b in by_module.items() if m.split(".")[0] == str(i)) for i in range(3)]
    assert costs.act[1] == 3 * 8 * 4 and costs.act[0] > costs.act[1]
    with FlopCounterMode(display=False) as flops:
        chain[2](torch.ones(3, 8))
    assert costs.fwd[2] == flops.get_total_flops() > 0 and costs.fwd[1] == 0
    params = max(sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in chain)
    assert costs.extra == 3 * max(costs.inp) + params + 2 * 4
    with pytest.raises(TypeError, match="chain must be an nn.Sequential"):
        S.profile_chain(list(chain), x)

