"""The rows of `python -m labkit gpu-check` (tools/gpucheck.py), each measured in a process of its own.

`python tools/gpurows.py KEY OUT` measures the row KEY (a key of ROWS) on the gpu profile, sized as
$LABKIT_GPU_MEMORY says, and writes it to the file OUT as one JSON object (Row's fields):
what gpu-check's parent process reads once the child ends, or does not when it was cut. Rows that crash are rows
too: the error's line is the value.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: the checkout's labkit
    sys.path.insert(1, str(ROOT))

from labkit.env import variables  # noqa: E402
# Reserved bytes a lab may reach, over its predicted allocated peak. With expandable segments (labkit.env sets
# them) the caching allocator maps pages as needed instead of keeping whole segments: on an H200 at 16 GiB every
# lab reserved at most 1.30x what it allocated (lab 04) and at most 1.001x its predicted allocated peak (lab 01)
# (docs/gpu/nvidia-h200-16gib-torch2.11.0-2026-12-04.json); without them lab 02 had reserved 5x.
RESERVE_FACTOR = 1.3


@dataclass
class Row:
    """One line of the summary table, and of the JSON lines file."""

    name: str
    value: str
    bar: str
    ok: bool
    seconds: float = 0.0  # how long the row took, its process's start included
    figures: dict[str, Any] = field(default_factory=dict)  # the numbers behind `value`
    key: str = ""  # its key in ROWS (what --only takes)


def gpu_tests() -> Row:
    """pytest -m gpu over tests/ (CUDA timing, meter against the allocator)."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                          str(ROOT / "tests")], capture_output=True, text=True, cwd=ROOT)
    last = (run.stdout.strip().splitlines() or ["no output"])[-1]
    print(run.stdout[-3000:], run.stderr[-2000:] if run.returncode else "", flush=True)
    return Row("pytest -m gpu", last, "all pass", run.returncode == 0)


def meter_vs_allocator() -> Row:
    """The meter's peak growth against torch.cuda.max_memory_allocated over one GPT training step."""
    import torch

    from labkit.env.profile import sizes
    from labkit.instruments.meter import MemoryMeter
    from labkit.models import GPTStack, gpt_input

    cfg = sizes("gpu").gpt(dtype=torch.bfloat16)
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
    return Row("meter vs cuda allocator peak", f"{growth:,} vs {meter.allocator_peak:,} B ({rel:.2%})", "<= 5%",
               rel <= 0.05, figures={"meter": growth, "allocator": meter.allocator_peak})


def bench(name: str, label: str, bar: str, ok: Callable[[dict], bool]) -> Callable[[], Row]:
    """A row running `bench NAME`, labelled `label`; its JSON printed in full, its scalars in the row."""
    def run() -> Row:
        import labkit.bench as benches

        figures = benches.BENCHMARKS[name]()
        print(f"bench {name}: {json.dumps(figures)}", flush=True)
        shown = {k: v for k, v in figures.items() if not isinstance(v, (dict, list))}
        return Row(label, json.dumps(shown), bar, bool(ok(figures)), figures=shown)

    return run


def spec_for(device_name: str):
    """The spec sheet (labkit.instruments.roofline.GPU_SPECS) of the card `device_name` names, or None: the
    sheet's name as a whole word ("Tesla T4", "NVIDIA H200"; not "Quadro T400" nor "GH200", a Grace Hopper
    with another host link)."""
    import re

    from labkit.instruments.roofline import GPU_SPECS

    return next((spec for key, spec in GPU_SPECS.items()
                 if re.search(rf"(?<![A-Z0-9]){key}(?![0-9])", device_name.upper())), None)


def ceilings_vs_spec() -> Row:
    """The matmul peak (in the spec sheet's dtype) and the bandwidth, measured, against the card's datasheet."""
    import torch

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
    figures = {f"{k}_flops": c.peak_flops for k, c in by_dtype.items()} | {"bandwidth": bandwidth}
    if spec is None:
        return Row("ceilings vs spec sheet", value + f" (no spec sheet for {name})", "no spec sheet: reported only",
                   True, figures=figures)
    peak = by_dtype[dtype_name(spec.dtype)].peak_flops
    value += f" ({peak / spec.peak_flops:.0%} and {bandwidth / spec.peak_bandwidth:.0%} of {spec.name}'s)"
    return Row("ceilings vs spec sheet", value, "measured <= spec x 1.05 (a datasheet is a ceiling)",
               peak <= 1.05 * spec.peak_flops and bandwidth <= 1.05 * spec.peak_bandwidth, figures=figures)


