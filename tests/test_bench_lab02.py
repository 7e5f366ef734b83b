"""Lab 02's benchmark: the three-way comparison runs, reports its keys, and keeps gradients bitwise."""
from __future__ import annotations

import pytest

import labkit as lk
from labkit import bench
from labkit.reference.recompute import checkpoint


def test_recompute_comparison_on_tiny_reports_every_key_and_equal_gradients():
    result = bench.recompute_comparison(checkpoint, lk.sizes("tiny"))
    figures = result.figures()
    for key in ("peak_ratio_vs_torch", "time_ratio_vs_torch", "peak_ratio_vs_none", "grads_bitwise_equal"):
        assert key in figures
    assert figures["grads_bitwise_equal"] is True
    assert figures["peak_ratio_vs_none"] < 1
    assert set(result.meters) == {"none", "torch", "yours"}
    assert "bitwise: True" in result.summary()


def test_recompute_comparison_rejects_a_non_callable():
    with pytest.raises(TypeError, match="checkpoint must be callable"):
        bench.recompute_comparison("checkpoint", lk.sizes("tiny"))


def test_an_unfinished_checkpoint_fails_before_anything_is_measured(monkeypatch):
    """Run All on a student notebook: a stub must fail at once, not after the other variants' steps and timings."""
    def stub(fn, *args):
        raise NotImplementedError("Exercise 2.1: a checkpoint")
    steps = []
    monkeypatch.setattr(bench.lab02, "_metered", lambda *a, **k: pytest.fail("measured before the stub failed"))
    real = bench.lab02.stack_step
    monkeypatch.setattr(bench.lab02, "stack_step", lambda m, x, c: (steps.append(c), real(m, x, c))[1])
    with pytest.raises(NotImplementedError, match="Exercise 2.1"):
        bench.recompute_comparison(stub, lk.sizes("tiny"))
    assert steps == [stub]
