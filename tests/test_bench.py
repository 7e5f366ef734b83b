"""Benchmarks and figures: they run, report the keys the issues name, and hold their bars' meaning."""
from __future__ import annotations

import json

import pytest
import torch
from matplotlib.figure import Figure

import labkit as lk
from labkit import bench, gpucheck, plots
from labkit.reference.recompute import checkpoint


def test_formula_bench_reconciles_within_15_percent_from_mlp_to_attention_dominated():
    figures = bench.formula()
    ratios = [r["s"] / r["h"] for r in figures["configs"]]
    assert len(ratios) >= 3 and min(ratios) < 0.1 and max(ratios) > 4
    assert figures["max_rel_error"] <= 0.15
    for row in figures["configs"]:
        # the whole residual is the two LayerNorms' mean and rstd: 2 x 2 x (s*b) bfloat16 values
        assert row["measured_bytes"] - row["formula_bytes"] == 2 * 2 * row["s"] * row["b"] * 2
    json.dumps(figures)


def test_recompute_comparison_on_tiny_reports_every_key_and_equal_gradients():
    result = bench.recompute_comparison(checkpoint, lk.sizes("tiny"))
    figures = result.figures()
    for key in ("peak_ratio_vs_torch", "time_ratio_vs_torch", "peak_ratio_vs_none", "grads_bitwise_equal"):
        assert key in figures
    assert figures["grads_bitwise_equal"] is True
    assert figures["peak_ratio_vs_none"] < 1
    assert set(result.meters) == {"none", "torch", "yours"}
    assert "bitwise: True" in result.summary()


def test_meter_bench_reports_one_ratio_per_repeat():
    figures = bench.meter(lk.sizes("tiny"))
    assert figures["slowdown"] > 0 and len(figures["ratios"]) == lk.sizes("tiny").repeats


def test_recompute_comparison_rejects_a_non_callable():
    with pytest.raises(TypeError, match="checkpoint must be callable"):
        bench.recompute_comparison("checkpoint", lk.sizes("tiny"))


def test_bench_cli_unknown_name(capsys):
    assert bench.main("nope") == 2
    assert "choose one of formula, meter, recompute" in capsys.readouterr().err


def test_plots_return_figures():
    size = lk.sizes("tiny")
    model = lk.MLPChain(lk.MLPConfig(n_layers=2, width=size.mlp_width))
    x = lk.mlp_input(model.cfg, batch=size.mlp_batch)
    meter = lk.measure_peak(lambda: model(x).sum().backward(), track=(model, x))
    ledger = lk.saved_tensors(model, x, model=model)
    figures = [plots.timeline(meter), plots.timelines({"a": meter, "b": meter}), plots.saved_by_op(ledger),
               plots.measured_vs_predicted(["x"], [1.0], [2.0]), plots.crossover([1, 2, 4], [1, 2, 4], 3, 3)]
    assert all(isinstance(f, Figure) for f in figures)
    phases = {t.get_text() for t in figures[0].axes[0].get_legend().get_texts()}
    assert {"forward", "backward"} <= phases


def test_plots_bad_input():
    with pytest.raises(TypeError, match="expected a MemoryMeter"):
        plots.timeline("meter")
    with pytest.raises(ValueError, match="no meters given"):
        plots.timelines({})
    with pytest.raises(ValueError, match="same length"):
        plots.measured_vs_predicted(["a", "b"], [1], [1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_gpu_check_skips_cleanly_without_cuda(capsys):
    assert gpucheck.main() == 0
    assert "no CUDA device" in capsys.readouterr().out
