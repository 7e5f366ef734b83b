"""Lab 05's benchmark: the roofline JSON on tiny, and a bar that holds every op priced (none checked: not held)."""
from __future__ import annotations

import json

import pytest
import torch

import labkit as lk
from labkit import bench
from labkit.bench.lab05 import bar_holds, op_rows, predicted_seconds, slowest_ratio, worst_ratio
from labkit.instruments.ops import OpRecord
from labkit.instruments.roofline import Ceilings
from labkit.reference.roofline import compute_seconds, roofline_seconds


def test_roofline_on_tiny_reports_every_key_with_its_type():
    figures = bench.roofline(lk.sizes("tiny"))
    json.dumps(figures)  # what `bench roofline --json` prints
    for key in ("peak_flops", "peak_bandwidth", "random_rate", "special_rate", "launch_seconds",
                "one_launch_alone_seconds", "worst_ratio", "slowest_ratio"):
        assert isinstance(figures[key], float) and figures[key] > 0, key
    assert figures["config"]["profile"] == "tiny"
    assert figures["ops_checked"] == len(figures["ops"]) > 0  # every op priced is held to the bar
    assert figures["bar_holds"] == (figures["worst_ratio"] <= 2)
    assert figures["timing"].startswith("wall clock") and figures["peak_bandwidth"] == figures["bandwidths"][-1][1]
    names = [op["name"] for op in figures["ops"]]
    assert "bmm#0" in names and "native_dropout#0" in names and not any(n.startswith("view") for n in names)
    for op in figures["ops"]:
        assert set(op) == {"name", "module", "intensity", "achieved", "predicted_s", "measured_s", "bound"}
        assert op["bound"] in ("compute", "memory", "random", "launch")
        assert op["intensity"] > 0 and op["achieved"] > 0 and op["predicted_s"] > 0 and op["measured_s"] > 0
    assert "roofline" in bench.BENCHMARKS


