"""The optimal persistent schedule (labkit.planners.persistent): run for real, its measured peak is the simulated
one to the byte and its gradients are the plain chain's bit for bit; the dynamic program equals exhaustive
search over every persistent schedule of short chains with made-up costs, each simulated."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from labkit.bench.lab03 import activation_peak, hetero_chain
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
    for budget in sorted({low + (top - low) * k // 4 for k in range(5)}):
        ops = P.optimal_ops(costs, budget)
        predicted, _ = P.simulate(ops, costs)
        assert predicted <= budget
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


def _schedules(s: int, e: int):
    """Every persistent schedule of layers [s, e) as ops (the grammar the dynamic program searches)."""
    inner = [[]] if e == s + 1 else list(_schedules(s + 1, e))
    for rest in inner:
        yield [P.Op("T", s), *rest, P.Op("B", s)]
    for split in range(s + 1, e):
        run = [P.Op("F", s), *(P.Op("F", j, drop=True) for j in range(s + 1, split))]
        for right in _schedules(split, e):
            for left in _schedules(s, split):
                yield [*run, *right, P.Op("del", split), *left]


@functools.cache
def _all(n: int) -> list:
    return list(_schedules(0, n))


def _drawn(rng, n: int) -> P.OpCosts:
    x = [int(v) for v in rng.integers(1, 4, n + 1)]
    draw = lambda low, k: [low[i] + int(v) for i, v in enumerate(rng.integers(0, 3, k))]  # noqa: E731
    return P.OpCosts(x, [x[i] if i < n else 1 for i in range(n + 1)], [int(v) for v in rng.integers(0, 3, n)],
                     draw(x[1:], n), draw(x[1:], n), draw(x[:n], n), [float(v) for v in rng.integers(1, 6, n)],
                     int(rng.integers(0, 3)))


@pytest.mark.parametrize("seed", range(6))
def test_the_dynamic_program_equals_exhaustive_search_over_persistent_schedules(seed):
    rng = np.random.default_rng(seed)
    for n in (1, 2, 3, 4, 5, 6) if seed < 5 else (7,):
        costs = _drawn(rng, n)
        simulated = [P.simulate(ops, costs) for ops in _all(n)]
        for budget in sorted({peak for peak, _ in simulated})[:: max(1, len(simulated) // 40)] + [0]:
            fits = [cost for peak, cost in simulated if peak <= budget]
            ops = P.optimal_ops(costs, budget)
            if not fits:
                assert ops is None, (n, budget)
                continue
            assert ops is not None, (n, budget, min(fits))
            peak, cost = P.simulate(ops, costs)
            assert peak <= budget and cost == pytest.approx(min(fits)), (n, budget, costs)


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


def test_held_against_revolve_on_uniform_chains():
    """Revolve's model (checkpoint_schedules' optimal_steps_mixed: s slots, each holding a layer's checkpoint or
    its backward's dependencies, and the state being advanced held for free) against this one reduced to it (a
    kept input and a taped layer's output one unit each, gradients and overheads nothing): with s + 1 units,
    one of them the state being advanced, the optimum's forward steps lie between Revolve's with s + 1 slots
    and with s, for every n <= 64 and s = 1..8 (the free state is what keeps them from equal)."""
    mixed = pytest.importorskip("checkpoint_schedules.mixed", reason="checkpoint-schedules is not installed")
    steps = lambda n, s: n if s >= n - 1 else mixed.optimal_steps_mixed(n, s)  # noqa: E731
    for n in range(2, 65):
        costs = P.OpCosts([1] * n + [0], [0] * (n + 1), [0] * n, [0] * n, [0] * n, [0] * n, [1.0] * n)
        for s in range(1, 9):
            forwards = P.simulate(P.optimal_ops(costs, s + 1), costs)[1]
            assert steps(n, s + 1) <= forwards <= steps(n, s), (n, s)
    # at s = n - 1 slots every layer is taped once: Revolve and the optimum both run n forwards
    assert P.simulate(P.optimal_ops(P.OpCosts([1] * 9 + [0], [0] * 10, *([[0] * 9] * 4), [1.0] * 9), 8),
                      P.OpCosts([1] * 9 + [0], [0] * 10, *([[0] * 9] * 4), [1.0] * 9))[1] == 9 == steps(9, 8)
