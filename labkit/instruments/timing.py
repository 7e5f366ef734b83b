"""Timing: warm-up, repeats, median and spread; an A/B comparison that alternates.

The rules (see docs/design.md, "Measuring honestly"):
Rule 1. Warm up first: the first calls pay for allocator growth, kernel selection
   and lazy initialisation, which is not what a lab is asking about.
Rule 2. Report the median and half the interquartile range, never the mean: one
   call preempted by another process on a shared machine moves the mean a lot
   and the median hardly at all.
Rule 3. Compare A and B in one run, interleaved A B B A A B ...: a shared machine
   drifts (clocks, neighbours, thermals) over seconds, and interleaving makes
   the drift hit both sides alike. The ratio is taken pair by pair.
Rule 4. On CUDA the host returns before the kernels finish, so a host clock measures
   the launch, not the work. Time with CUDA events and synchronize.
Rule 5. On CUDA one call between two events measures a launch as much as the work: a small op's
   kernel is done long before the events' own latency (tens of µs) is. `benchmark` times
   several calls back to back between one pair of events (doubling them until a sample spans
   AMORTISE_SECONDS) and reports seconds per call: the host queues the next launch while the
   device runs this one, so what is left of the launch is its issue rate, which every replay pays.
   On a CPU the clock is read around one call, as it always was: no launch hides behind it.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch

from labkit.instruments.devices import found_device, pick, seen_in
from labkit.instruments.tensors import check_callable

Clock = Callable[[], float]  # seconds, monotonic: time.perf_counter or a fake in tests
Span = Callable[[int], float]  # seconds of n calls back to back, timed as one (Rule 5)

AMORTISE_SECONDS = 1e-3  # on CUDA a sample spans at least this: the events' latency is a small part of it
MOST_CALLS = 1024  # calls per sample at most, however small the op


def _quartiles(samples: list[float]) -> tuple[float, float]:
    """(q25, q75) by linear interpolation, as numpy's default; one sample is its own quartiles."""
    if len(samples) == 1:
        return samples[0], samples[0]
    q25, _, q75 = statistics.quantiles(samples, n=4, method="inclusive")
    return q25, q75


