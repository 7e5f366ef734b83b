"""`python -m labkit gpu-check`: the GPU-only tests, the benchmarks, then every lab, summary table last.

Everything is sized as on a card with 16 GiB free (`--memory`, or $LABKIT_GPU_MEMORY, which also caps the
allocator), so it takes a few minutes on any GPU that large and checks the sizes a T4 would get. Each lab runs
in its own kernel, its allocator peak measured against labkit.env.sizing's prediction. Without CUDA it says so and
exits 0: the GPU code paths are unit-tested on CPU as far as a CPU allows.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

import torch

from labkit.course.catalog import LABS, Lab

ROOT = Path(__file__).resolve().parents[2]


def sizing_labs() -> list[Lab]:
    """The labs whose peak labkit.env.sizing predicts (every lab that puts tensors on the device)."""
    from labkit.env.sizing import lab_peaks
    from labkit.env.sizes import FIXED

    predicted = lab_peaks(FIXED["tiny"])
    return [lab for lab in LABS if lab.number in predicted]


@dataclass
class Row:
    """One line of the summary table."""

    name: str
    value: str
    bar: str
    ok: bool


def _gpu_tests() -> Row:
    """pytest -m gpu over tests/ (CUDA timing, meter against the allocator)."""
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                              str(ROOT / "tests")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    except subprocess.TimeoutExpired:
        return Row("pytest -m gpu", "did not finish in 300 s", "all pass", False)
    last = (run.stdout.strip().splitlines() or ["no output"])[-1]
    print(run.stdout[-3000:])
    return Row("pytest -m gpu", last, "all pass", run.returncode == 0)


def _meter_vs_allocator() -> Row:
    """The meter's peak growth against torch.cuda.max_memory_allocated over one GPT training step."""
    from labkit.instruments.meter import MemoryMeter
    from labkit.models import GPTStack, gpt_input
    from labkit.env.profile import sizes

    size = sizes("gpu")
    cfg = size.gpt(dtype=torch.bfloat16)
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


def spec_for(device_name: str):
    """The spec sheet (labkit.instruments.roofline.GPU_SPECS) of the card `device_name` names, or None: the
    sheet's name as a whole word ("Tesla T4", "NVIDIA H200"; not "Quadro T400" nor "GH200", a Grace Hopper
    with another host link)."""
    import re

    from labkit.instruments.roofline import GPU_SPECS

    return next((spec for key, spec in GPU_SPECS.items()
                 if re.search(rf"(?<![A-Z0-9]){key}(?![0-9])", device_name.upper())), None)


def _ceilings_vs_spec() -> Row:
    """The matmul peak (in the spec sheet's dtype) and the bandwidth, measured, against the card's datasheet."""
    from labkit.env.profile import sizes
    from labkit.instruments.roofline import measure_ceilings, measure_ceilings_by_dtype
    from labkit.models.layers import dtype_name

    name, size = torch.cuda.get_device_name(), sizes("gpu")
    spec = spec_for(name)
    by_dtype = measure_ceilings_by_dtype("cuda", size)
    if spec is not None and spec.dtype != torch.bfloat16:  # a card without bfloat16 tensor cores (T4: float16)
        by_dtype[dtype_name(spec.dtype)] = measure_ceilings("cuda", spec.dtype, size)
    value = ", ".join(f"{k} {c.peak_flops / 1e12:.3g} TFLOP/s" for k, c in by_dtype.items())
    bandwidth = by_dtype["float32"].peak_bandwidth
    value += f"; {bandwidth / 1e9:.4g} GB/s"
    if spec is None:
        return Row("ceilings vs spec sheet", value + f" (no spec sheet for {name})", "no spec sheet: reported only",
                   True)
    peak = by_dtype[dtype_name(spec.dtype)].peak_flops
    value += f" ({peak / spec.peak_flops:.0%} and {bandwidth / spec.peak_bandwidth:.0%} of {spec.name}'s)"
    return Row("ceilings vs spec sheet", value, "measured <= spec x 1.05 (a datasheet is a ceiling)",
               peak <= 1.05 * spec.peak_flops and bandwidth <= 1.05 * spec.peak_bandwidth)


