"""Lab 03's reference code (labkit.reference.sqrt_n) against PyTorch, brute force and its own model."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import labkit as lk
import labkit.reference.sqrt_n as S
from labkit.bench.lab03 import activation_peak, mlp_chain
from labkit.checks.lab03.planner import best_cost
from labkit.instruments import saved_tensors


def _chain(n: int, width: int = 6) -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    chain = nn.Sequential(*[nn.Sequential(nn.Linear(width, width, dtype=torch.float64), nn.Tanh()) for _ in range(n)])
    return chain, torch.randn(4, width, dtype=torch.float64, requires_grad=True)


def _grads(chain: nn.Module, x: torch.Tensor, run) -> list[torch.Tensor]:
    chain.zero_grad(set_to_none=True)
    x.grad = None
    run(list(chain), x).sum().backward()
    return [p.grad.clone() for p in chain.parameters()] + [x.grad.clone()]


PLAIN = lambda layers, x: S.run_layers(layers)(x)  # noqa: E731


# ---------------------------------------------------------------- segments and recursion
@pytest.mark.parametrize("n, k", [(1, 1), (5, 2), (7, 3), (8, 8)])
@pytest.mark.parametrize("which", ["lab 02", "torch"])
def test_segments_give_the_plain_gradients_bitwise(n, k, which):
    ckpt = S.checkpoint if which == "lab 02" else (lambda f, h: torch_checkpoint(f, h, use_reentrant=False))
    chain, x = _chain(n)
    want = _grads(chain, x, PLAIN)
    got = _grads(chain, x, lambda layers, h: S.checkpoint_segments(layers, h, k, ckpt))
    assert all(torch.equal(a, b) for a, b in zip(want, got))


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_recursion_gives_the_plain_gradients_bitwise(n):
    chain, x = _chain(n)
    assert all(torch.equal(a, b) for a, b in zip(_grads(chain, x, PLAIN),
                                                 _grads(chain, x, lambda ls, h: S.checkpoint_recursive(ls, h))))


def test_segments_keep_exactly_their_inputs():
    chain, x = _chain(6)
    led = saved_tensors(lambda h: S.checkpoint_segments(chain, h, 3), x)
    assert led.total_bytes == 3 * x.numel() * x.element_size()


@pytest.mark.parametrize("segments, error", [(0, ValueError), (7, ValueError), (2.5, TypeError), (True, TypeError)])
def test_bad_segments_name_the_value(segments, error):
    chain, x = _chain(6)
    with pytest.raises(error, match=f"segments={segments!r} must be an int from 1 to 6"):
        S.checkpoint_segments(chain, x, segments)


def test_bad_chains():
    x = torch.ones(2, 2)
    with pytest.raises(ValueError, match="the chain is empty"):
        S.checkpoint_segments([], x, 1)
    with pytest.raises(TypeError, match=r"layers\[1\] is a int"):
        S.checkpoint_segments([torch.tanh, 3], x, 1)
    with pytest.raises(TypeError, match="got str"):
        S.checkpoint_recursive("abc", x)


def test_the_model_is_exact_on_the_lab_chain():
    """Measured activation peak = segment_peak with constants from the ledger and one plain step (tiny sizes)."""
    size = lk.sizes("tiny")
    model, x = mlp_chain(size, 16)
    constants = lk.bench.segment_constants(model, x, S.checkpoint)
    for k in (1, 3, 4, 16):
        run = (lambda layers, h, k=k: S.checkpoint_segments(layers, h, k))
        assert activation_peak(model, x, run) == S.segment_peak(16, k, **constants)


@given(st.integers(1, 300), st.integers(1, 50), st.integers(1, 50))
@settings(max_examples=60, deadline=None)
def test_best_segments_is_near_the_square_root(n, a, b):
    """k* minimises k·a + ceil(n/k)·b; it lies within a factor of two of √(n·b/a) (clipped to 1..n)."""
    k = S.best_segments(n, a, b)
    ideal = min(max(math.sqrt(n * b / a), 1), n)
    assert ideal / 2 - 1 <= k <= 2 * ideal + 1


# ---------------------------------------------------------------- the planner
costs_strategy = st.integers(1, 7).flatmap(lambda n: st.builds(
    S.ChainCosts, st.lists(st.integers(1, 6), min_size=n, max_size=n), st.lists(st.integers(1, 3), min_size=n,
                                                                                max_size=n),
    st.lists(st.integers(0, 8).map(float), min_size=n, max_size=n), st.integers(0, 2)))


@given(costs_strategy, st.integers(0, 40))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_plan_matches_exhaustive_search(costs, budget):
    found = S.plan(costs, budget)
    want = best_cost(costs, budget)
    if want is None:
        assert found is None
    else:
        assert found is not None and S.peak_of(found, costs) <= budget
        assert S.recompute_cost(found, costs) == pytest.approx(want)
        assert [s.start for s in found] == [0, *[s.stop for s in found[:-1]]] and found[-1].stop == len(costs.act)


def test_plan_in_bytes_never_exceeds_the_budget():
    """Bytes far apart in scale are counted in units rounded up: the schedule still fits in bytes."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(2, 40))
        costs = S.ChainCosts([int(v) for v in rng.integers(1000, 10 ** 7, n)],
                             [int(v) for v in rng.integers(1000, 10 ** 6, n)], list(rng.random(n)), 12345)
        budget = int(rng.integers(2 * 10 ** 6, 4 * 10 ** 7))
        found = S.plan(costs, budget)
        assert found is None or S.peak_of(found, costs) <= budget


