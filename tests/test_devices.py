"""The device work is timed on (labkit/instruments/devices.py), on a CPU: a tensor that says it lives on CUDA, hidden
where a training step keeps its tensors (closures, a notebook's globals, partials, methods, optimizers), must send
`benchmark`, `compare` and `wall_seconds` to CUDA events, never the host clock; work found or seen on another
device is refused; and nothing in labkit reads a host clock around work but timing.py and the wall clocks named
below.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from labkit.instruments import timing
from labkit.instruments.devices import BUDGET, DEPTH, found_device, pick
from labkit.instruments.timing import benchmark, compare, resolve_device, wall_seconds
from labkit.planners.measuring import train_step
from test_timing import fake_cuda_tensor

ROOT = Path(__file__).resolve().parent.parent
CUDA1 = torch.device("cuda", 1)


def _model() -> nn.Module:
    model = nn.Linear(2, 2)
    model.weight = nn.Parameter(fake_cuda_tensor())
    return model


class _Holder:
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def run(self) -> None:
        self.model.weight.sum()

    def __call__(self) -> None:
        self.run()


@dataclasses.dataclass
class _Setup:
    model: nn.Module
    steps: int = 3


def _in_globals(source: str, **names) -> object:
    """A function defined as a notebook defines it: reading its tensors from the globals it runs in."""
    namespace = dict(names)
    exec(source, namespace)
    return namespace["f"]


def _where(x: torch.Tensor, model: nn.Module) -> dict[str, object]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return {
        "closure cell": lambda: x.sum(),
        "default argument": lambda t=x: t.sum(),
        "a notebook's global": _in_globals("f = lambda: x.sum()", x=x),
        "a global of a helper it calls": _in_globals("def helper():\n    return x.sum()\nf = lambda: helper()", x=x),
        "a function defined inside": _in_globals("def f():\n    def g():\n        return x\n    return g()", x=x),
        "functools.partial": functools.partial(torch.mm, x),
        "bound method": _Holder(model).run,
        "callable object": _Holder(model),
        "a dataclass in a closure": (lambda s: lambda: s.model(s))(_Setup(model)),
        "optimizer": lambda: opt.step(),
        "the kit's train_step": train_step(model, opt, torch.ones(2), lambda y: y.sum()),
    }


@pytest.mark.parametrize("where", list(_where(fake_cuda_tensor(), _model())))
def test_a_cuda_tensor_is_found_where_a_step_keeps_it(where):
    fn = _where(fake_cuda_tensor(), _model())[where]
    assert found_device(fn) == CUDA1 and resolve_device(None, fn) == CUDA1


def test_work_without_tensors_is_none_and_timed_on_the_cpu():
    cyclic: list = []
    cyclic.append(cyclic)
    assert found_device(lambda: cyclic, torch, nn.Linear, 3, "x") is None
    assert resolve_device(None, lambda: 1) == torch.device("cpu")
    assert found_device(lambda: torch.ones(2)) is None  # made inside: only a call sees it


def test_a_closure_cell_not_yet_assigned_is_passed_over():
    def outer():
        def step():
            return later.sum()
        found = found_device(step)  # `later` is a cell of step's closure, empty until the next line
        later = fake_cuda_tensor()
        return found, found_device(step)
    assert outer() == (None, CUDA1)


def test_the_search_stops_at_its_depth_and_its_budget():
    deep = [fake_cuda_tensor()]
    for _ in range(DEPTH):
        deep = [deep]  # the tensor DEPTH + 1 levels down: one past the search
    assert found_device(deep) is None and found_device(deep[0]) == CUDA1
    assert found_device([[] for _ in range(BUDGET)] + [fake_cuda_tensor()]) is None
    assert found_device([[] for _ in range(BUDGET - 2)] + [fake_cuda_tensor()]) == CUDA1


@pytest.fixture
def events(monkeypatch):
    """CUDA as a recorder: the calls timed with (fake) CUDA events and the devices synchronized."""
    seen = {"timed": 0, "synchronized": []}

    def cuda_seconds(call, n=1):  # n calls back to back between one pair of events: 1 ms each, one sample
        seen["timed"] += 1
        for _ in range(n):
            call()
        return 1e-3 * n
    monkeypatch.setattr(timing, "_cuda_seconds", cuda_seconds)
    monkeypatch.setattr(timing, "_on", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(timing, "_settle", lambda device: seen["synchronized"].append(device))
    return seen


def _host_clock():
    pytest.fail("the host clock timed CUDA work")


@pytest.mark.parametrize("where", list(_where(fake_cuda_tensor(), _model())))
def test_hidden_cuda_work_is_timed_with_cuda_events(events, where):
    fn = _where(fake_cuda_tensor(), _model())[where]
    hidden = lambda: fn is None  # noqa: E731  (not run for real: its tensors only say they are on CUDA)
    assert benchmark(hidden, warmup=1, repeats=3, clock=_host_clock).n == 3
    assert compare(hidden, hidden, repeats=4, warmup=0, clock=_host_clock).ratio == 1.0
    assert events["timed"] == 1 + 3 + 8  # benchmark sizes its samples first (one span; Rule 5), compare does not
    assert wall_seconds(hidden, clock=iter([0.0, 2.0]).__next__) == 2.0
    assert events["synchronized"][-2:] == [CUDA1, CUDA1]  # before the clock starts and before it stops


def test_the_kit_s_bench_steps_reach_cuda_events(events):
    from labkit.bench import lab06
    model, x = _model(), fake_cuda_tensor()
    step = lab06._step(model, lambda m, t: m(t))
    assert resolve_device(None, step) == CUDA1  # no x given: the model in the closure says CUDA
    loader = lab06.SlowLoader(x, batches=2, seconds=0.0)
    assert resolve_device(None, lambda: None, loader) == CUDA1


def test_work_on_another_device_is_refused_by_name():
    m = torch.ones(2, device="meta")
    with pytest.raises(ValueError, match="runs on device 'meta', which labkit cannot time"):
        benchmark(lambda: m + 1)
    with pytest.raises(ValueError, match="'meta'"):
        compare(lambda: None, lambda: m + 1)
    with pytest.raises(ValueError, match="'meta'"):
        benchmark(lambda: None, device="meta")  # asked for by name: refused all the same
    with pytest.raises(ValueError, match="'mps'"):
        pick([torch.device("cpu"), torch.device("mps")])  # beside the CPU too: its kernels run on their own
    assert benchmark(lambda: m + 1, device="cpu", repeats=1).n == 1  # an explicit device wins


def test_meta_tensors_beside_real_work_are_passed_over():
    meta, cpu = torch.ones(2, device="meta"), torch.ones(2)
    assert found_device(meta, cpu) == torch.device("cpu")
    assert found_device([meta], fake_cuda_tensor()) == CUDA1
    model = nn.Linear(2, 2)
    model.register_buffer("shape_only", torch.empty(3, device="meta"))
    assert resolve_device(None, lambda: model(cpu)) == torch.device("cpu")


class _Raising:
    """An object whose attributes raise when read (a lazy proxy, a half-torn-down handle)."""

    @property
    def __dict__(self):
        raise RuntimeError("not now")


class _Counting(list):
    def __init__(self, items):
        super().__init__(items)
        self.read = 0

    def __iter__(self):
        for item in super().__iter__():
            self.read += 1
            yield item


def test_what_cannot_be_looked_into_is_passed_over_and_a_huge_list_is_read_only_to_the_budget():
    assert found_device([_Raising(), fake_cuda_tensor()]) == CUDA1
    huge = _Counting([0] * (10 * BUDGET))
    assert found_device(huge) is None and huge.read <= BUDGET + 1


def test_where_nothing_is_found_and_cuda_is_there_one_call_shows_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="'meta'"):
        benchmark(lambda: torch.ones(2, device="meta") + 1)  # made inside the work: seen, then refused
    calls = []
    ticks = iter(range(100))
    t = benchmark(lambda: calls.append(torch.ones(2) + 1), warmup=2, repeats=3, clock=lambda: float(next(ticks)))
    assert t.n == 3 and len(calls) == 5  # the seeing call is the first warm-up call
    calls.clear()
    benchmark(lambda: calls.append(torch.ones(2) + 1), warmup=0, repeats=3, clock=lambda: float(next(ticks)))
    assert len(calls) == 4  # with no warm-up, it is one more untimed call
    cpu = torch.ones(2)
    assert benchmark(lambda: cpu.to("meta"), repeats=2, clock=lambda: float(next(ticks))).n == 2  # meta beside CPU
    assert benchmark(lambda: None, repeats=2, clock=lambda: float(next(ticks))).n == 2  # no op seen: the CPU


def test_wall_seconds_where_nothing_names_cuda_waits_for_the_current_cuda_device(events, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    started = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: bool(started))
    assert wall_seconds(lambda: started.append(1), clock=iter([0.0, 3.0]).__next__) == 3.0  # the work started CUDA
    assert events["synchronized"] == [torch.device("cpu"), torch.device("cpu"), CUDA1] and events["timed"] == 0
    events["synchronized"].clear()
    assert wall_seconds(lambda: None, "cpu", clock=iter([0.0, 1.0]).__next__) == 1.0  # named: the CPU only
    assert events["synchronized"] == [torch.device("cpu")] * 2


def test_settling_on_cuda_waits_for_the_device(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    timing._settle(torch.device("cpu"))
    timing._settle(CUDA1)
    assert waited == [CUDA1]


# wall clocks that time no tensor work: (file, why)
WALL_CLOCKS = {
    "labkit/course/notebook.py": "a notebook's whole run",
    "labkit/course/grade/bench.py": "a grading run's whole time",
    "labkit/course/grade/judge.py": "a submission's limits",
    "labkit/course/grade/calls.py": "a student function's deadline in the box",
    "labkit/course/grade/watch.py": "a box's CPU seconds against the wall clock (its CPU share)",
    "labkit/course/grade/wire.py": "a message's deadline",
    "labkit/course/grade/worker.py": "an exercise's limit",
    "labkit/env/ranks.py": "the ranks' start-up deadline",
    "labkit/checks/lab07/planner.py": "a planner's Python search on a profile (no tensors)",
    "labkit/bench/lab03.py": "the schedule solver's Python search (no tensors)",
    "labkit/bench/fsdp.py": "the whole distributed run, printed beside its measured figures",
}


def test_no_host_clock_times_work_outside_timing():
    clock = re.compile(r"\btime\.(perf_counter|time|monotonic|process_time)(_ns)?\b|\bfrom time import\b")
    found = {}
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if clock.search(line)]
        if lines and name != "labkit/instruments/timing.py":
            found[name] = lines
    unexpected = {n: lines for n, lines in found.items() if n not in WALL_CLOCKS}
    assert not unexpected, (f"a host clock outside labkit/instruments/timing.py at {unexpected}: time work with "
                            "timing.benchmark, compare or wall_seconds, which use CUDA events on CUDA")
    assert set(WALL_CLOCKS) <= set(found), f"listed but clock-free now: {set(WALL_CLOCKS) - set(found)}"
