"""labkit.instruments.roofline: the ceilings, FLOP estimates and spec sheets are sane, errors teach (the roofline time
itself is lab 05's: tests/test_reference_lab05.py)."""
from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit import plots
from labkit.env.sizes import FIXED, MEASURE_SIZES
from labkit.instruments import roofline as rl
from labkit.instruments.ops import OpRecord, trace

CEIL = rl.Ceilings("cpu", torch.float32, peak_flops=1e11, peak_bandwidth=1e10, random_rate=1e8, special_rate=1e9)


def record(op="mul", flops=0, bytes_moved=1000, elements=100, random=False, seconds=1e-3, view=False) -> OpRecord:
    return OpRecord(key=f"{op}#0", op=op, module="m", flops=flops, bytes_moved=bytes_moved,
                    output_bytes=0 if view else 400, elements=elements, is_view=view, in_place=False,
                    random=random, seconds=seconds)


def test_matmuls_keep_pytorchs_count_and_elementwise_estimates_are_positive():
    assert rl.flops(record("mm", flops=12345)) == 12345
    for op, per_element in rl.ELEMENTWISE_FLOPS.items():
        assert per_element > 0, op
        assert rl.flops(record(op, elements=10)) == 10 * per_element
    assert rl.flops(record("some_new_op", elements=10)) == 10 * rl.DEFAULT_ELEMENTWISE_FLOPS


def test_every_op_of_a_traced_block_that_moves_data_has_a_positive_intensity():
    cfg = lk.GPTConfig(seq=16, batch=1, hidden=16, heads=2, n_layers=1)
    block = lk.GPTStack(cfg).blocks[0]
    records = trace(block, lk.gpt_input(cfg, requires_grad=True), model=block, time=False)
    moving = [r for r in records if rl.moves_data(r)]
    assert {"addmm", "bmm", "_softmax", "native_dropout", "native_layer_norm", "gelu", "add"} <= {r.op for r in moving}
    assert all(rl.intensity(r) > 0 for r in moving)
    assert not any(r.op in ("view", "transpose", "_unsafe_view") for r in moving)


def test_achieved_is_flops_over_measured_seconds():
    assert rl.achieved(record("mm", flops=10 ** 6, seconds=1e-3)) == pytest.approx(1e9)


@pytest.mark.parametrize("call, match", [
    (lambda: rl.flops(record(view=True)), "is a view"),
    (lambda: rl.flops("mul#0"), "expected an OpRecord"),
    (lambda: rl.achieved(record(seconds=None)), "seconds=None"),
    (lambda: rl.Ceilings("cpu", torch.float32, 0.0, 1e10, None), "peak_flops=0.0"),
    (lambda: rl.Ceilings("cpu", torch.float32, 1e11, -1.0, None), "peak_bandwidth=-1.0"),
    (lambda: rl.measure_ceilings(dtype=torch.int32), "dtype=torch.int32"),
    (lambda: rl.measure_ceilings(dtype="bfloat16"), "dtype='bfloat16'"),
    (lambda: rl.offload_seconds(-1, 1e9), "nbytes=-1"),
    (lambda: rl.offload_seconds(10, 0), "host_bandwidth=0"),
    (lambda: rl.measure_host_bandwidth("cpu"), "moot"),
])
def test_errors_name_the_bad_value(call, match):
    with pytest.raises(rl.RooflineError, match=match):
        call()


def test_the_ceilings_are_measured_in_each_precision_a_matmul_runs_in():
    found = rl.measure_ceilings_by_dtype("cpu", FIXED["tiny"])
    assert set(found) == {"float32", "bfloat16"}
    assert [c.dtype for c in found.values()] == [torch.float32, torch.bfloat16]


def test_on_cuda_float32_is_measured_without_tf32_and_tf32_with_it_then_the_setting_is_put_back(monkeypatch):
    seen = []
    monkeypatch.setattr(rl, "measure_ceilings", lambda device, dtype, size: seen.append(
        (device.type, dtype, torch.backends.cuda.matmul.allow_tf32)) or rl.Ceilings("x", dtype, 1e12, 1e10, None))
    matmul, original = torch.backends.cuda.matmul, torch.backends.cuda.matmul.allow_tf32
    try:
        for before in (True, False):
            matmul.allow_tf32 = before
            seen.clear()
            assert set(rl.measure_ceilings_by_dtype("cuda")) == {"float32", "bfloat16", "tf32"}
            assert seen == [("cuda", torch.float32, False), ("cuda", torch.bfloat16, before),
                            ("cuda", torch.float32, True)]
            assert matmul.allow_tf32 is before
    finally:
        matmul.allow_tf32 = original