def _format_seconds(seconds: float) -> tuple[str, float]:
    """The unit that suits `seconds` and its scale: ("ms", 1e3) for 0.0123."""
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if abs(seconds) >= 1.0 / scale:
            return unit, scale
    return "ns", 1e9


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one function: the samples and their median and spread."""

    samples: list[float]  # seconds per timed call, in the order measured
    calls: int = 1  # calls timed back to back per sample, each sample their mean (Rule 5)

    @property
    def n(self) -> int:
        """Number of timed calls."""
        return len(self.samples)

    @property
    def median(self) -> float:
        """Median seconds per call (see Rule 2)."""
        return statistics.median(self.samples)

    @property
    def q25(self) -> float:
        """First quartile of the samples, in seconds."""
        return _quartiles(self.samples)[0]

    @property
    def q75(self) -> float:
        """Third quartile of the samples, in seconds."""
        return _quartiles(self.samples)[1]

    @property
    def spread(self) -> float:
        """Half the interquartile range, in seconds: the "±" of __str__."""
        return (self.q75 - self.q25) / 2

    def __str__(self) -> str:
        unit, scale = _format_seconds(self.median)
        return (f"{self.median * scale:.3g} {unit} ± {self.spread * scale:.2g} "
                f"(median, IQR/2, n={self.n})")


@dataclass(frozen=True)
class Comparison:
    """A/B timings taken interleaved, and the ratio B/A of each pair."""

    times_a: list[float]  # seconds per call of fn_a, pair i at index i
    times_b: list[float]  # seconds per call of fn_b, pair i at index i

    @property
    def ratios(self) -> list[float]:
        """time_b / time_a of each pair: above 1 means B is slower."""
        return [b / a for a, b in zip(self.times_a, self.times_b)]

    @property
    def ratio(self) -> float:
        """Median of the pairwise ratios time_b / time_a."""
        return statistics.median(self.ratios)

    @property
    def a(self) -> Timing:
        """The A side as a Timing."""
        return Timing(self.times_a)

    @property
    def b(self) -> Timing:
        """The B side as a Timing."""
        return Timing(self.times_b)

    def __str__(self) -> str:
        q25, q75 = _quartiles(self.ratios)
        return (f"B/A = {self.ratio:.3g}× ± {(q75 - q25) / 2:.2g} "
                f"(median of {len(self.ratios)} paired ratios, IQR/2); A {self.a}; B {self.b}")


def _check_counts(warmup: object, repeats: object) -> None:
    """Raise if warmup is not an int >= 0 or repeats not an int >= 1."""
    for name, value, least in (("warmup", warmup, 0), ("repeats", repeats, 1)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int >= {least}, got {value!r} "
                            f"of type {type(value).__name__}")
        if value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def _given_or_found(device: str | torch.device | None,
                    values: tuple[Any, ...]) -> tuple[torch.device | None, bool]:
    """`device` if given (CPU or a CUDA device torch sees), else what a search of `values` finds (None: nothing);
    and whether the work may still run CUDA kernels no search can see (nothing given, no CUDA found, CUDA here)."""
    if device is None:
        found = found_device(*values)
        return found, (found is None or found.type == "cpu") and torch.cuda.is_available()
    device = pick([torch.device(device)])  # a device labkit cannot time is refused by name
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but torch sees no CUDA device; "
                         "pass device='cpu' or leave it None")
    return device, False


def resolve_device(device: str | torch.device | None, *values: Any) -> torch.device:
    """The device to time on: `device` if given, else the device of the tensors reachable from `values` (through
    closures, modules and optimizers: labkit/instruments/devices.py), CUDA if any is there, else CPU."""
    return _given_or_found(device, values)[0] or torch.device("cpu")


def _warm_up(calls: tuple[Callable[[], Any], ...], warmup: int, device: str | torch.device | None,
             values: tuple[Any, ...]) -> torch.device:
    """Run the warm-up calls and return the device to time on. Where neither `device` nor a search of `values`
    names CUDA and CUDA is available, the first warm-up round runs under a mode that sees which devices its
    operations use, so that no CUDA work is timed with the host clock (a tensor made inside the work is found no
    other way); with warmup=0 that seeing round is one untimed round all the same."""
    device, hidden = _given_or_found(device, values)
    if hidden:
        device = pick([*([device] if device else []), *(d for d in map(seen_in, calls) if d is not None)])
        warmup = max(warmup - 1, 0)
    device = device or torch.device("cpu")
    with _on(device):
        for _ in range(warmup):
            for call in calls:
                call()
        _settle(device)
    return device


def _cuda_seconds(call: Callable[[], Any], n: int = 1) -> float:
    """Seconds `n` calls' work takes on the current CUDA stream, queued back to back between two CUDA events."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3  # elapsed_time is in ms


def _span(call: Callable[[], Any], n: int, device: torch.device, clock: Clock) -> float:
    """Seconds of `n` calls back to back: CUDA events around them on a CUDA device (Rule 4), else `clock`."""
    if device.type == "cuda":
        return _cuda_seconds(call, n)
    t0 = clock()
    for _ in range(n):
        call()
    return clock() - t0


def _time_call(call: Callable[[], Any], device: torch.device, clock: Clock) -> float:
    """Seconds one call takes: CUDA events on a CUDA device (Rule 4), else `clock`."""
    return _span(call, 1, device, clock)


def calls_per_sample(span: Span, target: float = AMORTISE_SECONDS, most: int = MOST_CALLS) -> int:
    """The fewest calls, doubling from 1, whose `span` lasts `target` seconds or more; `most` where none under it
    does (Rule 5). `span(n)` times n calls back to back; each try runs them (they are warm-up too)."""
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"calls_per_sample: most={most!r} must be an int >= 1")
    if not target >= 0:
        raise ValueError(f"calls_per_sample: target={target!r} must be seconds >= 0")
    n = 1
    while n < most and span(n) < target:
        n = min(2 * n, most)
    return n


def _check_calls(calls: object) -> None:
    """Raise unless `calls` is None (as the device needs) or an int >= 1."""
    if calls is not None and (isinstance(calls, bool) or not isinstance(calls, int) or calls < 1):
        raise ValueError(f"calls={calls!r} must be None (amortised on CUDA, one on a CPU) or an int >= 1")


def _calls_for(call: Callable[[], Any], calls: int | None, device: torch.device, clock: Clock) -> int:
    """`calls` if given, else as Rule 5 has it on `device`: amortised on CUDA, one call per sample on a CPU."""
    if calls is not None:
        return calls
    if device.type != "cuda":
        return 1
    return calls_per_sample(lambda n: _span(call, n, device, clock))