def host_link() -> Row:
    """The host link, measured (a pinned round trip), against the card's datasheet."""
    import torch

    from labkit.instruments.roofline import measure_host_bandwidth

    measured, spec = measure_host_bandwidth("cuda"), spec_for(torch.cuda.get_device_name())
    value = f"{measured / 1e9:.3g} GB/s each way (pinned, on the current stream)"
    if spec is None or not spec.host_bandwidth:
        return Row("offload: host link", value, "no spec sheet: reported only", True, figures={"bytes_per_s": measured})
    return Row("offload: host link", value + f" ({measured / spec.host_bandwidth:.0%} of {spec.name}'s)",
               "measured <= spec x 1.1", measured <= 1.1 * spec.host_bandwidth, figures={"bytes_per_s": measured})


# Run in each lab's kernel before its first cell: the allocator's peaks (allocated, reserved) of every cell,
# reset after it. A meter inside a cell resets the peaks on entry: the reset is wrapped to keep what it drops.
_RECORD = """
import torch as _t
_cell_peaks, _dropped, _reset = [], [0, 0], _t.cuda.reset_peak_memory_stats
def _peaks():
    return _t.cuda.max_memory_allocated(), _t.cuda.max_memory_reserved()
def _keeping_reset(*args, **kwargs):
    if _t.cuda.is_initialized():
        _dropped[:] = [max(a, b) for a, b in zip(_dropped, _peaks())]
    _reset(*args, **kwargs)
_t.cuda.reset_peak_memory_stats = _keeping_reset
def _record(result):
    if _t.cuda.is_initialized():
        peak = [max(a, b) for a, b in zip(_dropped, _peaks())]
        _cell_peaks.append((*peak, (result.info.raw_cell or "").strip()[:60]))
        _dropped[:] = [0, 0]
        _reset()
get_ipython().events.register("post_run_cell", _record)
"""
# ... and after its last: one JSON line with the measured peaks and the prediction.
_REPORT = """
import json, os
from labkit.env.profile import gpu_choice as _choice
print("LABKIT-PEAK " + json.dumps({"allocated": max([p[0] for p in _cell_peaks], default=0),
      "reserved": max([p[1] for p in _cell_peaks], default=0), "top": sorted(_cell_peaks, reverse=True)[:3],
      "predicted": _choice().labs, "scale": _choice().scale,
      "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}))
"""


def lab(number: str) -> Callable[[], Row]:
    """A row running lab `number`'s solution whole on the gpu profile, as a student on this card would: its Run
    All seconds, its allocator's allocated and reserved peaks against the prediction (labkit.env.sizing)."""
    def run() -> Row:
        figures, seconds = _run_lab(number)
        memory = variables.read(variables.GPU_MEMORY) or "the card"
        allocated, reserved = figures["allocated"], figures["reserved"]
        predicted = figures["predicted"].get(number)  # sizing's lab_peaks, keyed "01".."07"
        gib = 2**30
        value = (f"Run All {seconds:.0f} s; allocated {allocated / gib:.2f} GiB, reserved {reserved / gib:.2f}"
                 + (f" (x{reserved / allocated:.2f})" if allocated else ""))
        figures = {"run_all_seconds": round(seconds, 1), "allocated": allocated, "reserved": reserved,
                   "predicted": predicted, "scale": figures["scale"], "alloc_conf": figures["alloc_conf"],
                   "top": figures["top"]}
        if predicted is None:  # lab 00 puts nothing on the device that sizing plans for
            return Row(f"lab {number} on {memory}", value + "; no prediction (sizes nothing)", "runs", True,
                       figures=figures)
        value += f"; predicted {predicted / gib:.2f} GiB allocated ({allocated / predicted:.0%})"
        return Row(f"lab {number} on {memory} (x{figures['scale']})", value,
                   f"allocated <= predicted, reserved <= predicted x {RESERVE_FACTOR}",
                   allocated <= predicted and reserved <= RESERVE_FACTOR * predicted, figures=figures)

    return run


