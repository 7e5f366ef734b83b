"""tools/lab_peaks.py runs a notebook once more, in a new kernel, when a cell gets no reply in its time (a kernel
seen idle, its cell done, while nbclient waited on: make long-test hung an hour on it), and only once
(labkit.course.notebook.run_once_more_on_timeout)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError

from labkit.course import notebook

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lab_peaks", ROOT / "tools" / "lab_peaks.py")
lab_peaks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_peaks)
FOUND = {"rows": [[1024, "x = 1"]], "predicted": {}, "parts": {}}


def _client(lost: int, seen: list):
    """A NotebookClient whose first `lost` runs time out; the others print the report the last cell prints."""
    class Client:
        def __init__(self, nb, timeout, **kwargs):
            self.nb, self.timeout = nb, timeout

        def execute(self):
            seen.append(self.timeout)
            if len(seen) <= lost:
                raise CellTimeoutError("A cell timed out while it was being executed, after 600 seconds.")
            self.nb.cells[-1].outputs = [nbformat.v4.new_output("stream", text="LAB-PEAKS " + json.dumps(FOUND))]
    return Client


def test_a_cell_without_a_reply_runs_the_notebook_once_more_saying_so(tmp_path, monkeypatch, capsys):
    nb = tmp_path / "01_x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), nb)
    seen: list = []
    monkeypatch.setattr(notebook, "NotebookClient", _client(1, seen))
    assert lab_peaks.peaks(nb) == FOUND and seen == [600, 600]
    assert "01_x.ipynb: no reply from a cell in 600 s" in capsys.readouterr().err
    seen.clear()
    monkeypatch.setattr(notebook, "NotebookClient", _client(2, seen))
    with pytest.raises(CellTimeoutError):  # twice: the lab's own, reported
        lab_peaks.peaks(nb)
    assert seen == [600, 600]
