"""timing: arithmetic, call counts and ABBA order, against a fake clock; never wall-clock values."""
from __future__ import annotations

import contextlib
import dataclasses
import statistics

import pytest
import torch

from labkit.instruments.timing import (Comparison, Timing, benchmark, calls_per_sample, compare, resolve_device,
                                       timing_method)


@pytest.fixture(autouse=True)
def _no_cuda_unless_a_gpu_test(request, monkeypatch):
    """The counts and orders below are the CPU's: on a machine with CUDA, work where no tensor names a device gets
    one seeing call first (devices.py), so every test but the `gpu` ones runs as if CUDA were absent."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


class FakeClock:
    """A clock that moves only when a fake workload says it took `seconds`."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def work(self, durations: list[float], log: list[str] | None = None, name: str = ""):
        """A function whose i-th call takes durations[i] seconds (the last one repeats)."""
        calls = []

        def fn(*args, **kwargs):
            calls.append((args, kwargs))
            if log is not None:
                log.append(name)
            self.now += durations[min(len(calls) - 1, len(durations) - 1)]
            return len(calls)

        fn.calls = calls
        return fn


# -- Timing ----------------------------------------------------------------------

def test_timing_median_quartiles_and_spread():
    t = Timing([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.n == 5
    assert t.median == 3.0
    assert (t.q25, t.q75) == (2.0, 4.0)  # linear interpolation, numpy's default
    assert t.spread == 1.0


def test_timing_single_sample_has_no_spread():
    t = Timing([0.25])
    assert (t.median, t.q25, t.q75, t.spread) == (0.25, 0.25, 0.25, 0.0)


@pytest.mark.parametrize("samples, text", [
    ([0.0120, 0.0123, 0.0126], "12.3 ms ± 0.15 (median, IQR/2, n=3)"),
    ([2.0, 2.0], "2 s ± 0 (median, IQR/2, n=2)"),
    ([3e-6] * 4, "3 µs ± 0 (median, IQR/2, n=4)"),
    ([5e-8], "50 ns ± 0 (median, IQR/2, n=1)"),
])
def test_timing_str_picks_a_unit(samples, text):
    assert str(Timing(samples)) == text


# -- benchmark ---------------------------------------------------------------------

def test_benchmark_calls_warmup_then_repeats_and_times_only_repeats():
    clock = FakeClock()
    # warm-up calls are slow (10 s) and must not be in the samples
    fn = clock.work([10.0, 10.0, 0.3, 0.1, 0.2])
    t = benchmark(fn, warmup=2, repeats=3, clock=clock)
    assert len(fn.calls) == 5
    assert clock.reads == 2 * 3
    assert t.samples == pytest.approx([0.3, 0.1, 0.2])
    assert t.median == pytest.approx(0.2)


def test_benchmark_passes_args_and_kwargs_through():
    clock = FakeClock()
    fn = clock.work([1.0])
    x = torch.ones(2)
    benchmark(fn, x, 3, warmup=0, repeats=2, clock=clock, scale=0.5)
    assert len(fn.calls) == 2
    args, kwargs = fn.calls[0]
    assert args[0] is x and args[1] == 3 and kwargs == {"scale": 0.5}


def test_benchmark_without_warmup():
    clock = FakeClock()
    fn = clock.work([1.0])
    assert benchmark(fn, warmup=0, repeats=1, clock=clock).n == 1
    assert len(fn.calls) == 1


def test_benchmark_runs_a_real_function_on_cpu():
    t = benchmark(torch.mm, torch.ones(4, 4), torch.ones(4, 4), warmup=1, repeats=3)
    assert t.n == 3 and all(s >= 0 for s in t.samples)


def test_benchmark_rejects_a_non_callable_naming_its_type():
    with pytest.raises(TypeError, match="fn must be callable.*got Tensor"):
        benchmark(torch.ones(2))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"repeats": 0}, ValueError, "repeats must be an int >= 1, got 0"),
    ({"repeats": -3}, ValueError, "repeats must be an int >= 1, got -3"),
    ({"warmup": -1}, ValueError, "warmup must be an int >= 0, got -1"),
    ({"repeats": 2.5}, TypeError, r"repeats must be an int >= 1, got 2\.5 of type float"),
    ({"warmup": True}, TypeError, "warmup must be an int >= 0, got True of type bool"),
])
def test_benchmark_validates_counts(kwargs, error, message):
    fn = FakeClock().work([1.0])
    with pytest.raises(error, match=message):
        benchmark(fn, **kwargs)
    assert fn.calls == []  # nothing ran before the arguments were checked


# -- device inference (the CUDA path, as far as a CPU allows) -----------------------