def fake(key: str, seconds: float, nbytes: int) -> OpRecord:
    return OpRecord(key=key, op="mul", module="", flops=0, bytes_moved=nbytes, output_bytes=nbytes // 2,
                    elements=nbytes // 8, is_view=False, in_place=False, random=False, seconds=seconds)


def test_the_bar_holds_every_op_however_fast_and_fails_when_it_checked_none():
    """The old bar kept ops of 1 ms or more: on an H200 none was, and it passed having checked nothing."""
    ceilings = Ceilings("cpu", torch.float32, 1e15, 1e9, None)
    records = [fake("slow#0", 4e-3, 10 ** 6),  # predicted 1 ms, measured 4 ms: slower, never judged
               fake("fast#0", 1e-4, 10 ** 5),  # predicted 0.1 ms, measured 0.1 ms
               fake("over#0", 1e-3, 4 * 10 ** 6)]  # predicted 4 ms, measured 1 ms: beat its bound 4x
    rows = op_rows(records, ceilings, roofline_seconds, compute_seconds)
    assert [r["bound"] for r in rows] == ["memory"] * 3
    assert worst_ratio(rows) == pytest.approx(4) and slowest_ratio(rows) == pytest.approx(4)
    assert not bar_holds(rows) and bar_holds(rows[:2]) and bar_holds(rows, bar=4)
    assert worst_ratio([]) is None and not bar_holds([])  # checked nothing: the bar has not held
    tiny = [fake("tiny#0", 1e-5, 10 ** 5)]  # 10 µs against 100 µs predicted: under 1 ms, judged all the same
    assert not bar_holds(op_rows(tiny, ceilings, roofline_seconds, compute_seconds))
    with pytest.raises(ValueError, match="measured_s=None"):
        worst_ratio([{"name": "x#0", "predicted_s": 1e-3, "measured_s": None}])


def test_an_op_costs_at_least_one_launch_and_meets_the_bandwidth_of_its_footprint():
    c = Ceilings("cuda:0", torch.bfloat16, 1e15, 1e12, None, launch_seconds=1e-5,
                 bandwidths=((10 ** 6, 4e12), (10 ** 9, 1e12)))
    cast, big = fake("_to_copy#0", 1.5e-5, 10 ** 6), fake("mul#0", 1e-3, 10 ** 9)
    assert predicted_seconds(cast, c, roofline_seconds) == 1e-5  # 0.25 µs of bytes, one 10 µs launch
    assert predicted_seconds(big, c, roofline_seconds) == pytest.approx(1e-3)  # beyond the cache: peak bandwidth
    mid = fake("add#0", 1e-4, 10 ** 8)  # 100 MB, in the 1 MB footprint's reach: 25 µs at 4 TB/s
    assert predicted_seconds(mid, c, roofline_seconds) == pytest.approx(2.5e-5)
    rows = op_rows([cast, mid, big], c, roofline_seconds, compute_seconds)
    assert [r["bound"] for r in rows] == ["launch", "memory", "memory"]


def test_each_op_is_set_against_each_precisions_ridge():
    """An op run in bfloat16 moves half a float32 trace's bytes: its intensity doubles as the ridge moves; TF32
    multiplies float32 tensors, so its bytes stay. On this CPU's two ridges nothing changed side (issue 50):
    what moves it is a ridge moving further than the op's own intensity does."""
    by_dtype = {"float32": Ceilings("cpu", torch.float32, 1e11, 1e10, None),  # ridge 10 FLOP/byte
                "tf32": Ceilings("gpu", torch.float32, 1e12, 1e10, None),  # ridge 100, float32 bytes
                "bfloat16": Ceilings("cpu", torch.bfloat16, 1e12, 1e10, None)}  # ridge 100, half the bytes
    mm = lambda key, intensity: OpRecord(key=key, op="mm", module="", flops=int(intensity * 1000),  # noqa: E731
                                         bytes_moved=1000, output_bytes=400, elements=100, is_view=False,
                                         in_place=False, random=False, seconds=1e-3)
    view = OpRecord(key="view#0", op="view", module="", flops=0, bytes_moved=0, output_bytes=0, elements=0,
                    is_view=True, in_place=False, random=False, seconds=1e-6)
    rows = lk.bench.lab05.sides([mm("a#0", 5), mm("b#0", 10), mm("c#0", 40), view, mm("d#0", 50)], by_dtype)
    assert [(r["name"], r["float32"], r["tf32"], r["bfloat16"]) for r in rows] == [
        ("a#0", "memory", "memory", "memory"), ("b#0", "compute", "memory", "memory"),
        ("c#0", "compute", "memory", "memory"), ("d#0", "compute", "memory", "compute")]
    assert [r["intensity"] for r in rows] == [5, 10, 40, 50]


def test_the_spec_sheets_hold_float32_beside_their_tensor_cores():
    from labkit.instruments.roofline import GPU_SPECS, RooflineError, GPUSpec

    for spec in GPU_SPECS.values():
        fp32, tensor = spec.float32_ceilings(), spec.ceilings()
        assert fp32.dtype == torch.float32 and fp32.peak_bandwidth == tensor.peak_bandwidth
        assert tensor.ridge / fp32.ridge > 4  # the tensor cores' ridge lies far right of float32's
    with pytest.raises(RooflineError, match="no float32 FLOP/s"):
        GPUSpec("x", 1e12, torch.bfloat16, 1e9, "none").float32_ceilings()


def test_an_op_faster_than_its_prediction_is_explained_by_its_ceiling():
    from labkit.bench.lab05 import WHY_FASTER, why_faster

    assert set(WHY_FASTER) == {"compute", "memory", "random", "launch", "none"}  # every bound() can name
    assert why_faster("random").startswith("its bound is native_dropout's draws") and "2x" in why_faster("random")
    with pytest.raises(ValueError, match="bound 'cache'"):
        why_faster("cache")
