"""`python -m labkit gpu-check`: the GPU-only tests and benchmarks in one command, summary table last.

Sized for a few minutes on one GPU. Without CUDA it says so and exits 0: the
GPU code paths are unit-tested on CPU as far as a CPU allows.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    """One line of the summary table."""

    name: str
    value: str
    bar: str
    ok: bool


def _gpu_tests() -> Row:
    """pytest -m gpu over tests/ (CUDA timing, meter against the allocator)."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", str(ROOT / "tests")],
                         capture_output=True, text=True, cwd=ROOT)
    last = (run.stdout.strip().splitlines() or ["no output"])[-1]
    print(run.stdout[-3000:])
    return Row("pytest -m gpu", last, "all pass", run.returncode == 0)


def _meter_vs_allocator() -> Row:
    """The meter's peak growth against torch.cuda.max_memory_allocated over one GPT training step."""
    from labkit.meter import MemoryMeter
    from labkit.models import GPTConfig, GPTStack, gpt_input
    from labkit.profile import sizes

    size = sizes("gpu")
    cfg = GPTConfig(seq=size.seq, batch=size.batch, hidden=size.hidden, heads=size.heads,
                    n_layers=size.gpt_layers, dtype=torch.bfloat16)
    model = GPTStack(cfg).cuda()
    opt = torch.optim.Adam(model.parameters())
    x = gpt_input(cfg).cuda()

    def step() -> None:
        model(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # Adam state and cuBLAS workspaces exist before measuring
    meter = MemoryMeter(model, opt, x)
    with meter:
        step()
    growth = meter.peak - meter.baseline
    rel = abs(growth - meter.allocator_peak) / meter.allocator_peak
    return Row("meter vs cuda allocator peak", f"{growth:,} vs {meter.allocator_peak:,} B ({rel:.2%})", "<= 5%", rel <= 0.05)


def _bench(name: str, label: str, bar: str, ok: Callable[[dict], bool]) -> Callable[[], Row]:
    """A check running `bench NAME`, its row labelled `label`."""
    def run() -> Row:
        from labkit import bench

        figures = bench.BENCHMARKS[name]()
        print(f"bench {name}: {json.dumps(figures)}")
        shown = {k: v for k, v in figures.items() if not isinstance(v, (dict, list))}
        return Row(label, json.dumps(shown), bar, ok(figures))

    run.__name__ = label
    return run


def main() -> int:
    """Run every GPU check; print the table last; exit 1 if any check failed."""
    if not torch.cuda.is_available():
        print("labkit gpu-check: torch sees no CUDA device; nothing to run here (the CPU suite is `make test`).")
        return 0
    start = time.perf_counter()
    print(f"labkit gpu-check on {torch.cuda.get_device_name()} with torch {torch.__version__}")
    checks = [
        _gpu_tests,
        _meter_vs_allocator,
        # time is reported, not judged: a ratio of timings on a shared machine is no pass/fail bar
        _bench("recompute", "bench recompute (gpu profile)", "peak/torch <= 1.02, peak/none <= 0.5, bitwise",
               lambda f: f["peak_ratio_vs_torch"] <= 1.02 and f["peak_ratio_vs_none"] <= 0.5
               and f["grads_bitwise_equal"]),
        _bench("formula", "bench formula (CPU configs)", "max_rel_error <= 0.15", lambda f: f["max_rel_error"] <= 0.15),
        _bench("policies", "bench policies (gpu profile)", "selective cuts >= 2.5x, yours == PyTorch's bytes, bitwise",
               lambda f: f["selective_bytes_cut"] >= 2.5 and all(
                   p["activation_bytes"] == p["bytes_torch"] and p["grads_equal_ours"] and p["grads_equal_torch"]
                   for p in f["policies"])),
        # the roofline bound holds from below: no op may beat its prediction by 2x; slower ops are reported
        _bench("roofline", "bench roofline (gpu profile)", "every op >= 1 ms: measured >= predicted / 2",
               lambda f: all(op["measured_s"] >= op["predicted_s"] / 2 for op in f["ops"] if op["measured_s"] >= 1e-3)),
    ]
    rows = []
    for check in checks:
        try:
            rows.append(check())
        except Exception as e:  # a broken check is a failed row, and the table still prints
            rows.append(Row(getattr(check, "__name__", "check"), f"{type(e).__name__}: {e}"[:160], "runs", False))
    width = max(len(r.name) for r in rows)
    print(f"\nlabkit gpu-check summary ({time.perf_counter() - start:.0f} s)")
    print(f"{'check':{width}}  ok    {'measured':60}  bar")
    for r in rows:
        print(f"{r.name:{width}}  {'yes' if r.ok else 'NO ':4}  {r.value:60}  {r.bar}")
    return 0 if all(r.ok for r in rows) else 1
