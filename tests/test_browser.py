"""Every solution notebook in JupyterLab in a real browser (Debian's Chromium driven by Playwright), marker
`browser`; the student notebooks, the reading site and planted faults are in test_browser_students.py (a file
each, so that two test workers run them side by side).

A copy of the kit's notebooks is served by JupyterLab from this venv (kernels on the `tiny` profile; the
fixtures are in conftest.py). Each solution notebook runs all its cells: no error, every widget rendered, every
figure an image, and a screenshot of the whole notebook in build/browser/; each widget explorer redraws its
figure when a slider moves. Skipped, with one line from `make test`, without Chromium.
"""
from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest

from helpers.jupyter_browser import BROWSER_MARKS, Browser, problems
from labkit.course.catalog import LABS

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = [lab.solution(ROOT) for lab in LABS]
SHOTS = ROOT / "build" / "browser"

pytestmark = BROWSER_MARKS


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


def test_the_screenshots_are_whole_notebooks():
    from PIL import Image

    shots = {p.stem: p for p in SHOTS.glob("*.png")}
    for solution in SOLUTIONS:
        assert solution.stem in shots, f"no screenshot of {solution.name}"
        with Image.open(shots[solution.stem]) as im:
            assert im.height > 900, f"{solution.name}: the screenshot is one screen, not the notebook"
