"""labkit.instruments.ops.trace: what it adds to a forward's memory, and which call made the output."""
from __future__ import annotations

import torch

import labkit as lk
from labkit.instruments.ops import OpRecord, trace


def _block():
    cfg = lk.GPTConfig(seq=64, batch=2, hidden=32, heads=4, n_layers=1)
    return lk.GPTStack(cfg).blocks[0], lk.gpt_input(cfg, requires_grad=True)


def test_a_timed_trace_adds_one_op_at_a_time_to_the_forwards_memory():
    block, x = _block()
    plain = lk.measure_peak(block, x, track=(block, x))
    traced = lk.measure_peak(lambda t: lk.ops.trace(block, t, model=block, repeats=2), x, track=(block, x))
    records = lk.ops.trace(block, x, model=block, time=False)
    # one op's argument copies and one replay's outputs live beside the forward, never every op's at once
    largest = max(r.bytes_moved for r in records)
    assert traced.peak - traced.baseline <= plain.peak - plain.baseline + 2 * largest
    assert sum(r.bytes_moved for r in records) > 4 * largest  # so keeping every op's copies would fail the bound


def test_the_output_is_marked_on_the_call_that_made_it():
    block, x = _block()
    records = lk.ops.trace(block, x, model=block, repeats=1)
    assert [r.is_output for r in records].count(True) == 1
    last_fresh = [r for r in records if r.output_bytes][-1]
    assert last_fresh.is_output and all(r.seconds is not None and r.seconds >= 0 for r in records)
    assert all(r.seconds is None for r in lk.ops.trace(block, x, model=block, time=False))


def test_timing_a_random_op_leaves_the_forwards_draws_as_they_were():
    cfg = lk.GPTConfig(seq=16, batch=2, hidden=32, heads=4, n_layers=1, dropout=0.5)
    block, x = lk.GPTStack(cfg).blocks[0], lk.gpt_input(cfg)
    seen = {}

    def run(key):
        torch.manual_seed(3)
        seen[key] = block(x)
        return seen[key]

    run("plain")
    lk.ops.trace(lambda t: run("timed"), x, model=block, repeats=3)
    assert torch.equal(seen["plain"], seen["timed"])  # the same dropout masks, drawn in the same order


def test_keys_count_from_zero_and_views_in_place_ops_and_fresh_outputs_are_told_apart():
    w = torch.randn(4, 4)

    def f(x):
        y = x @ w  # fresh
        z = y.t()  # a view of it
        z.add_(1)  # in place, through the view: y is changed after it was made
        return (y @ w).relu()

    ops = trace(f, torch.randn(3, 4), time=False)
    by_key = {r.key: r for r in ops}
    assert [r.key for r in ops if r.op == "mm"] == ["mm#0", "mm#1"]  # PyTorch's selective checkpoint counts so
    assert by_key["t#0"].is_view and not by_key["t#0"].in_place and by_key["t#0"].output_bytes == 0
    assert by_key["add_#0"].in_place and not by_key["add_#0"].is_view and by_key["add_#0"].output_bytes == 0
    assert not by_key["mm#0"].is_view and by_key["mm#0"].output_bytes == 3 * 4 * 4
    assert by_key["mm#0"].mutated and not by_key["mm#1"].mutated and not by_key["relu#0"].mutated


def test_bytes_moved_counts_what_an_op_reads_and_what_it_writes():
    a, b = torch.randn(32), torch.randn(32)
    (add,) = [r for r in trace(lambda x: x + b, a, time=False) if r.op == "add"]
    assert (add.bytes_moved, add.output_bytes) == (3 * 32 * 4, 32 * 4)  # two inputs read, one output written


def test_a_hand_made_record_is_neither_the_output_nor_changed_later_unless_it_says_so():
    """Planners and checkers build records by hand (made-up profiles): the two flags default to False."""
    r = OpRecord(key="add#0", op="add", module="", flops=0, bytes_moved=12, output_bytes=4, elements=1,
                 is_view=False, in_place=False, random=False, seconds=None)
    assert (r.is_output, r.mutated) == (False, False)
