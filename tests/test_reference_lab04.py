"""Lab 04's reference answers (labkit.reference.selective) held against PyTorch and exhaustive search: on a
one-block float64 GPT stack (dropout 0 and 0.1), checkpoint_selective and PyTorch's torch.utils.checkpoint under
torch_policy(keep) give gradients of the input and every parameter bitwise equal to a plain step (generator
seeded alike), rerun the same ops in backward, and keep what the meter (the lab's measure) sees PyTorch's keep,
kept_bytes(ops, keep) plus the input, for fixed keep-sets and drawn ones random_ok allows; where PyTorch's would
be silently wrong (a kept random op before a recomputed one) the kit's refuses in forward, naming both.
knapsack_keep, on windows of the block's trace with drawn seconds, is the optimum of an exhaustive search over
every subset of candidates at an exact byte unit and within a stated rounding bound at a coarse one, never over
budget nor against random_ok; greedy_keep is never over budget nor better than the exact knapsack.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from collections import Counter
from functools import cache

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import SAC_IGNORED_OPS, checkpoint, set_checkpoint_early_stop

import labkit as lk
import labkit.reference.selective as S
from labkit.instruments.meter import measure_peak
from labkit.instruments.ops import trace

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def setup(dropout: float):
    """The block, its input (a leaf that requires grad) and its trace."""
    cfg = lk.GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dropout=dropout, dtype=torch.float64)
    block, x = lk.GPTStack(cfg).blocks[0], lk.gpt_input(cfg, requires_grad=True)
    return block, x, tuple(trace(block, x, model=block, time=False))


class Calls(TorchDispatchMode):
    """Counts the ops PyTorch's selective checkpoint counts (not SAC_IGNORED_OPS) by name: what a backward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in SAC_IGNORED_OPS:
            self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def grads(block, x, run, seed: int = 11) -> tuple[tuple[torch.Tensor, ...], Counter[str]]:
    """Gradients of the parameters and input of a weighted sum of run(x), seeded; and the ops backward ran."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = run(x)
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum()
        with Calls() as calls:
            return torch.autograd.grad(loss, [*block.parameters(), x]), calls.counts


def kept(block, x, run) -> int:
    """Bytes alive after run's forward beyond the block, x and the output, the block's input made inside."""
    with torch.random.fork_rng(devices=[]):
        meter = measure_peak(lambda: run(x * 1), track=(block, x))  # x * 1: an input the region must keep
    return meter.live - meter.baseline - meter.result.untyped_storage().nbytes()


def theirs(block, keep):
    """PyTorch's selective checkpoint; without early stop, its recomputation runs the whole block, as ours does."""
    def run(h):
        with set_checkpoint_early_stop(False):
            return checkpoint(block, h, use_reentrant=False, context_fn=S.torch_policy(keep))
    return run


def held_against_pytorch(dropout: float, keep: frozenset[str], seed: int = 11, bytes_model: bool = True) -> None:
    block, x, ops = setup(dropout)
    plain, _ = grads(block, x, block, seed)
    reran = []
    ours = lambda h: S.checkpoint_selective(block, h, keep=keep)  # noqa: E731
    for run in (ours, theirs(block, keep)):
        got, calls = grads(block, x, run, seed)
        assert len(got) == len(plain) and all(torch.equal(a, b) for a, b in zip(plain, got)), sorted(keep)
        reran.append(calls)
    assert reran[0] == reran[1], sorted(keep)  # the same ops rerun (the kept ones not) and the same backward
    mine = kept(block, x, ours)
    assert mine == kept(block, x, theirs(block, keep)), sorted(keep)
    if bytes_model:
        assert mine == S.kept_bytes(ops, keep) + x.numel() * x.element_size(), sorted(keep)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("policy", [
    lambda ops: frozenset(), lambda ops: frozenset(r.key for r in S.candidates(ops)), S.selective_keep,
    lambda ops: frozenset(r.key for r in ops if r.op in ("addmm", "bmm")),
], ids=["nothing", "every candidate", "selective_keep", "the matrix products"])
def test_fixed_keep_sets_match_a_plain_step_and_pytorch_bit_for_bit_and_keep_kept_bytes(dropout, policy):
    keep = policy(setup(dropout)[2])
    assert S.random_ok(setup(dropout)[2], keep)
    held_against_pytorch(dropout, keep)


