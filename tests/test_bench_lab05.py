"""Lab 05's benchmark: the roofline JSON on tiny, and worst_ratio judged over ops of 1 ms or more only."""
from __future__ import annotations

import json

import pytest
import torch

import labkit as lk
from labkit import bench
from labkit.bench.lab05 import op_rows, worst_ratio
from labkit.instruments.ops import OpRecord
from labkit.instruments.roofline import Ceilings
from labkit.reference.roofline import compute_seconds, roofline_seconds


def test_roofline_on_tiny_reports_every_key_with_its_type():
    figures = bench.roofline(lk.sizes("tiny"))
    json.dumps(figures)  # what `bench roofline --json` prints
    for key in ("peak_flops", "peak_bandwidth", "random_rate"):
        assert isinstance(figures[key], float) and figures[key] > 0
    assert figures["config"]["profile"] == "tiny"
    assert figures["worst_ratio"] is None or figures["worst_ratio"] >= 1
    names = [op["name"] for op in figures["ops"]]
    assert "bmm#0" in names and "native_dropout#0" in names and not any(n.startswith("view") for n in names)
    for op in figures["ops"]:
        assert set(op) == {"name", "module", "intensity", "achieved", "predicted_s", "measured_s", "bound"}
        assert op["bound"] in ("compute", "memory", "random")
        assert op["intensity"] > 0 and op["achieved"] > 0 and op["predicted_s"] > 0 and op["measured_s"] > 0
    assert "roofline" in bench.BENCHMARKS


def fake(key: str, seconds: float, nbytes: int) -> OpRecord:
    return OpRecord(key=key, op="mul", module="", flops=0, bytes_moved=nbytes, output_bytes=nbytes // 2,
                    elements=nbytes // 8, is_view=False, in_place=False, random=False, seconds=seconds)


def test_worst_ratio_counts_only_ops_of_a_millisecond_or_more():
    ceilings = Ceilings("cpu", torch.float32, 1e15, 1e9, None)
    records = [fake("slow#0", 4e-3, 10 ** 6),  # predicted 1 ms, measured 4 ms: ratio 4
               fake("fast#0", 1e-4, 10 ** 6),  # predicted 1 ms, measured 0.1 ms: ratio 10, but under 1 ms
               fake("over#0", 1e-3, 4 * 10 ** 6)]  # predicted 4 ms, measured 1 ms: ratio 4 the other way
    rows = op_rows(records, ceilings, roofline_seconds, compute_seconds)
    assert [r["bound"] for r in rows] == ["memory"] * 3
    assert worst_ratio(rows) == pytest.approx(4)
    assert worst_ratio(rows, least_seconds=0) == pytest.approx(10)
    assert worst_ratio(rows[1:2]) is None


def test_each_op_is_set_against_each_precisions_ridge():
    by_dtype = {"float32": Ceilings("cpu", torch.float32, 1e11, 1e10, None),  # ridge 10 FLOP/byte
                "bfloat16": Ceilings("cpu", torch.bfloat16, 1e12, 1e10, None)}  # ridge 100
    mm = lambda key, intensity: OpRecord(key=key, op="mm", module="", flops=int(intensity * 1000),  # noqa: E731
                                         bytes_moved=1000, output_bytes=400, elements=100, is_view=False,
                                         in_place=False, random=False, seconds=1e-3)
    view = OpRecord(key="view#0", op="view", module="", flops=0, bytes_moved=0, output_bytes=0, elements=0,
                    is_view=True, in_place=False, random=False, seconds=1e-6)
    rows = lk.bench.lab05.sides([mm("a#0", 5), mm("b#0", 10), mm("c#0", 50), view, mm("d#0", 100)], by_dtype)
    assert [(r["name"], r["float32"], r["bfloat16"]) for r in rows] == [
        ("a#0", "memory", "memory"), ("b#0", "compute", "memory"), ("c#0", "compute", "memory"),
        ("d#0", "compute", "compute")]
    assert [r["intensity"] for r in rows] == [5, 10, 50, 100]