def _offload() -> Row:
    """The host link, measured (a pinned round trip), against the card's datasheet."""
    from labkit.instruments.roofline import measure_host_bandwidth

    measured, spec = measure_host_bandwidth("cuda"), spec_for(torch.cuda.get_device_name())
    value = f"{measured / 1e9:.3g} GB/s each way (pinned, on the current stream)"
    if spec is None or not spec.host_bandwidth:
        return Row("offload: host link", value, "no spec sheet: reported only", True)
    return Row("offload: host link", value + f" ({measured / spec.host_bandwidth:.0%} of {spec.name}'s)",
               "measured <= spec x 1.1", measured <= 1.1 * spec.host_bandwidth)


def write_json(rows: list[Row], device: str, seconds: float, memory: str, folder: Path = ROOT / "docs" / "gpu",
               today: str | None = None) -> Path:
    """The run as one JSON file under `folder`, named by card, memory, torch and date; a second run on the same
    day gets a number after the date, never overwriting the first."""
    import dataclasses
    import datetime
    import re

    today = today or datetime.date.today().isoformat()
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    stem = f"{slug}-{memory.lower()}-torch{torch.__version__.split('+')[0]}-{today}"
    folder.mkdir(parents=True, exist_ok=True)
    path = next(p for n in range(1, 1000) if not (p := folder / (stem + (f"-{n}" if n > 1 else "") + ".json")).exists())
    path.write_text(json.dumps({"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
                                "date": today, "memory": memory, "seconds": round(seconds, 1),
                                "ok": all(r.ok for r in rows), "rows": [dataclasses.asdict(r) for r in rows]},
                               indent=1) + "\n")
    return path


# Run in each lab's kernel before its first cell: the allocator's peak of every cell, reset after it.
# A meter inside a cell resets the allocator's peak on entry: the reset is wrapped to keep what it drops.
_RECORD = """
import torch as _t
_cell_peaks, _dropped, _reset = [], [0], _t.cuda.reset_peak_memory_stats
def _keeping_reset(*args, **kwargs):
    if _t.cuda.is_initialized():
        _dropped[0] = max(_dropped[0], _t.cuda.max_memory_allocated())
    _reset(*args, **kwargs)
_t.cuda.reset_peak_memory_stats = _keeping_reset
def _record(result):
    if _t.cuda.is_initialized():
        peak = max(_dropped[0], _t.cuda.max_memory_allocated())
        _cell_peaks.append((peak, (result.info.raw_cell or "").strip()[:60]))
        _dropped[0] = 0
        _reset()
get_ipython().events.register("post_run_cell", _record)
"""
# ... and after its last: one JSON line with the measured and the predicted peaks.
_REPORT = """
import json
from labkit.env.profile import gpu_choice as _choice
print("LABKIT-PEAK " + json.dumps({"measured": max([p for p, _ in _cell_peaks], default=0),
      "top": sorted(_cell_peaks, reverse=True)[:3], "predicted": _choice().labs, "scale": _choice().scale}))
"""


