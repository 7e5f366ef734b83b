"""Executing notebooks in place (for `make solutions`), quietly: see docs/design.md, "Quiet diffs"."""
from __future__ import annotations

import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

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
