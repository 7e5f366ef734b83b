"""Every notebook in JupyterLab in a real browser (Debian's Chromium driven by Playwright), marker `browser`.

A copy of the kit's notebooks is served by JupyterLab from this venv (kernels on the `tiny` profile). Each
solution notebook runs all its cells: no error, every widget rendered, every figure an image, and a screenshot
of the whole notebook in build/browser/; each widget explorer redraws its figure when a slider moves. Each
student notebook runs to its last cell with only stubs and "not attempted". The reading site's pages load with
their figures, and their links lead somewhere. Two planted faults (a cell that raises, a widget whose frontend
module does not exist) are caught and named. Skipped, with one line from `make test`, without Chromium.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_browser import CHROMIUM, Browser, JupyterLab, problems

try:
    import playwright  # noqa: F401
    HAVE_PLAYWRIGHT = True
except ImportError:
    HAVE_PLAYWRIGHT = False

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
STUDENT = sorted((ROOT / "notebooks").glob("*.ipynb"))
SHOTS = ROOT / "build" / "browser"

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM, reason="Chromium is not installed (apt-get install chromium)"),
              pytest.mark.skipif(not HAVE_PLAYWRIGHT, reason="playwright is not installed (pip install -e '.[dev]')")]

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


def _figure_cells(path: Path) -> set[int]:
    """Indices of the cells whose committed outputs hold an image."""
    nb = nbformat.read(path, as_version=4)
    return {i for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and any("image/png" in o.get("data", {}) for o in c.outputs)}


def _redraws(browser: Browser, index: int) -> bool:
    """Move the first slider of cell `index` one step; True when its figure's image changed."""
    page = browser.page
    cell = page.locator(f"#{page.evaluate('() => window.labkitNotebook.id')} .jp-Cell").nth(index)
    image = cell.locator(".jp-OutputArea-output img").first
    before = image.get_attribute("src")
    handle = cell.locator(".noUi-handle").last  # the last slider: moving it redraws without changing the other
    handle.focus()
    handle.press("ArrowRight")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if cell.locator(".jp-OutputArea-output img").count() and image.get_attribute("src") != before:
            return True
        time.sleep(0.25)
    return False


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_a_solution_runs_all_and_renders_in_jupyterlab(browser, solution):
    name = f"solutions/{solution.name}"
    cells = browser.run_all(name)
    shot = browser.screenshot(SHOTS / f"{solution.stem}.png")
    assert shot.stat().st_size > 10_000
    assert not problems(name, cells), "\n".join(problems(name, cells))
    shown = {c.index for c in cells if c.shown_images}
    assert _figure_cells(solution) <= shown, f"{name}: figures expected in cells {sorted(_figure_cells(solution) - shown)}"
    for c in cells:
        if "lk.widgets." in c.source:  # a widget explorer: shown, and moving a control redraws its figure
            assert c.shown_widgets, f"{name}, cell {c.index}: the explorer's widget is not shown"
            assert _redraws(browser, c.index), f"{name}, cell {c.index}: the figure did not change with the slider"


@pytest.mark.parametrize("notebook", STUDENT, ids=[p.name for p in STUDENT])
def test_a_student_notebook_runs_to_the_end_with_only_stubs(browser, notebook):
    name = f"notebooks/{notebook.name}"
    cells = browser.run_all(name)
    assert not problems(name, cells, student=True), "\n".join(problems(name, cells, student=True))


@pytest.mark.parametrize("fixture, words", [("raises.ipynb", "cell 1: ValueError: planted in a browser test"),
                                            ("missing_widget.ipynb", "cell 1: a widget did not render")])
def test_a_planted_fault_is_caught_and_named(browser, fixture, words):
    name = f"planted/{fixture}"
    found = problems(name, browser.run_all(name))
    assert any(line.startswith(f"{name}, {words}") for line in found), found


def test_the_reading_site_loads_with_its_figures_and_links(browser, tmp_path):
    out = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "labkit", "site", str(out)], cwd=ROOT, check=True, capture_output=True)
    page = browser.page
    pages = sorted(out.glob("*.html"))
    assert len(pages) == len(SOLUTIONS) + 1
    for html in pages:
        page.goto(html.as_uri(), wait_until="domcontentloaded")
        page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=20_000)
        broken = page.evaluate("() => [...document.images].filter(i => !i.naturalWidth).length")
        assert broken == 0, f"{html.name}: {broken} images did not load"
        if html.name != "index.html":
            assert page.evaluate("() => document.images.length") >= len(_figure_cells(ROOT / "solutions" / html.with_suffix('.ipynb').name))
        for href in page.evaluate("() => [...document.links].map(a => a.href)"):
            target = urlparse(href)
            if target.scheme == "file":
                assert Path(unquote(target.path)).is_file(), f"{html.name}: link to {href} leads nowhere"
        assert page.title(), f"{html.name}: no title"


def test_the_screenshots_are_whole_notebooks():
    from PIL import Image

    shots = {p.stem: p for p in SHOTS.glob("*.png")}
    for solution in SOLUTIONS:
        assert solution.stem in shots, f"no screenshot of {solution.name}"
        with Image.open(shots[solution.stem]) as im:
            assert im.height > 900, f"{solution.name}: the screenshot is one screen, not the notebook"