def test_keeping_every_op_views_included_still_matches_pytorch():  # a kept view holds its base: not kept_bytes
    held_against_pytorch(0.1, frozenset(r.key for r in setup(0.1)[2]), bytes_model=False)


@st.composite
def allowed_keeps(draw):
    """A dropout, a seed, and a random subset of the candidates that random_ok allows (a suffix of the random ops)."""
    dropout = draw(st.sampled_from([0.0, 0.1]))
    items = S.candidates(setup(dropout)[2])
    rand = [r.key for r in items if r.random]
    rest = draw(st.sets(st.sampled_from([r.key for r in items if not r.random])))
    return dropout, draw(st.integers(0, 2**16)), frozenset(rest) | frozenset(rand[draw(st.integers(0, len(rand))):])


@given(allowed_keeps())
@SETTINGS
def test_drawn_keep_sets_match_a_plain_step_and_pytorch_bit_for_bit_and_keep_kept_bytes(case):
    dropout, seed, keep = case
    assert S.random_ok(setup(dropout)[2], keep)
    held_against_pytorch(dropout, keep, seed)


@pytest.mark.parametrize("kept_random", [(0,), (1,), (0, 1), (0, 2)])
def test_a_kept_random_op_before_a_recomputed_one_is_refused_in_forward_naming_both(kept_random):
    block, x, ops = setup(0.1)
    rand = [r.key for r in ops if r.random]  # three dropouts: attention's, then the two residual ones
    keep = frozenset(rand[i] for i in kept_random) | S.selective_keep(ops) - set(rand)
    assert not S.random_ok(ops, keep)
    first = rand[kept_random[0]]
    later = next(k for k in rand[kept_random[0]:] if k not in keep)
    with pytest.raises(S.CheckpointError, match=re.escape(S.RANDOM_ORDER.format(kept=first, later=later))):
        S.checkpoint_selective(block, x, keep=keep)  # forward alone: nothing to backward through


# ---------------------------------------------------------------- the planners against exhaustive search
def cands(ops) -> list:
    return [r for r in ops if r.output_bytes > 0 and not r.is_view]  # views and in-place ops make no bytes


def weight(r) -> int:
    return 0 if r.is_output else r.output_bytes  # the block's output is kept by the next block anyway


@st.composite
def windows(draw):
    """A run of the dropout block's trace with at most 14 candidates, each op given drawn whole seconds."""
    ops = setup(0.1)[2]
    start = draw(st.integers(0, len(ops) - 1))
    window, n = [], 0
    for r in ops[start:]:
        n += r.output_bytes > 0 and not r.is_view
        if n > 14:
            break
        window.append(replace(r, seconds=float(draw(st.integers(0, 9)))))
    return window


def exhaustive(ops, budget: int) -> float:
    """The most seconds kept by any subset of the candidates within `budget` bytes for which random_ok holds."""
    items = cands(ops)
    pick = (np.arange(2 ** len(items))[:, None] >> np.arange(len(items))) & 1 == 1
    nbytes = pick @ np.array([weight(r) for r in items], dtype=np.int64)
    seconds = pick @ np.array([r.seconds for r in items])
    ok = np.ones(len(pick), dtype=bool)
    rand = [i for i, r in enumerate(items) if r.random]
    for a, b in zip(rand, rand[1:]):  # a kept random op only with every later one kept
        ok &= ~pick[:, a] | pick[:, b]
    return float(seconds[(nbytes <= budget) & ok].max())


def seconds_kept(ops, keep, budget: int) -> float:
    """The seconds a planner's keep-set saves, once it is checked: candidates only, random_ok, within budget."""
    assert keep <= {r.key for r in cands(ops)}
    kinds = [r.key in keep for r in ops if r.random]
    assert kinds == sorted(kinds), sorted(keep)  # the recomputed random ops first
    assert sum(weight(r) for r in ops if r.key in keep) <= budget
    return sum(r.seconds for r in ops if r.key in keep)


