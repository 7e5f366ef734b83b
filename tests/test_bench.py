"""The benchmark registry and CLI, the meter's overhead bench, figures, and gpu-check without CUDA."""
from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

import labkit as lk
from labkit import bench, plots
from labkit.course import gpucheck


def test_meter_bench_reports_one_ratio_per_repeat():
    figures = bench.meter(lk.sizes("tiny"))
    assert figures["slowdown"] > 0 and len(figures["ratios"]) == lk.sizes("tiny").repeats


def test_bench_cli_unknown_name(capsys):
    assert bench.main("nope") == 2
    assert "choose one of formula, meter, recompute, segments, schedule" in capsys.readouterr().err


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


def test_every_benchmark_keeps_its_json_keys():
    """The keys `bench NAME --json` prints are the ones notes and gpu-check read."""
    assert set(bench.BENCHMARKS) == {"formula", "meter", "recompute", "segments", "schedule", "policies", "roofline", "pitfalls", "plan", "fsdp"}
    assert set(bench.formula()) == {"configs", "max_rel_error"}
    assert set(bench.meter(lk.sizes("tiny"))) == {"slowdown", "ratios"}
    keys = set(bench.recompute_comparison(lambda fn, *a: fn(*a), lk.sizes("tiny")).figures())
    assert keys == {"peak_ratio_vs_torch", "time_ratio_vs_torch", "peak_ratio_vs_none", "grads_bitwise_equal",
                    "time_ratio_vs_none", "peak_bytes", "config"}
