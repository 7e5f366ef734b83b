"""The student notebooks, the reading site and two planted faults in JupyterLab in Chromium, marker `browser`
(the solutions are in test_browser.py; the fixtures in conftest.py).

Each student notebook runs to its last cell with only stubs and "not attempted". The reading site's pages load
with their figures, and their links lead somewhere. Two planted faults (a cell that raises, a widget whose
frontend module does not exist) are caught and named. Skipped, with one line from `make test`, without Chromium.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest

from helpers.jupyter_browser import BROWSER_MARKS, problems
from labkit.course.catalog import LABS

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = [lab.solution(ROOT) for lab in LABS]
STUDENT = [lab.student(ROOT) for lab in LABS]

pytestmark = BROWSER_MARKS


def _figure_cells(path: Path) -> set[int]:
    """Indices of the cells whose committed outputs hold an image."""
    nb = nbformat.read(path, as_version=4)
    return {i for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and any("image/png" in o.get("data", {}) for o in c.outputs)}


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


