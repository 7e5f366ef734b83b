"""The benchmark registry and CLI, the meter's overhead bench, figures, and gpu-check without CUDA."""
from __future__ import annotations

import json

import pytest
import torch
from matplotlib.figure import Figure

import labkit as lk
from labkit import bench, plots
import gpucheck  # tools/gpucheck.py: the maintainers' GPU check
import gpurows


def test_meter_bench_reports_one_ratio_per_repeat():
    figures = bench.meter.meter(lk.sizes("tiny"))
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
    assert set(bench.BENCHMARKS) == {"formula", "meter", "recompute", "segments", "schedule", "optimal", "policies", "roofline", "pitfalls", "plan", "fsdp",
                                   "compile", "logits", "parallel"}
    assert set(bench.formula()) == {"configs", "max_rel_error"}
    assert set(bench.meter.meter(lk.sizes("tiny"))) == {"slowdown", "ratios"}
    keys = set(bench.recompute_comparison(lambda fn, *a: fn(*a), lk.sizes("tiny")).figures())
    assert keys == {"peak_ratio_vs_torch", "time_ratio_vs_torch", "peak_ratio_vs_none", "grads_bitwise_equal",
                    "time_ratio_vs_none", "peak_bytes", "config"}


@pytest.mark.parametrize("name, card", [("Tesla T4", "T4"), ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 PCIe", "H100"),
                                        ("NVIDIA H200", "H200"), ("NVIDIA GeForce RTX 4090", None),
                                        ("NVIDIA GH200 480GB", None), ("Quadro T400", None)])
def test_gpu_check_finds_the_spec_sheet_of_the_card_it_runs_on(name, card):
    from labkit.instruments.roofline import GPU_SPECS

    assert gpurows.spec_for(name) is (GPU_SPECS[card] if card else None)


def test_gpu_check_sets_the_measured_ceilings_and_host_link_against_the_datasheet(monkeypatch):
    from labkit.instruments import roofline as rl

    def ceilings(flops):
        return lambda device, dtype=torch.float32, size=None: rl.Ceilings("cuda", dtype, flops, 2e12, None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    monkeypatch.setattr("labkit.env.profile.sizes", lambda name=None: lk.sizes("tiny"))
    monkeypatch.setattr(rl, "measure_ceilings_by_dtype", lambda device, size: {"float32": ceilings(8e12)(device),
                                                                                 "bfloat16": ceilings(8e12)(device)})
    monkeypatch.setattr(rl, "measure_ceilings", lambda device, dtype, size: ceilings(6e13)(device, dtype))
    row = gpurows.ceilings_vs_spec()  # T4: 65 TFLOP/s float16, 320 GB/s: a 2 TB/s copy is over its datasheet
    assert "float16 60 TFLOP/s" in row.value and "92% and 625% of T4's" in row.value and not row.ok
    monkeypatch.setattr(rl, "measure_ceilings_by_dtype", lambda device, size: {
        "float32": rl.Ceilings("cuda", torch.float32, 8e12, 3e11, None),
        "bfloat16": rl.Ceilings("cuda", torch.bfloat16, 8e12, 3e11, None)})
    assert gpurows.ceilings_vs_spec().ok  # 60 of 65 TFLOP/s, 300 of 320 GB/s
    monkeypatch.setattr(rl, "measure_ceilings", lambda device, dtype, size: ceilings(7e13)(device, dtype))
    assert not gpurows.ceilings_vs_spec().ok  # 70 TFLOP/s float16: over the datasheet's 65
    monkeypatch.setattr(rl, "measure_host_bandwidth", lambda device: 12e9)
    row = gpurows.host_link()
    assert row.ok and "12 GB/s each way" in row.value and "75% of T4's" in row.value
    monkeypatch.setattr(rl, "measure_host_bandwidth", lambda device: 20e9)
    assert not gpurows.host_link().ok  # 20 GB/s over a 16 GB/s link each way


def test_gpu_check_names_its_run_by_card_memory_torch_and_date_and_never_overwrites_one(tmp_path):
    first = gpucheck.stem("NVIDIA H200", "16GiB", "2.11.0+cu130", "2026-12-03", tmp_path)
    assert first.name == "nvidia-h200-16gib-torch2.11.0-2026-12-03"
    run = gpucheck.Run(first, {"device": "NVIDIA H200"}, deadline=0.0)
    run.add(gpucheck.Row("pytest -m gpu", "3 passed", "all pass", True, seconds=17.0))
    run.add(run.measure("late", ["true"], tmp_path / "late.json", 60))  # past the run's deadline: not run
    found = json.loads(run.finish().read_text())
    assert found["device"] == "NVIDIA H200" and found["ok"] is False
    assert found["rows"][0] == {"name": "pytest -m gpu", "value": "3 passed", "bar": "all pass", "ok": True,
                                "seconds": 17.0, "figures": {}, "key": ""}
    assert "not run: out of time" in found["rows"][1]["value"]
    again = gpucheck.stem("NVIDIA H200", "16GiB", "2.11.0+cu130", "2026-12-03", tmp_path)
    assert again.name == first.name + "-2"


def test_gpu_check_offers_only_and_every_lab_as_a_row():
    from labkit.course.catalog import LABS

    assert {f"lab{lab.number}" for lab in LABS} <= set(gpurows.DEFAULT)
    assert "plan" in gpurows.ROWS and "plan" not in gpurows.DEFAULT
    assert gpucheck.main(only=["no-such-row"]) == 2