def test_offload_is_a_round_trip():
    assert rl.offload_seconds(10 ** 9, 2e10) == pytest.approx(0.1)
    assert rl.offload_seconds(0, 2e10) == 0.0  # nothing saved: nothing to move
    assert rl.offload_seconds(10, 0.5) == 40.0  # any positive bandwidth is a bandwidth


def test_host_bandwidth_is_a_pinned_asynchronous_round_trip_timed_on_the_device(monkeypatch):
    """On a stand-in CUDA device (the tensors stay on the CPU): the host buffer is pinned and both copies are
    non-blocking (an unpinned copy is synchronous and slower, not what offload pays), the round trip (device to
    host, then back) is timed with the device's clock, and the figure is both copies' bytes over the median."""
    seen, made = {"copies": []}, {}
    ones, empty, copy = torch.ones, torch.empty, torch.Tensor.copy_
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def device_ones(*a, device=None, **k):
        seen["source on"] = device
        made["device"] = ones(*a, **k)
        return made["device"]

    def pinned_empty(*a, pin_memory=False, **k):
        seen["pinned"], made["host"] = pin_memory, empty(*a, **k)
        return made["host"]

    def recorded_copy(dst, src, non_blocking=False):
        names = {id(t): name for name, t in made.items()}
        seen["copies"].append((names.get(id(dst)), names.get(id(src)), non_blocking))
        return copy(dst, src, non_blocking=non_blocking)

    def timed(fn, warmup, repeats, device):
        fn()
        seen["device"] = device
        return type("Timing", (), {"median": 0.25})()

    monkeypatch.setattr(torch, "ones", device_ones)
    monkeypatch.setattr(torch, "empty", pinned_empty)
    monkeypatch.setattr(torch.Tensor, "copy_", recorded_copy)
    monkeypatch.setattr(rl, "benchmark", timed)
    assert rl.measure_host_bandwidth("cuda", mib=1) == 2 * 2 ** 20 / 0.25
    assert seen == {"pinned": True, "device": torch.device("cuda"), "source on": torch.device("cuda"),
                    "copies": [("host", "device", True), ("device", "host", True)]}


def test_the_ceilings_are_measured_at_the_sizes_given_else_the_profiles(monkeypatch):
    seen = []
    for name in ("_peak_flops", "_bandwidth", "_random_rate", "_special_rate"):
        monkeypatch.setattr(rl, name, lambda device, dtype, size, repeats, name=name: seen.append((name, size)) or (
            ((8, 2.0), (32, 1.0)) if name == "_bandwidth" else 1.0))
    monkeypatch.setattr(rl, "measure_launch", lambda device, repeats: (2e-6, 1e-6))
    for given, name in ((FIXED["cpu"], "cpu"), (None, lk.sizes().name)):
        seen.clear()
        c = rl.measure_ceilings(size=given)
        sides, mib, draws, special = MEASURE_SIZES[name]
        assert sorted(seen) == sorted([("_peak_flops", sides), ("_bandwidth", mib), ("_random_rate", draws),
                                       ("_special_rate", special)])
        # the peak bandwidth is the largest footprint's, beyond the caches; the launch floor the amortised one
        assert (c.peak_bandwidth, c.bandwidths, c.launch_seconds) == (1.0, ((8, 2.0), (32, 1.0)), 1e-6)


def test_specs_carry_sources_and_sane_magnitudes():
    assert set(rl.GPU_SPECS) == {"T4", "A100", "H100", "H200"}
    for spec in rl.GPU_SPECS.values():
        assert "datasheet" in spec.source and "https://" in spec.source
        assert 1e13 < spec.peak_flops < 2e15  # dense 16-bit tensor cores: tens to hundreds of TFLOP/s
        assert 1e11 < spec.peak_bandwidth < 1e13  # hundreds of GB/s to a few TB/s
    assert rl.GPU_SPECS["H200"].peak_flops == rl.GPU_SPECS["H100"].peak_flops  # same die, faster memory
    # every figure says its dtype: Turing's tensor cores have no bfloat16, so the T4's 65 TFLOP/s is float16's
    assert {k: s.dtype for k, s in rl.GPU_SPECS.items()} == {
        "T4": torch.float16, "A100": torch.bfloat16, "H100": torch.bfloat16, "H200": torch.bfloat16}
    assert all(s.ceilings().dtype == s.dtype for s in rl.GPU_SPECS.values())
    assert rl.GPU_SPECS["H200"].peak_bandwidth > rl.GPU_SPECS["H100"].peak_bandwidth


def test_measure_ceilings_on_tiny_are_positive():
    ceilings = rl.measure_ceilings("cpu", torch.float32, lk.sizes("tiny"))
    for value in (ceilings.peak_flops, ceilings.peak_bandwidth, ceilings.random_rate, ceilings.special_rate):
        assert value > 0
    assert ceilings.ridge == ceilings.peak_flops / ceilings.peak_bandwidth