class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it lives on CUDA, to test inference without a GPU."""

    @property
    def device(self):
        return torch.device("cuda", 1)


def fake_cuda_tensor() -> torch.Tensor:
    return torch.zeros(2).as_subclass(FakeCudaTensor)


def test_resolve_device_defaults_to_cpu():
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device(None, torch.ones(1), 3, "x", [torch.ones(1)]) == torch.device("cpu")


@pytest.mark.parametrize("wrap", [
    lambda t: (t,),
    lambda t: ([torch.ones(1), t],),
    lambda t: ((t,),),
    lambda t: ({"x": t},),
    lambda t: (torch.ones(1), "label", t),
])
def test_resolve_device_finds_a_cuda_tensor_among_the_arguments(wrap):
    assert resolve_device(None, *wrap(fake_cuda_tensor())) == torch.device("cuda", 1)


def test_resolve_device_looks_into_module_parameters():
    model = torch.nn.Linear(2, 2)
    assert resolve_device(None, model) == torch.device("cpu")
    model.weight = torch.nn.Parameter(fake_cuda_tensor())
    assert resolve_device(None, model) == torch.device("cuda", 1)


def test_resolve_device_explicit_wins():
    assert resolve_device("cpu", fake_cuda_tensor()) == torch.device("cpu")


def test_asking_for_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="device='cuda' but torch sees no CUDA device"):
        benchmark(lambda: None, device="cuda")
    with pytest.raises(ValueError, match="no CUDA device"):
        compare(lambda: None, lambda: None, device="cuda:0")


# -- Comparison and compare ------------------------------------------------------

def test_comparison_ratio_is_the_median_of_pairwise_b_over_a():
    c = Comparison(times_a=[1.0, 2.0, 4.0], times_b=[3.0, 2.0, 2.0])
    assert c.ratios == [3.0, 1.0, 0.5]
    assert c.ratio == 1.0
    # not the ratio of the medians (2/2) nor of the means: pairing is the point
    c = Comparison(times_a=[1.0, 10.0, 10.0], times_b=[2.0, 20.0, 5.0])
    assert c.ratio == 2.0
    assert c.a.median == 10.0 and c.b.median == 5.0


def test_comparison_str_names_the_direction_and_counts():
    text = str(Comparison([0.010, 0.010, 0.010], [0.020, 0.020, 0.020]))
    assert text.startswith("B/A = 2× ± 0 (median of 3 paired ratios, IQR/2)")
    assert "A 10 ms" in text and "B 20 ms" in text


def test_comparison_str_gives_half_the_interquartile_range_of_the_ratios_and_is_frozen():
    c = Comparison([1.0] * 5, [1.0, 2.0, 3.0, 4.0, 5.0])  # ratios 1..5: quartiles 2 and 4
    assert str(c).startswith("B/A = 3× ± 1 (median of 5 paired ratios")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.times_a = []  # a measurement is not edited after it was taken


def test_the_defaults_are_two_warm_up_calls_and_seven_timed_ones():
    clock = FakeClock()
    fn = clock.work([0.1] * 9)
    assert benchmark(fn, clock=clock).n == 7 and len(fn.calls) == 9
    log: list[str] = []
    c = compare(clock.work([0.1] * 9, log, "A"), clock.work([0.1] * 9, log, "B"), clock=clock)
    assert len(c.times_a) == 7 and log.count("A") == 9


def test_compare_alternates_abba_after_warming_both():
    clock = FakeClock()
    log: list[str] = []
    fn_a = clock.work([1.0], log, "A")
    fn_b = clock.work([3.0], log, "B")
    c = compare(fn_a, fn_b, repeats=5, warmup=2, clock=clock)
    assert log == ["A", "B"] * 2 + ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]
    assert clock.reads == 2 * 2 * 5
    assert c.times_a == [1.0] * 5 and c.times_b == [3.0] * 5
    assert c.ratio == 3.0


def test_compare_pairs_by_index_under_drift():
    clock = FakeClock()
    # the machine slows down 10x halfway; B is always 2x A within a pair
    fn_a = clock.work([1.0, 1.0, 10.0, 10.0])
    fn_b = clock.work([2.0, 2.0, 20.0, 20.0])
    c = compare(fn_a, fn_b, repeats=4, warmup=0, clock=clock)
    assert c.ratios == [2.0] * 4
    assert statistics.median(c.times_b) / statistics.median(c.times_a) == pytest.approx(2.0)


def test_compare_validates_its_arguments():
    with pytest.raises(TypeError, match="fn_b must be callable.*got int"):
        compare(lambda: None, 3)
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        compare(lambda: None, lambda: None, repeats=0)


# -- on a GPU ----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_benchmark_on_cuda_times_with_events():
    x = torch.randn(1024, 1024, device="cuda")
    calls = []

    def fn(a):
        calls.append(1)
        return a @ a

    no_clock = lambda: pytest.fail("host clock used on CUDA")  # noqa: E731
    t = benchmark(fn, x, warmup=1, repeats=3, calls=1, clock=no_clock)  # one launch per sample, when asked
    assert len(calls) == 4 and t.n == 3 and all(s > 0 for s in t.samples)
    calls.clear()
    t = benchmark(fn, x, warmup=1, repeats=3, clock=no_clock)  # amortised (Rule 5): N calls a sample, N doubled
    sizing = len(calls) - 1 - 3 * t.calls  # the doubling's tries: 1 + 2 + ... up to N (spanned) or N / 2 (capped)
    assert t.n == 3 and all(s > 0 for s in t.samples) and sizing in (2 * t.calls - 1, t.calls - 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compare_on_cuda_counts_more_work_as_slower():
    x = torch.randn(2048, 2048, device="cuda")
    c = compare(lambda: x @ x, lambda: [x @ x for _ in range(8)], repeats=5, device="cuda",
                clock=lambda: pytest.fail("host clock used on CUDA"))
    assert c.ratio > 1  # 8x the FLOPs; behaviour, not a figure


# -- amortised launches (Rule 5) ---------------------------------------------------

def test_calls_per_sample_doubles_until_a_sample_spans_the_target():
    tried = []

    def span(n):  # a 40 µs launch latency once per sample, then 10 µs per call
        tried.append(n)
        return 40e-6 + n * 10e-6
    assert calls_per_sample(span, target=1e-3) == 128 and tried == [1, 2, 4, 8, 16, 32, 64, 128]
    tried.clear()
    assert calls_per_sample(span, target=1e-3, most=20) == 20 and tried == [1, 2, 4, 8, 16]
    assert calls_per_sample(lambda n: 1.0, target=1e-3) == 1  # one call already spans it: timed alone
    for bad, match in ((dict(most=0), "most=0"), (dict(most=True), "most=True"), (dict(target=-1.0), "target=-1.0")):
        with pytest.raises(ValueError, match=match):
            calls_per_sample(lambda n: 1.0, **bad)


class FakeCuda:
    """CUDA as benchmark sees it, on the CPU: events read a fake clock, and each pair of events adds `latency`
    (the launch the old one-call timing measured); a call takes `kernel` seconds of the device's time."""

    def __init__(self, monkeypatch, latency: float, kernel: float) -> None:
        self.now, self.latency, self.kernel, self.pairs = 0.0, latency, kernel, 0
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = fake.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                fake.pairs += 1
                return (end.at - self.at + fake.latency) * 1e3  # ms, as CUDA's

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
        self.calls = 0

    def op(self):
        self.calls += 1
        self.now += self.kernel


