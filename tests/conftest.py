"""Fixtures of the browser tests (test_browser.py, test_browser_students.py): a served copy of the notebooks
with two planted faults, and JupyterLab in Chromium, once per test file (tests/helpers/jupyter_browser.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.jupyter_browser import Browser, JupyterLab

ROOT = Path(__file__).resolve().parent.parent

RAISES = 'print("before")\nraise ValueError("planted in a browser test")'
NO_SUCH_MODULE = '''import ipywidgets as w
from traitlets import Unicode

class Missing(w.DOMWidget):
    _model_module = Unicode("labkit-no-such-module").tag(sync=True)
    _view_module = Unicode("labkit-no-such-module").tag(sync=True)
    _model_name = Unicode("MissingModel").tag(sync=True)
    _view_name = Unicode("MissingView").tag(sync=True)

Missing()'''


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """A copy of the notebooks (JupyterLab never writes into the repository), with two planted faults."""
    root = tmp_path_factory.mktemp("served")
    for folder in ("solutions", "notebooks"):
        shutil.copytree(ROOT / folder, root / folder)
    planted = root / "planted"
    planted.mkdir()
    for name, source in (("raises.ipynb", RAISES), ("missing_widget.ipynb", NO_SUCH_MODULE)):
        nb = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell(source), new_code_cell("y = 2")])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, planted / name)
    return root


@pytest.fixture(scope="module")
def browser(kit, tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser")
    lab = JupyterLab.start(kit, folder)
    try:
        chromium = Browser(folder)
        try:
            chromium.open_lab(lab)
            yield chromium
        finally:
            chromium.close()
    finally:
        lab.stop()
        assert lab.process.poll() is not None, "JupyterLab still runs after stop()"