def timing_method(device: str | torch.device) -> str:
    """How `benchmark` times on `device`, in words (Rules 2, 4 and 5)."""
    if torch.device(device).type == "cuda":
        return (f"CUDA events around N calls back to back (N doubled until a sample spans "
                f"{AMORTISE_SECONDS * 1e3:g} ms, at most {MOST_CALLS}), seconds per call, median of samples")
    return "wall clock (time.perf_counter) around one call, median of samples"


def _on(device: torch.device) -> ContextManager[Any]:
    """Make `device` current, so events record on its stream; nothing to do on CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _settle(device: torch.device) -> None:
    """Wait for queued work (warm-up kernels) so it is not billed to the first timed call."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_seconds(call: Callable[[], Any], device: str | torch.device | None = None, *values: Any,
                 clock: Clock = time.perf_counter) -> float:
    """Host-clock seconds of one `call` of work that waits on the host as well as the device (an input pipeline
    feeding training steps), the device's queued work included: on CUDA it is synchronized before the clock stops.
    The device is `device`, else found as `benchmark` finds it, from `call` and `values`; `call` runs once only,
    so where nothing names CUDA, CUDA is available and has been started (work that queued kernels started it), the
    current CUDA device is synchronized as well; CPU work never starts CUDA here."""
    check_callable(call, "wall_seconds", "call")
    device, hidden = _given_or_found(device, (call, *values))
    device = device or torch.device("cpu")

    def settle() -> None:
        _settle(device)
        if hidden and torch.cuda.is_initialized():
            _settle(torch.device("cuda", torch.cuda.current_device()))
    settle()
    t0 = clock()
    call()
    settle()
    return clock() - t0


def benchmark(fn: Callable[..., Any], *args: Any, warmup: int = 2, repeats: int = 7,
              device: str | torch.device | None = None, clock: Clock = time.perf_counter,
              calls: int | None = None, **kwargs: Any) -> Timing:
    """Time `fn(*args, **kwargs)`: `warmup` untimed calls, then `repeats` timed samples.

    The device is `device`, else CUDA when any tensor reachable from `fn` and
    its arguments (closures, modules, optimizers: devices.py) is on CUDA, else
    CPU; where nothing is found and CUDA is available, the first warm-up call
    (with warmup=0, one untimed call) shows which device the work uses. On CUDA
    each sample is CUDA events around `calls` calls back to back, and None
    doubles them until a sample spans AMORTISE_SECONDS (Rule 5); on CPU `clock`
    (seconds) around `calls` calls, one when None. A sample is seconds per
    call. The names warmup, repeats, device, clock and calls are taken by
    benchmark itself, so `fn` cannot receive keyword arguments of those names
    through it.
    """
    check_callable(fn, "benchmark")
    _check_counts(warmup, repeats)
    _check_calls(calls)
    device = _warm_up((lambda: fn(*args, **kwargs),), warmup, device, (fn, *args, *kwargs.values()))
    call = lambda: fn(*args, **kwargs)  # noqa: E731
    with _on(device):
        n = _calls_for(call, calls, device, clock)
        samples = [_span(call, n, device, clock) / n for _ in range(repeats)]
    return Timing(samples, n)


def compare(fn_a: Callable[[], Any], fn_b: Callable[[], Any], repeats: int = 7, warmup: int = 2,
            device: str | torch.device | None = None, clock: Clock = time.perf_counter) -> Comparison:
    """Time two zero-argument functions interleaved; `ratio` is time_b / time_a (above 1: B is slower).

    Both are warmed up, then timed in `repeats` pairs whose order alternates,
    A B, B A, A B, ... (see Rule 3). The device is found as `benchmark` finds
    it, through the closures' cells and the globals they read; `device` wins.
    """
    check_callable(fn_a, "compare", "fn_a")
    check_callable(fn_b, "compare", "fn_b")
    _check_counts(warmup, repeats)
    device = _warm_up((fn_a, fn_b), warmup, device, (fn_a, fn_b))
    times_a: list[float] = []
    times_b: list[float] = []
    order = ((fn_a, times_a), (fn_b, times_b))
    with _on(device):
        for i in range(repeats):
            for fn, times in order if i % 2 == 0 else order[::-1]:
                times.append(_time_call(fn, device, clock))
    return Comparison(times_a, times_b)