def test_benchmark_on_cuda_times_many_launches_between_one_pair_of_events(monkeypatch):
    """A 5 µs kernel behind a 40 µs launch latency: one call between two events measured 45 µs (what the old
    benchmark reported on an H200); amortised over the calls that span 1 ms, the latency is a small part of it."""
    gpu = FakeCuda(monkeypatch, latency=40e-6, kernel=5e-6)
    t = benchmark(gpu.op, warmup=1, repeats=5, device="cuda")
    assert t.calls == 256 and t.n == 5  # 255 calls' span is the first at 1 ms or more: 40 + 256 x 5 µs
    assert t.median == pytest.approx(5e-6 + 40e-6 / 256)
    assert gpu.calls == 1 + (1 + 2 + 4 + 8 + 16 + 32 + 64 + 128 + 256) + 5 * 256
    alone = benchmark(gpu.op, warmup=1, repeats=5, device="cuda", calls=1)
    assert alone.calls == 1 and alone.median == pytest.approx(45e-6)  # the launch, as the old code timed it


def test_benchmark_on_cpu_reads_the_clock_around_one_call_as_before():
    clock = FakeClock()
    fn = clock.work([3.0, 1.0, 2.0, 5.0])
    t = benchmark(fn, warmup=1, repeats=3, clock=clock)
    assert (t.samples, t.calls, len(fn.calls), clock.reads) == ([1.0, 2.0, 5.0], 1, 4, 6)
    t = benchmark(fn, warmup=0, repeats=2, clock=clock, calls=3)  # asked for: three calls per reading
    assert t.calls == 3 and t.samples == [5.0, 5.0]
    with pytest.raises(ValueError, match="calls=0"):
        benchmark(fn, calls=0)


def test_timing_method_says_how_each_device_is_timed():
    assert "wall clock" in timing_method("cpu") and "one call" in timing_method("cpu")
    assert "CUDA events around N calls" in timing_method("cuda:0")