def lab_peaks(memory: str, deadline: float) -> list[Row]:
    """Execute each solution notebook that sizing predicts a peak for (01-07) on the gpu profile as on a card of `memory` (LABKIT_GPU_MEMORY caps
    the allocator there): the allocator's peak against the lab's predicted peak. Labs not started by
    `deadline` (time.monotonic()) are reported as skipped."""
    import nbformat
    from nbclient import NotebookClient

    rows: list[Row] = []
    with mock.patch.dict(os.environ, {"LABKIT_PROFILE": "gpu", "LABKIT_GPU_MEMORY": memory}):
        for entry in sizing_labs():
            path, lab = entry.solution(ROOT), entry.number
            if time.monotonic() > deadline:
                rows.append(Row(f"lab {lab} peak on {memory}", "skipped: out of time", "measured <= predicted", False))
                continue
            nb = nbformat.read(path, as_version=4)
            nb.cells.insert(0, nbformat.v4.new_code_cell(_RECORD))
            nb.cells.append(nbformat.v4.new_code_cell(_REPORT))
            start = time.perf_counter()
            try:
                NotebookClient(nb, timeout=max(30, int(deadline - time.monotonic()) + 30), kernel_name="python3",
                               resources={"metadata": {"path": str(path.parent)}}).execute()
            except Exception as e:  # a cell that fails is this lab's row, not the end of the check
                print(f"lab {lab} failed:\n{str(e)[-4000:]}")
                rows.append(Row(f"lab {lab} peak on {memory}", f"{type(e).__name__}: {str(e)[-200:]}",
                                "runs", False))
                continue
            text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
            figures = json.loads(text.split("LABKIT-PEAK ", 1)[1])
            print(f"lab {lab}: {json.dumps(figures)}")
            measured, predicted = figures["measured"], figures["predicted"][lab]
            rows.append(Row(f"lab {lab} peak on {memory} (x{figures['scale']})",
                            f"{measured / 2**30:.2f} GiB vs predicted {predicted / 2**30:.2f} "
                            f"({measured / predicted:.0%}), {time.perf_counter() - start:.0f} s",
                            "measured <= predicted", measured <= predicted))
    return rows


def main(memory: str | None = None, labs_seconds: float = 420) -> int:
    """Run every GPU check as on a card with `memory` free (default: $LABKIT_GPU_MEMORY, else 16GiB); print
    the table last; exit 1 if any check failed. The labs get `labs_seconds` in all."""
    if not torch.cuda.is_available():
        print("labkit gpu-check: torch sees no CUDA device; nothing to run here (the CPU suite is `make test`).")
        return 0
    import os

    memory = memory or os.environ.get("LABKIT_GPU_MEMORY") or "16GiB"
    os.environ["LABKIT_GPU_MEMORY"] = memory  # this process, the pytest it starts and the lab kernels
    start = time.perf_counter()
    print(f"labkit gpu-check on {torch.cuda.get_device_name()} with torch {torch.__version__}, sized as on a card "
          f"with {memory} free")
    from labkit.env.doctor import doctor

    doctor()
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
        # the planner's plan (offload among its ways on a GPU) fits the budget the bench sets, as predicted
        _bench("plan", "bench plan (gpu profile)", "measured peak <= budget, predicted within 25%, none over",
               lambda f: f["measured_peak"] <= f["budget_bytes"] and not f["fits"]["none"]
               and abs(f["predicted_peak"] - f["measured_peak"]) <= 0.25 * f["measured_peak"]),
        # the roofline bound holds from below: no op may beat its prediction by 2x; slower ops are reported
        _bench("roofline", "bench roofline (gpu profile)", "every op >= 1 ms: measured >= predicted / 2",
               lambda f: all(op["measured_s"] >= op["predicted_s"] / 2 for op in f["ops"] if op["measured_s"] >= 1e-3)),
        _ceilings_vs_spec,
        _offload,
    ]
    rows = []
    for check in checks:
        try:
            rows.append(check())
        except Exception as e:  # a broken check is a failed row, and the table still prints
            rows.append(Row(getattr(check, "__name__", "check"), f"{type(e).__name__}: {e}"[:160], "runs", False))
    # then the labs, each in its own kernel, as a student on a card of `memory` would run them
    rows += lab_peaks(memory, time.monotonic() + labs_seconds)
    width = max(len(r.name) for r in rows)
    print(f"\nlabkit gpu-check summary ({time.perf_counter() - start:.0f} s)")
    print(f"{'check':{width}}  ok    {'measured':60}  bar")
    for r in rows:
        print(f"{r.name:{width}}  {'yes' if r.ok else 'NO ':4}  {r.value:60}  {r.bar}")
    path = write_json(rows, torch.cuda.get_device_name(), time.perf_counter() - start, memory)
    print(f"written: {path.relative_to(ROOT)} (commit it: measured figures on a real card)")
    return 0 if all(r.ok for r in rows) else 1
