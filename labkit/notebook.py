"""Executing notebooks in place (for `make solutions`)."""
from __future__ import annotations

import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout: int = 600) -> float:
    """Run every cell of notebook `path` in its folder and save it with outputs; returns seconds."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such notebook")
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - start
