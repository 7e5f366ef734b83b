"""Each lab's peak of live tensor bytes, measured on the CPU, against labkit.env.sizing's prediction.

    .venv/bin/python tools/lab_peaks.py solutions/04_selective.ipynb [--scale K]

Runs the solution notebook in a kernel with one MemoryMeter entered before its first cell (the meter counts
every storage, also those a reference cycle keeps for the garbage collector), and prints the cells with the
highest peaks and the lab's prediction. Without --scale the notebook runs at the cpu sizes; with it, at the gpu
profile's shapes times K, moved to the CPU (slow: minutes). `python -m labkit gpu-check` measures the same on a
GPU with the allocator. Run it after changing what a lab keeps alive; exit 1 when the peak is over the prediction.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat

from labkit.course.notebook import run_once_more_on_timeout

SETUP = """
import importlib
from dataclasses import replace
import labkit
from labkit.env import sizing as _z
_profile = importlib.import_module("labkit.env.profile")
_size = replace(_z.scaled({scale}), device="cpu") if {scale} else _profile.sizes({profile!r})
labkit.sizes = _profile.sizes = lambda name=None: _size
_meter = labkit.MemoryMeter(history=True)
_meter.__enter__()
_marks = []
get_ipython().events.register("post_run_cell", lambda r: _marks.append((len(_meter.timeline), (r.info.raw_cell or "").strip()[:70])))
"""
REPORT = """
import json
_rows, _start = [], 0
for _end, _src in _marks:
    _rows.append((max([e.live_bytes for e in _meter.timeline[_start:_end]], default=0), _src))
    _start = _end
print("LAB-PEAKS " + json.dumps({"rows": _rows, "predicted": _z.lab_peaks(_size), "parts": _z.lab_branches(_size)}))
"""


def peaks(notebook: Path, scale: int = 0, profile: str = "cpu", cell_seconds: float | None = None) -> dict:
    """{"rows": [(peak bytes, cell source), ...], "predicted": lab_peaks(...), "parts": lab_branches(...)} of
    `notebook` run under the meter. A cell without a reply in `cell_seconds` (default: 600 at the cpu sizes, an hour
    at --scale) runs the notebook once more in a new kernel, saying so (labkit.course.notebook's
    run_once_more_on_timeout)."""
    def build() -> nbformat.NotebookNode:
        nb = nbformat.read(notebook, as_version=4)
        setup = SETUP.format(scale=scale, profile=profile)
        nb.cells = [nbformat.v4.new_code_cell(setup), *nb.cells, nbformat.v4.new_code_cell(REPORT)]
        return nb

    nb = run_once_more_on_timeout(build, notebook.resolve().parent, cell_seconds or (3600 if scale else 600),
                                  f"lab_peaks: {notebook.name}")
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    return json.loads(text.split("LAB-PEAKS ", 1)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--scale", type=int, default=0, help="gpu shapes times this, on the CPU (default: cpu sizes)")
    parser.add_argument("--profile", default="cpu", choices=("cpu", "tiny"), help="the sizes without --scale")
    args = parser.parse_args()
    found = peaks(args.notebook, args.scale, args.profile)
    lab = args.notebook.name[:2]
    for peak, source in sorted(found["rows"], reverse=True)[:5]:
        print(f"{peak / 2**20:10.1f} MiB  {source!r}")
    measured, predicted = max(p for p, _ in found["rows"]), found["predicted"].get(lab)
    if predicted is None:
        print(f"lab {lab}: peak {measured / 2**20:.1f} MiB; labkit.env.sizing predicts no peak for it")
        return 0
    print(f"lab {lab}: peak {measured / 2**20:.1f} MiB, predicted {predicted / 2**20:.1f} MiB "
          f"({measured / predicted:.0%} of the prediction)")
    return 0 if measured <= predicted else 1


if __name__ == "__main__":
    sys.exit(main())
