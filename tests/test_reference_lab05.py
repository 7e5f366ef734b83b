"""Lab 05's reference against an independent oracle: the roofline time is the largest of its terms, each term by
hand, on made-up records where each term is the largest in turn, and on a traced block against the checkers'
oracle; the bench names the bound that sets the time; pricing leaves the originals alone."""
from __future__ import annotations

from dataclasses import astuple

import pytest
import torch

import labkit as lk
import labkit.reference.roofline as R
from labkit.bench.lab05 import bound
from labkit.checks.lab05 import oracle
from labkit.instruments import roofline as rl
from labkit.instruments.ops import OpRecord, trace

CEIL = rl.Ceilings("cpu", torch.float32, peak_flops=1e11, peak_bandwidth=1e10, random_rate=1e8, special_rate=1e9)


def record(op="mul", flops=0, bytes_moved=1000, elements=100, random=False, seconds=1e-3, view=False) -> OpRecord:
    return OpRecord(key=f"{op}#0", op=op, module="m", flops=flops, bytes_moved=bytes_moved,
                    output_bytes=0 if view else 400, elements=elements, is_view=view, in_place=False,
                    random=random, seconds=seconds)


@pytest.mark.parametrize("rec, expected", [
    (record("mm", flops=10 ** 9, bytes_moved=10 ** 6), "compute"),  # 1e-2 s against 1e-4 s
    (record("mul", bytes_moved=10 ** 8, elements=10 ** 7), "memory"),  # 1e-2 s against 1e-4 s
    (record("native_dropout", bytes_moved=10 ** 6, elements=2 * 10 ** 6, random=True), "random"),  # 1e-2 s
    (record("_softmax", bytes_moved=10 ** 6, elements=10 ** 7), "compute"),  # 1e7 exps: 1e-2 s
])
def test_the_time_is_the_largest_term_and_the_bench_names_it(rec, expected):
    seconds = R.roofline_seconds(rec, CEIL)
    assert seconds == pytest.approx(1e-2)
    assert bound(rec, CEIL, seconds, R.compute_seconds) == expected


def test_each_term_by_hand():
    dropout = record("native_dropout", bytes_moved=9 * 10 ** 6, elements=2 * 10 ** 6, random=True)
    by_hand = max(9e6 / 1e10, 1e6 / 1e8, rl.ELEMENTWISE_FLOPS["native_dropout"] * 2e6 / 1e11)  # one draw a pair
    assert R.roofline_seconds(dropout, CEIL) == pytest.approx(by_hand) == pytest.approx(1e-2)
    softmax = record("_softmax", bytes_moved=10, elements=10 ** 6)
    assert R.compute_seconds(softmax, CEIL) == pytest.approx(max(5e6 / 1e11, 1e6 / 1e9))  # exp sets it
    spec = rl.GPU_SPECS["H100"].ceilings()  # no random limit, no exp limit on a spec sheet
    assert R.roofline_seconds(dropout, spec) == pytest.approx(9e6 / spec.peak_bandwidth)


def test_a_time_no_term_reaches_has_no_bound():
    assert bound(record("mul", bytes_moved=10 ** 6), CEIL, 1.0, R.compute_seconds) == "none"  # 1 s: no term is


def test_a_view_costs_nothing():
    assert R.roofline_seconds(record(view=True), CEIL) == 0.0


def test_the_reference_agrees_with_the_checkers_oracle_on_a_traced_block():
    cfg = lk.GPTConfig(seq=16, batch=2, hidden=16, heads=2, n_layers=1, dropout=0.1)
    block = lk.GPTStack(cfg).blocks[0]
    records = trace(block, lk.gpt_input(cfg, requires_grad=True), model=block, time=False)
    for c in (CEIL, rl.GPU_SPECS["A100"].ceilings()):
        for r in records:
            assert R.roofline_seconds(r, c) == pytest.approx(oracle.seconds(r, c), rel=1e-12, abs=0), r.key


def test_price_replaces_seconds_and_leaves_the_records_alone():
    records = [record("mm", flops=10 ** 9), record("mul")]
    before = [astuple(r) for r in records]
    priced = R.price(records, lambda r: R.roofline_seconds(r, CEIL))
    assert [r.seconds for r in priced] == [R.roofline_seconds(r, CEIL) for r in records]
    assert [astuple(r) for r in records] == before
    assert [r.seconds for r in R.price(records, R.flops_only(CEIL))] == [1e9 / 1e11, 0.0]
