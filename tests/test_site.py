"""`make site`: an index in lab order, one page per solution, every figure embedded, every link resolving."""
from __future__ import annotations

import html
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from labkit.course.catalog import LABS

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = [lab.solution(ROOT) for lab in LABS]

pytestmark = pytest.mark.slow


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.images: list[str] = []
        self.alts: list[str | None] = []

    def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
        found = dict(attrs)
        if tag == "a" and found.get("href"):
            self.hrefs.append(found["href"])
        if tag == "img" and found.get("src"):
            self.images.append(found["src"])
            self.alts.append(found.get("alt"))


def _parsed(page: Path) -> _Links:
    links = _Links()
    links.feed(page.read_text())
    return links


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(["make", "-s", "site", f"SITE={out}"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return out


def test_the_index_lists_every_lab_in_order_one_line_each(site):
    index = _parsed(site / "index.html")
    pages = [h for h in index.hrefs if h.endswith(".html")]
    assert pages == [f"{p.stem}.html" for p in SOLUTIONS]
    items = re.findall(r"<li>(.*?)</li>", (site / "index.html").read_text(), re.S)
    assert len(items) == len(SOLUTIONS) and all("\n" not in item.strip() for item in items)


def test_each_index_line_says_what_its_own_lab_builds(site):
    """The index's line of a lab is the catalog's sentence of what that lab builds: never empty, never a recap of
    the lab before it (a notebook's opening sentence often is: lab 03 opens "Lab 02 checkpointed one block.")."""
    items = re.findall(r"<li>(.*?)</li>", (site / "index.html").read_text(), re.S)
    for lab, item in zip(LABS, items):
        assert lab.builds and html.escape(lab.builds, quote=False) in item, (lab.number, item)
        assert not re.match(r"(Labs?|In lab) \d", lab.builds), f"lab {lab.number}'s line recaps another lab"
    assert len({lab.builds for lab in LABS}) == len(LABS)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_every_figure_of_a_solution_is_embedded_in_its_page(site, solution):
    nb = nbformat.read(solution, as_version=4)
    figures = [o["data"]["image/png"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if "image/png" in o.get("data", {})]
    page = _parsed(site / f"{solution.stem}.html")
    embedded = [src for src in page.images if src.startswith("data:image/png")]
    assert len(embedded) == len(figures)
    # each with alt text naming its lab, its section and what drew it
    alts = [a for src, a in zip(page.images, page.alts) if src.startswith("data:image/png")]
    assert all(a and a.startswith("Figure of ") and "section" in a and len(a) > 30 for a in alts), alts
    assert all(f.strip().replace("\n", "")[:200] in "".join(embedded).replace("\n", "") for f in figures)


def test_every_link_between_pages_resolves_and_each_lab_links_its_neighbours(site):
    for page in site.glob("*.html"):
        for href in _parsed(page).hrefs:
            if href.startswith(("http:", "https:", "#", "mailto:")):
                continue
            target = site / href.split("#")[0]
            assert target.is_file(), f"{page.name} links to {href}, which is not in the site"
    for before, after in zip(SOLUTIONS, SOLUTIONS[1:]):
        assert f"{after.stem}.html" in _parsed(site / f"{before.stem}.html").hrefs
        assert f"{before.stem}.html" in _parsed(site / f"{after.stem}.html").hrefs


class _Fetched(HTMLParser):
    """Every script, stylesheet, image or frame a page would fetch, and its text outside scripts and styles."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[str] = []
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
        found = dict(attrs)
        if tag in ("script", "img", "iframe") and found.get("src"):
            self.fetched.append(found["src"])
        if tag == "link" and found.get("href"):
            self.fetched.append(found["href"])
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):  # type: ignore[no-untyped-def]
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):  # type: ignore[no-untyped-def]
        if not self._skip:
            self.text.append(data)


def test_every_page_reads_offline_and_shows_nothing_meant_for_the_tests_or_a_kernel(site):
    """No script, stylesheet or image from elsewhere (a firewalled classroom's page would wait on it); no nbval
    marker, solution marker, frozen progress bar or widget repr in what the reader sees."""
    for page in sorted(site.glob("*.html")):
        parsed = _Fetched()
        parsed.feed(page.read_text())
        outside = [u for u in parsed.fetched if re.match(r"(https?:)?//", u)]
        assert not outside, (page.name, outside)
        assert "await import(" not in page.read_text(), page.name  # no module loaded from a CDN either
        text = "".join(parsed.text)
        for leftover in ("NBVAL_", "BEGIN SOLUTION", "END SOLUTION", "VBox(children", "it/s]"):
            assert leftover not in text, (page.name, leftover)
    assert "run it to use it" in (site / "03_sqrt_n.html").read_text()  # lab 03's explorer, as a note