def held_against_exhaustive(ops, budget: int, most: int = 4096) -> None:
    items = cands(ops)
    got = seconds_kept(ops, S.knapsack_keep(ops, budget, most), budget)
    rest = [weight(r) for r in items if not r.random]  # what fill packs, beside a suffix of the random ops
    g = math.gcd(*rest) or 1
    if budget // g <= most:  # every fill counts in units of g, which divides every weight: no rounding
        assert got == exhaustive(ops, budget)
        assert seconds_kept(ops, S.greedy_keep(ops, budget), budget) <= got
    else:  # units of u <= U bytes: a set of k weights fits if its bytes + (k + 1) * (u - 1) fit (each weight
        # rounded up by under a unit, the budget down by under one); so nothing within budget - loss is lost
        unit = max(g, -(-budget // most))
        loss = (len(rest) + 1) * (unit - 1)
        floor = exhaustive(ops, budget - loss) if budget >= loss else 0.0
        assert floor <= got <= exhaustive(ops, budget)


@given(windows(), st.floats(0, 1.05), st.sampled_from([4096, 4096, 8, 64]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_knapsack_is_the_exhaustive_optimum_at_an_exact_unit_and_greedy_never_beats_it(ops, share, most):
    held_against_exhaustive(ops, int(share * sum(weight(r) for r in cands(ops))), most)


@pytest.mark.parametrize("most", [4096, 16])
def test_knapsack_keeps_the_random_ops_as_a_suffix_when_the_first_is_the_most_worth_keeping(most):
    # from attention's dropout on: three dropouts; keeping the first (9 s) needs the other two, over budget
    ops = setup(0.1)[2]
    start = next(i for i, r in enumerate(ops) if r.random)
    window = [replace(r, seconds=9.0 if i == start else 1.0) for i, r in enumerate(ops) if i >= start]
    assert sum(r.random for r in window) == 3 and len(cands(window)) <= 14
    held_against_exhaustive(window, weight(window[0]) + 2048, most)
    assert window[0].key not in S.knapsack_keep(window, weight(window[0]) + 2048, most)


BLOCK = [replace(r, seconds=1e-3 * (1 + i % 5)) for i, r in enumerate(setup(0.1)[2])]  # the whole block
EVERYTHING = frozenset(r.key for r in cands(BLOCK))
TOTAL = sum(weight(r) for r in cands(BLOCK))


def test_both_planners_fit_every_budget_on_the_whole_block_and_greedy_keeps_everything_when_it_fits():
    for budget in [*range(0, TOTAL, 997), TOTAL - 1, TOTAL]:
        for planner in (S.greedy_keep, S.knapsack_keep):
            seconds_kept(BLOCK, planner(BLOCK, budget), budget)
    assert S.greedy_keep(BLOCK, TOTAL) == EVERYTHING


@pytest.mark.xfail(strict=True, reason="at the default most=4096 the block's 58,632 B count in units of 15 B, "
                   "each rounded up: keeping every candidate no longer fits the DP, though it fits the budget")
def test_knapsack_keeps_everything_when_everything_fits_on_the_whole_block():
    assert S.knapsack_keep(BLOCK, TOTAL) == EVERYTHING


def test_pytorch_asks_a_selective_policy_in_forward_only_and_ctx_is_recompute_is_always_false():
    """What lab 04's torch_policy comment says of torch 2.13: the policy is asked once per op call in forward and
    never in the recomputation (its cache serves that by index), and ctx.is_recompute is False throughout."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    asked: list[bool] = []

    def policy(ctx, func, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        asked.append(ctx.is_recompute)
        return CheckpointPolicy.PREFER_RECOMPUTE

    w = torch.randn(8, 8, requires_grad=True)
    fn = lambda h: torch.tanh(h @ w) @ w  # noqa: E731
    out = checkpoint(fn, torch.randn(4, 8), use_reentrant=False,
                     context_fn=lambda: create_selective_checkpoint_contexts(policy))
    in_forward = len(asked)
    out.sum().backward()
    assert in_forward >= 3 and len(asked) == in_forward and not any(asked)
