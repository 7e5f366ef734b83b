"""The optimal persistent schedule (labkit.planners.persistent): run for real, its measured peak is the simulated
one to the byte and its gradients are the plain chain's bit for bit; the dynamic program equals exhaustive
search over every persistent schedule of short chains with made-up costs, each simulated."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from labkit.bench.lab03 import activation_peak, drawn_op_costs, hetero_chain
from labkit.env.profile import sizes
from labkit.models import layer_chain
from labkit.planners import persistent as P


def _grads(layers, x, run):
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    x.grad = None
    run(x).sum().backward()
    return [p.grad.clone() for layer in layers for p in layer.parameters()] + [x.grad.clone()]


@pytest.mark.parametrize("kinds", ["HL" * 6, "H" * 10, "LHHL"])
def test_run_ops_peaks_as_simulated_to_the_byte_with_bitwise_gradients(kinds):
    """At five budgets from the least that fits to storing everything, and for the recursion and √n as ops."""
    torch.manual_seed(0)
    chain = layer_chain(kinds, 16)
    x = torch.randn(8, 16, requires_grad=True)
    costs = P.profile_ops(chain, x, repeats=1)
    layers = list(chain)
    want = _grads(layers, x, chain)
    top = P.simulate(P.store_all(len(layers)), costs)[0]
    low, high = 0, top  # the least budget anything fits, by bisection (fitting is monotone in the budget)
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if P.optimal_ops(costs, mid) is not None else (mid + 1, high)
    assert P.optimal_ops(costs, low - 1) is None
    from labkit.labs.sqrt_n import uniform_schedule

    n = len(layers)
    others = [P.recursive_ops(n), P.segments_ops(uniform_schedule(n, 2), n)]
    for budget in sorted({low + (top - low) * k // 4 for k in range(5)}) + [None] * len(others):
        ops = P.optimal_ops(costs, budget) if budget is not None else others.pop()
        predicted, _ = P.simulate(ops, costs)
        assert budget is None or predicted <= budget
        assert activation_peak(chain, x, lambda ls, h, ops=ops: P.run_ops(ls, h, ops)) == predicted
        got = _grads(layers, x, lambda h, ops=ops: P.run_ops(layers, h, ops))
        assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_the_lab_chain_at_the_tiny_sizes_recomputes_more_as_the_budget_falls():
    size = sizes("tiny")
    chain, x = hetero_chain(size, 16)
    costs = P.profile_ops(chain, x, repeats=1)
    top = P.simulate(P.store_all(16), costs)[0]
    spent = [P.simulate(P.optimal_ops(costs, int(top * f)), costs)[1] for f in (1.0, 0.7, 0.5)]
    assert spent[0] == pytest.approx(sum(costs.fwd)) and spent[0] <= spent[1] <= spent[2]


@functools.cache
def _all(n: int) -> list:
    return list(P.all_schedules(n))


@pytest.mark.parametrize("seed", range(6))
def test_the_dynamic_program_equals_exhaustive_search_over_persistent_schedules(seed):
    rng = np.random.default_rng(seed)
    for n in (1, 2, 3, 4, 5, 6) if seed < 5 else (7,):
        costs = drawn_op_costs(rng, n)
        simulated = [P.simulate(ops, costs) for ops in _all(n)]
        for budget in sorted({peak for peak, _ in simulated}) + [0]:
            fits = [cost for peak, cost in simulated if peak <= budget]
            ops = P.optimal_ops(costs, budget)
            if not fits:
                assert ops is None, (n, budget)
                continue
            assert ops is not None, (n, budget, min(fits))
            peak, cost = P.simulate(ops, costs)
            assert peak <= budget and cost == pytest.approx(min(fits)), (n, budget, costs)


def test_the_space_is_counted_and_the_lab_schedules_are_in_it():
    assert [len(_all(n)) for n in range(1, 8)] == [1, 2, 6, 22, 90, 394, 1806]
    assert P.recursive_ops(4) in _all(4) and P.store_all(5) in _all(5)
    from labkit.labs.sqrt_n import uniform_schedule

    assert P.segments_ops(uniform_schedule(6, 2), 6) in _all(6)


@pytest.mark.parametrize("n", [2, 5, 8, 13])
def test_the_recursion_as_ops_runs_the_layer_forwards_lab_03s_recursion_runs(n):
    from labkit.labs.recompute import checkpoint
    from labkit.labs.sqrt_n import checkpoint_recursive

    calls = []
    layers = [lambda h, i=i: calls.append(i) or torch.sin(h) for i in range(n)]
    x = torch.randn(3, requires_grad=True)
    checkpoint_recursive(layers, x, checkpoint).sum().backward()
    costs = P.OpCosts([1] * (n + 1), [1] * (n + 1), *([[0] * n] * 4), [1.0] * n)
    assert P.simulate(P.recursive_ops(n), costs)[1] == len(calls)
    calls.clear()
    P.run_ops(layers, x, P.recursive_ops(n)).sum().backward()
    assert P.simulate(P.recursive_ops(n), costs)[1] == len(calls)


def test_tables_that_are_optimistic_are_refused_not_run():
    costs = P.OpCosts([1, 1, 1], [5, 1, 1], [0, 0], [1, 1], [1, 1], [0, 0], [1.0, 1.0])  # B reaches less than it leaves
    with pytest.raises(ValueError, match="over the budget of 3 B: the tables"):
        P.optimal_ops(costs, 3)


def test_ops_that_would_make_a_tensor_twice_or_drop_what_is_not_kept_are_refused():
    costs = P.OpCosts([1] * 3, [1] * 3, [0, 0], [1, 1], [1, 1], [1, 1], [1.0, 1.0])
    with pytest.raises(ValueError, match="would make x\\[1\\] again"):
        P.simulate([P.Op("T", 0), P.Op("F", 0), P.Op("T", 1), P.Op("B", 1), P.Op("B", 0)], costs)
    for i in (0, 1, 2):
        with pytest.raises(ValueError, match=f"lets go of x\\[{i}\\]"):
            P.simulate([P.Op("T", 0), P.Op("del", i), P.Op("T", 1), P.Op("B", 1), P.Op("B", 0)], costs)


def test_bad_input_is_refused_by_name():
    costs = P.OpCosts([1, 1], [1, 1], [0], [1], [1], [1], [1.0])
    with pytest.raises(TypeError, match="budget must be an int"):
        P.optimal_ops(costs, 2.5)
    with pytest.raises(ValueError, match="x and grad need n \\+ 1 entries"):
        P.OpCosts([1], [1], [0], [1], [1], [1], [1.0])
    with pytest.raises(ValueError, match="needs x\\[1\\], which is not kept"):
        P.simulate([P.Op("F", 1), P.Op("T", 0), P.Op("B", 0)], P.OpCosts([1] * 3, [1] * 3, [0, 0], [1, 1], [1, 1],
                                                                       [1, 1], [1.0, 1.0]))
    with pytest.raises(ValueError, match="never reach the gradient"):
        P.simulate([P.Op("T", 0)], costs)


def test_equals_revolve_on_uniform_chains():
    """Reduced to Revolve's model (revolve_model: a kept state one unit, one taped step at a time beside the
    slots), the optimum's forward steps are binomial Revolve's least (Griewank and Walther; checkpoint_schedules'
    optimal_steps_binomial, computed apart from the kit) for every n <= 64 and s = 1..8 slots, and the schedule
    it returns holds one tape at a time."""
    binomial = pytest.importorskip("checkpoint_schedules.multistage",
                                   reason="checkpoint-schedules is not installed").optimal_steps_binomial
    for n in range(1, 65):
        for s in range(1, 9):
            costs, budget = P.revolve_model(n, s)
            ops = P.optimal_ops(costs, budget)
            peak, forwards = P.simulate(ops, costs)
            assert peak <= budget and forwards == (1 if n == 1 else binomial(n, min(s, n - 1))), (n, s)
            taped = 0
            for op in ops:
                taped += (op.kind == "T") - (op.kind == "B")
                assert taped <= 1, (n, s, ops)
    # one unit less and the chain runs with one slot less: Revolve's count with s - 1
    for n, s in ((20, 3), (30, 4), (12, 2)):
        costs, budget = P.revolve_model(n, s)
        assert P.simulate(P.optimal_ops(costs, budget - 1), costs)[1] == binomial(n, s - 1) > binomial(n, s)


def test_revolve_model_refuses_what_is_no_chain_or_no_slot():
    for n, s in ((0, 1), (3, 0), (True, 2), (3, 1.5)):
        with pytest.raises(ValueError, match="n and slots must be ints >= 1"):
            P.revolve_model(n, s)


def test_held_against_the_mixed_schedules_on_uniform_chains():
    """The mixed schedules of Maddison (2024; checkpoint_schedules' optimal_steps_mixed), Revolve's model with
    a layer's backward dependencies storable too: s slots, each a layer's checkpoint or its dependencies, and
    the state being advanced held for free. This model reduced to it (a kept input and a taped layer's output
    one unit each, gradients and overheads nothing): with s + 1 units, one of them the state being advanced,
    the optimum's forward steps lie between the mixed optimum's with s + 1 slots and with s, for every n <= 64
    and s = 1..8 (the free state is what keeps them from equal)."""
    mixed = pytest.importorskip("checkpoint_schedules.mixed", reason="checkpoint-schedules is not installed")
    steps = lambda n, s: n if s >= n - 1 else mixed.optimal_steps_mixed(n, s)  # noqa: E731
    for n in range(2, 65):
        costs = P.OpCosts([1] * n + [0], [0] * (n + 1), [0] * n, [0] * n, [0] * n, [0] * n, [1.0] * n)
        for s in range(1, 9):
            forwards = P.simulate(P.optimal_ops(costs, s + 1), costs)[1]
            assert steps(n, s + 1) <= forwards <= steps(n, s), (n, s)
    # at s = n - 1 slots every layer is taped once: the mixed schedules and the optimum both run n forwards
    assert P.simulate(P.optimal_ops(P.OpCosts([1] * 9 + [0], [0] * 10, *([[0] * 9] * 4), [1.0] * 9), 8),
                      P.OpCosts([1] * 9 + [0], [0] * 10, *([[0] * 9] * 4), [1.0] * 9))[1] == 9 == steps(9, 8)

def _counted(calls: list):
    """Lab 03's optimal_tables, each call appended to `calls` (its unit)."""
    from labkit.labs.sqrt_n import optimal_tables

    def tables(costs, u):
        calls.append(u["unit"])
        return optimal_tables(costs, u)
    return tables


@pytest.mark.parametrize("seed", range(4))
def test_tables_for_fills_once_and_reads_back_the_optimum_at_every_budget(seed):
    """One fill for every budget of a chain, each schedule read back fitting its budget and costing what a
    fill of its own (optimal_ops) costs: on drawn chains the unit is the amounts' common divisor at every budget,
    so both are exhaustive search's optimum."""
    rng = np.random.default_rng(100 + seed)
    for n in (3, 5, 6):
        costs = drawn_op_costs(rng, n)
        budgets = sorted({peak for peak, _ in (P.simulate(ops, costs) for ops in _all(n))})
        calls = []
        tables = P.tables_for(costs, budgets[-1], tables=_counted(calls))
        assert tables.least() == P.least_budget(costs) == budgets[0]
        for budget in [budgets[0] - 1, *budgets]:
            ops, own = tables.ops(budget), P.optimal_ops(costs, budget)
            assert (ops is None) == (own is None) == (budget < budgets[0]), (n, budget)
            if ops is not None:
                peak, cost = P.simulate(ops, costs)
                assert peak <= budget and cost == pytest.approx(P.simulate(own, costs)[1]), (n, budget)
        assert len(calls) == 1, calls


def test_the_lab_chain_is_solved_at_all_its_budgets_with_one_fill(monkeypatch):
    """optimal_rows (lab 03's optimum at its 10-14 budgets) fills the tables once, not once per budget, and at each
    budget the schedule fits and costs what a fill of the budget's own, in its own finer unit, costs."""
    from labkit.bench import lab03
    import labkit.labs.sqrt_n as S

    calls = []
    monkeypatch.setattr(S, "optimal_tables", _counted(calls))
    chain, x = hetero_chain(sizes("tiny"), 16)
    found = lab03.optimal_rows(chain, x, repeats=1)
    mine = [r for r in found["rows"] if r["name"] == "optimal"]
    assert len(mine) >= 6 and len(calls) == 1, (len(mine), calls)
    costs = found["costs"]
    for r in mine:
        ops = found["tables"].ops(r["budget"])
        assert r["predicted_peak"] == P.simulate(ops, costs)[0] <= r["budget"]
        assert P.simulate(ops, costs)[1] == pytest.approx(P.simulate(P.optimal_ops(costs, r["budget"]), costs)[1])


def test_tables_refuse_a_budget_they_were_not_filled_for():
    costs = drawn_op_costs(np.random.default_rng(7), 5)
    top = P.simulate(P.store_all(5), costs)[0]
    low = P.least_budget(costs)
    tables = P.tables_for(costs, low)
    assert tables.ops(top) == P.store_all(5) and tables.ops(low - 1) is None
    if low + 1 < top:
        with pytest.raises(ValueError, match=f"budget {low + 1:,} B is over the {low:,} B"):
            tables.ops(low + 1)
    with pytest.raises(TypeError, match="budget must be an int"):
        P.tables_for(costs, 2.5)
    assert P.tables_for(costs, -1).ops(-1) is None and P.tables_for(costs, -1).least() is None