def _run_lab(number: str) -> tuple[dict[str, Any], float]:
    """Execute lab `number`'s solution in a fresh kernel with the recording cells around it."""
    import nbformat
    from nbclient import NotebookClient

    from labkit.course.catalog import LABS

    path = next(entry for entry in LABS if entry.number == number).solution(ROOT)
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(_RECORD))
    nb.cells.append(nbformat.v4.new_code_cell(_REPORT))
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    return json.loads(text.split("LABKIT-PEAK ", 1)[1]), seconds


def _plan_ok(f: dict) -> bool:
    """The plan fits as predicted, and no foreign model failed (foreign_figures makes a failure a row)."""
    foreign = f.get("foreign")
    failed = isinstance(foreign, dict) and any("error" in row for row in foreign.values())
    return (f["measured_peak"] <= f["budget_bytes"] and not f["fits"]["none"] and not failed
            and abs(f["predicted_peak"] - f["measured_peak"]) <= 0.25 * f["measured_peak"])


def _roofline_ok(f: dict) -> bool:
    """The bench's own bar held, over at least one op (bar_holds is false when it checked none)."""
    return f["bar_holds"] and f["ops_checked"] > 0


# key -> (how to measure it, its time limit in seconds), in order of importance: a run cut short loses the last.
# time is reported, not judged: a ratio of timings on a shared machine is no pass/fail bar
ROWS: dict[str, tuple[Callable[[], Row], float]] = {
    "meter": (meter_vs_allocator, 60),
    "ceilings": (ceilings_vs_spec, 60),
    "host-link": (host_link, 30),
    # the roofline bound holds from below: no op may beat its prediction by 2x; slower ops are reported
    "roofline": (bench("roofline", "bench roofline (gpu profile)",
                       "every op priced: measured >= predicted / 2, at least one", _roofline_ok), 90),
    "recompute": (bench("recompute", "bench recompute (gpu profile)", "peak/torch <= 1.02, peak/none <= 0.5, bitwise",
                        lambda f: f["peak_ratio_vs_torch"] <= 1.02 and f["peak_ratio_vs_none"] <= 0.5
                        and f["grads_bitwise_equal"]), 90),
    "policies": (bench("policies", "bench policies (gpu profile)",
                       "selective cuts >= 2.5x, yours == PyTorch's bytes, bitwise",
                       lambda f: f["selective_bytes_cut"] >= 2.5 and all(
                           p["activation_bytes"] == p["bytes_torch"] and p["grads_equal_ours"] and p["grads_equal_torch"]
                           for p in f["policies"])), 90),
    # every lab as a student on this card runs it: what a hub's student meets
    **{f"lab{n}": (lab(n), limit) for n, limit in (("00", 60), ("01", 90), ("02", 120), ("03", 150), ("04", 150),
                                                    ("05", 90), ("06", 90), ("07", 180))},
    "gpu-tests": (gpu_tests, 120),
    "formula": (bench("formula", "bench formula (CPU configs)", "max_rel_error <= 0.15",
                      lambda f: f["max_rel_error"] <= 0.15), 60),
    # the planner's plan fits the budget the bench sets, as predicted, beside PyTorch's planners and two models
    # from transformers: many minutes on a GPU (Inductor's compiles), so only asked for (--only plan)
    "plan": (bench("plan", "bench plan (gpu profile)", "measured peak <= budget, predicted within 25%, none over",
                   _plan_ok), 600),
}
DEFAULT = tuple(key for key in ROWS if key != "plan")


def measure(key: str) -> Row:
    """Row `key`, measured here; a crash is the row's value."""
    check, _ = ROWS[key]
    start = time.perf_counter()
    try:
        row = check()
    except Exception as e:  # noqa: BLE001 - a broken check is a failed row, and the table still prints
        print(f"gpu-check {key} failed: {type(e).__name__}: {str(e)[-3000:]}", flush=True)
        row = Row(key, f"{type(e).__name__}: {e}"[:300], "runs", False)
    row.seconds = round(time.perf_counter() - start, 1)
    return row


if __name__ == "__main__":
    key, out = sys.argv[1], Path(sys.argv[2])
    out.write_text(json.dumps(asdict(measure(key))))