def test_schedule_for_names_the_least_budget():
    costs = S.ChainCosts([4, 4, 4, 4], [1, 1, 1, 1], [1.0] * 4, extra=1)
    least = S.least_budget(costs)
    assert S.plan(costs, least) is not None and S.plan(costs, least - 1) is None
    with pytest.raises(ValueError, match=f"the least that fits is {least:,} B"):
        S.schedule_for(costs, least - 1)
    with pytest.raises(TypeError, match="budget must be an int"):
        S.schedule_for(costs, 3.5)


def test_chain_costs_and_run_schedule_refuse_bad_input():
    with pytest.raises(ValueError, match="one entry per layer"):
        S.ChainCosts([1, 2], [1], [1.0, 1.0])
    with pytest.raises(ValueError, match="must not be negative"):
        S.ChainCosts([1], [-1], [1.0])
    chain, x = _chain(3)
    with pytest.raises(ValueError, match="must cover layers 0..3 in order"):
        S.run_schedule(chain, x, [S.Segment(0, 2, True)])


def test_a_schedule_runs_with_the_plain_gradients():
    chain, x = _chain(6)
    schedule = [S.Segment(0, 2, True), S.Segment(2, 3, False), S.Segment(3, 6, True)]
    want = _grads(chain, x, PLAIN)
    assert all(torch.equal(a, b) for a, b in zip(want, _grads(chain, x, lambda ls, h: S.run_schedule(ls, h, schedule))))


def test_profiled_heterogeneous_chain_fits_its_predictions():
    """On the lab's chain, the measured peak of √n and of the optimal schedule is at most peak_of (tiny sizes)."""
    size = lk.sizes("tiny")
    chain, x = lk.bench.hetero_chain(size, 8)
    costs = S.profile_chain(chain, x)
    assert costs.fwd[1] == 0 and costs.fwd[0] > 0  # light layers: no FLOPs
    sqrt_n = S.uniform_schedule(8, 3)
    budget = S.peak_of(sqrt_n, costs)
    optimal = S.schedule_for(costs, budget)
    for schedule in (sqrt_n, optimal):
        measured = activation_peak(chain, x, lambda ls, h, s=schedule: S.run_schedule(ls, h, s))
        assert measured <= S.peak_of(schedule, costs) <= budget
    assert S.recompute_cost(optimal, costs) < S.recompute_cost(sqrt_n, costs)


def test_a_chain_that_keeps_nothing_fits_a_budget_of_its_extra_bytes_alone():
    """Room 0 (budget == extra) is a budget, not a refusal: layers that save nothing fit it, kept plainly."""
    from labkit.reference.sqrt_n import ChainCosts, Segment, plan
    costs = ChainCosts(act=[0, 0], inp=[0, 0], fwd=[1.0, 1.0], extra=100)
    assert plan(costs, 100) == [Segment(0, 2, False)]
    assert plan(costs, 99) is None


def test_the_planner_counts_bytes_in_at_most_4096_units():
    """Past 4096 units of the chain's common divisor, the unit grows to total/4096, rounded up (never
    optimistic): 4097 bytes of a gcd of 1 count in units of 2."""
    from labkit.reference.sqrt_n import ChainCosts, _slots
    unit, act, inp = _slots(ChainCosts(act=[2048, 2047], inp=[1, 1], fwd=[1.0, 1.0], extra=0))
    assert (unit, act, inp) == (2, [1024, 1024], [1, 1])
    assert _slots(ChainCosts(act=[2047, 2047], inp=[1, 1], fwd=[1.0, 1.0], extra=0))[0] == 1  # 4096 units: kept


def test_a_chain_whose_layers_keep_less_than_their_input_is_refused_naming_the_first():
    chain = nn.Sequential(nn.Linear(4, 8), nn.Identity(), nn.Linear(8, 2), nn.Identity())
    with pytest.raises(ValueError, match=r"layer 1 keeps 0 B, less than its input \(96 B\): the planner's model "
                                         r"needs layers that keep their own input"):
        S.profile_chain(chain, torch.ones(3, 4))