def test_each_ceiling_is_the_work_of_its_measurement_over_its_median_seconds(monkeypatch):
    """With a clock that always says a millisecond, each ceiling is exactly its work over 1 ms: 2n³ FLOPs of the
    largest matmul, the bytes a copy reads and writes at each footprint, the elements drawn, and the elements of
    the larger transcendental tensor (the best of exp, softmax and GELU, in cache and beyond it)."""
    from types import SimpleNamespace

    timed = []

    def benchmark(fn, *args, **kwargs):
        timed.append(getattr(fn, "__name__", str(fn)))
        return SimpleNamespace(median=1e-3)

    monkeypatch.setattr(rl, "benchmark", benchmark)
    size = lk.sizes("tiny")
    sides, mib, draws, special = rl.MEASURE_SIZES[size.name]
    c = rl.measure_ceilings("cpu", torch.float32, size)
    assert c.peak_flops == 2 * max(sides) ** 3 / 1e-3
    assert c.peak_bandwidth == 2 * (mib * 2**20 // 4) * 4 / 1e-3
    assert [n for n, _ in c.bandwidths] == [2 * mib * 2**20 // 4 ** k for k in reversed(range(rl.FOOTPRINTS))]
    assert all(bw == n / 1e-3 for n, bw in c.bandwidths)
    assert c.random_rate == draws / 1e-3 and c.special_rate == rl.SPECIAL_SCALE * special / 1e-3
    assert c.launch_seconds == 1e-3
    assert len(timed) == len(sides) + rl.FOOTPRINTS + 1 + 2 * 3 + 2  # matmuls, copies, dropout, 3 ops x 2, launch


def test_the_transcendental_rate_is_the_best_ops_and_every_op_of_the_table_is_among_them(monkeypatch):
    """Rule 4: a rate measured slower than an op runs is no bound on it, so special_rate is the fastest of exp and
    the ops of TRANSCENDENTALS_PER_ELEMENT (log_softmax runs softmax's kernel), at either size."""
    x = torch.ones(8)
    assert {"softmax", "gelu"} == {op.lstrip("_") for op in rl.TRANSCENDENTALS_PER_ELEMENT} - {"log_softmax"}
    assert set(rl._transcendental_ops(x)) == {"exp", "softmax", "gelu"}
    medians = {("exp", 64): 4.0, ("softmax", 64): 2.0, ("gelu", 64): 8.0,
               ("exp", 64 * rl.SPECIAL_SCALE): 64.0, ("softmax", 64 * rl.SPECIAL_SCALE): 16.0,
               ("gelu", 64 * rl.SPECIAL_SCALE): 32.0}
    ops = rl._transcendental_ops
    monkeypatch.setattr(rl, "_transcendental_ops", lambda x: {name: (name, x.numel()) for name in ops(x)})
    monkeypatch.setattr(rl, "benchmark", lambda call, **kw: type("T", (), {"median": medians[call]})())
    assert rl._special_rate(torch.device("cpu"), torch.float32, 64, 3) == 64 * rl.SPECIAL_SCALE / 16.0


def test_an_op_replayed_on_the_same_buffers_meets_the_bandwidth_of_its_footprint():
    """bandwidth_at: the largest footprint measured not above the op's bytes (the smallest below them all); a
    smaller copy slowed by its launch is passed over for a larger, faster one; spec sheets have peak only."""
    c = rl.Ceilings("cpu", torch.float32, 1e11, 1e10, None, bandwidths=((100, 5e9), (1000, 4e10), (10000, 1e10)))
    assert [c.bandwidth_at(n) for n in (1, 100, 999, 1000, 5000, 10 ** 9)] == [4e10, 4e10, 4e10, 4e10, 4e10, 1e10]
    assert c.hot(500).peak_bandwidth == 4e10 and c.hot(500).bandwidths == c.bandwidths
    assert CEIL.bandwidth_at(10) == CEIL.peak_bandwidth
    for bad in (((10, 1.0), (5, 1.0)), ((10, 0.0),), ((10, 1.0), (10, 2.0))):
        with pytest.raises(rl.RooflineError, match="bandwidths="):
            rl.Ceilings("x", torch.float32, 1.0, 1.0, None, bandwidths=bad)
    with pytest.raises(rl.RooflineError, match="launch_seconds=0"):
        rl.Ceilings("x", torch.float32, 1.0, 1.0, None, launch_seconds=0)


def test_the_launch_floor_is_one_launch_alone_and_as_benchmark_times_it(monkeypatch):
    seen = []
    monkeypatch.setattr(rl, "benchmark", lambda fn, *a, calls=None, **kw: seen.append((fn, calls, kw["device"]))
                        or type("T", (), {"median": 3.0 if calls == 1 else 1.0})())
    assert rl.measure_launch("cpu", repeats=3) == (3.0, 1.0)
    assert seen == [(rl.LAUNCH_OP, 1, torch.device("cpu")), (rl.LAUNCH_OP, None, torch.device("cpu"))]


def test_sizing_holds_the_transcendental_tensors():
    """labkit/env/sizing.py predicts lab 05's ceilings cell from MEASURE_SIZES with SPECIAL_SCALE written out."""
    from labkit.env.sizing import lab_branches

    for name in ("tiny", "cpu"):
        special = MEASURE_SIZES[name][3]
        assert lab_branches(FIXED[name])["05"]["ceilings"] >= 4 * 4 * rl.SPECIAL_SCALE * special


def test_the_trace_counts_a_matmuls_flops_as_pytorch_does():
    from labkit.instruments.ops import trace

    a, w = torch.randn(6, 5), torch.randn(5, 7)
    ops = trace(lambda x: torch.relu(x @ w) + 1, a, time=False)
    mm = next(r for r in ops if r.op == "mm")
    assert mm.flops == 2 * 6 * 5 * 7 and rl.flops(mm) == mm.flops
    assert all(r.flops == 0 for r in ops if r.op != "mm")


def test_the_plot_draws_a_point_per_op_and_the_spec_roofs():
    records = [record("mm", flops=10 ** 6), record("mul"), record("native_dropout", random=True, elements=200),
               record(view=True)]
    fig = plots.roofline(CEIL, records, specs=[rl.GPU_SPECS["H100"]])
    ax = fig.axes[0]
    points = [line for line in ax.lines if len(line.get_xdata()) == 1]
    assert len(points) == 3
    assert [t.get_text() for t in ax.texts] == ["mm#0", "mul#0", "native_dropout#0"]
    colours = [line.get_color() for line in points]  # right of the ridge, left of it, random: three colours
    assert len(set(colours)) == 3
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("spec sheet: H100 SXM (bfloat16)" in label for label in labels) and any("random" in label for label in labels)
    assert any(label.startswith("measured, float32: ") for label in labels)
    bf16 = rl.Ceilings("cpu", torch.bfloat16, 1e12, 1e10, None)
    fig = plots.roofline(CEIL, records, specs=[rl.GPU_SPECS["T4"]], also={"bfloat16": bf16})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("spec sheet: T4 (float16)" in label for label in labels)
    assert any(label.startswith("measured, bfloat16: ") and "ridge 100" in label for label in labels)
    assert any(list(line.get_xdata()) == [100.0, 100.0] for line in fig.axes[0].lines)  # its ridge, dotted
    with pytest.raises(ValueError, match="no op that moves data"):
        plots.roofline(CEIL, [record(view=True)])


def test_each_simple_elementwise_op_counts_one_flop_per_element():
    """Rule 2's table: add, sub, mul, div, rsub, neg and where do one operation per element they write."""
    a, b = torch.randn(4, 8), torch.randn(4, 8)

    def f(x):
        y = (x + b) - b
        y = (y * b) / (b.abs() + 1)
        y = 1 - (-y)
        return torch.where(y > 0, y, b)
    ops = {r.op: r for r in trace(f, a, time=False)}
    for name in ("add", "sub", "mul", "div", "rsub", "neg", "where"):
        assert rl.flops(ops[name]) == ops[name].elements == 32, name


def test_ceilings_are_frozen_and_take_any_positive_rate_even_below_one_per_second():
    c = rl.Ceilings("a slow machine", torch.float32, peak_flops=0.5, peak_bandwidth=0.25, random_rate=0.5,
                    special_rate=0.75)
    assert (c.peak_flops, c.peak_bandwidth, c.random_rate, c.special_rate) == (0.5, 0.25, 0.5, 0.75)
    with pytest.raises(AttributeError):
        c.peak_flops = 1.0  # type: ignore[misc]
    for bad in (0, -1.0):
        with pytest.raises(rl.RooflineError, match="peak_bandwidth"):
            rl.Ceilings("x", torch.float32, peak_flops=1.0, peak_bandwidth=bad, random_rate=None)


def test_an_op_that_makes_a_one_byte_tensor_moves_data():
    """A reduction to one bool (`any`) makes a storage of 1 byte: it is an op to price, not a view."""
    (r,) = [r for r in trace(lambda x: (x > 0).any(), torch.randn(16), time=False) if r.op == "any"]
    assert r.output_bytes == 1 and rl.moves_data(r)
