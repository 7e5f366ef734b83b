"""Executing notebooks in place (for `make solutions`), quietly: see docs/design.md, "Quiet diffs"."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def execute(path: Path, timeout: int = 600, out: Path | None = None) -> float:
    """Run every cell of notebook `path` in its folder and save it with outputs (to `out`, else in place); seconds."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such notebook")
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False, coalesce_streams=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)  # widget models, with random ids: a saved copy cannot run them anyway
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps from an earlier, noisier execution
        for output in cell.get("outputs", []):
            # a widget needs a live kernel: a saved copy keeps its text, not a view of a model it cannot load
            output.get("data", {}).pop(WIDGET_VIEW, None)
    nbformat.write(nb, out or path)
    return time.perf_counter() - start


def run_once_more_on_timeout(build: Callable[[], nbformat.NotebookNode], folder: Path, timeout: float,
                             label: str) -> nbformat.NotebookNode:
    """The notebook `build()` makes, run in a new kernel in `folder`; where a cell gets no reply in `timeout`
    seconds, a fresh `build()` runs once more in another kernel, saying so (on stderr, after `label`), and a second
    timeout is raised. make long-test saw a kernel idle, lab 05's widget cell (roofline_explorer) done, while
    nbclient waited on for a reply it never got (ipykernel 7.4, nbclient 0.11; jupyter/nbclient#312 reports widget
    cells blocking so): tools/lab_peaks.py and tests/test_autocast_labs.py run the labs through this."""
    for attempt in (1, 2):
        nb = build()
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(folder)}}).execute()  # the kernel inherits os.environ
            return nb
        except CellTimeoutError as e:
            if attempt == 2:
                raise
            print(f"{label}: no reply from a cell in {timeout:g} s ({str(e)[:200]}); running the notebook again in "
                  "a new kernel", file=sys.stderr)
    raise AssertionError("unreachable")
