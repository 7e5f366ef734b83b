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
