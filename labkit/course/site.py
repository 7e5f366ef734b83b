"""`make site`: the executed solutions as a static reading site (site/index.html first), built with nbconvert.

One HTML page per solution notebook, its figures embedded (nbconvert writes a
notebook's image outputs into the page as data URIs), a line of links to the
index and the labs before and after it at the top and the bottom, and an
index page in lab order with one line per lab: its title and the first
sentence of its introduction. The index is itself a notebook of markdown
cells, converted by the same exporter, so every page looks alike. Nothing
needs Python to read it, nor the network: the template (site_template/)
loads no script from elsewhere. What is for the kit's tests and generator,
not the reader, is dropped from the code shown (`# NBVAL_*` lines, the
solution markers), progress bars frozen at their first frame are left out,
and a widget, which needs a kernel, shows a note instead of its repr.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from labkit.course.catalog import LABS
from labkit.stubs import BEGIN, END

TEMPLATE = Path(__file__).resolve().parent / "site_template"
WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_REPR = re.compile(r"^(VBox|HBox|GridBox|Tab|Accordion|interactive|\w+(Slider|Dropdown|Button))\(children=|"
                         r"^\w+(Slider|Dropdown|Button)\(")  # an ipywidget's repr: what a page cannot run
PROGRESS = re.compile(r"^[^\n]*\d+%\|[^\n]*\| *\d+/\d+ \[\d+:\d+<[^\n]*(it/s|s/it)\]\s*$")  # tqdm's one line
WIDGET_NOTE = "(an interactive widget: open the notebook in JupyterLab and run it to use it)"

TITLE = re.compile(r"^#\s+(.+?)\s*$", re.M)
INDEX_TITLE = "Activation checkpointing, hands on: the solved labs"


def _title(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The notebook's first `# ` heading."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            found = TITLE.search(cell.source)
            if found:
                return found.group(1)
    return fallback


def _nav(pages: list[tuple[str, str]], index: int) -> str:
    """Markdown: index, previous and next lab."""
    links = ["[all labs](index.html)"]
    if index > 0:
        links.append(f"previous: [{pages[index - 1][1]}]({pages[index - 1][0]})")
    if index + 1 < len(pages):
        links.append(f"next: [{pages[index + 1][1]}]({pages[index + 1][0]})")
    return " · ".join(links)


def _local_links(source: str) -> str:
    """Markdown links to another notebook of the kit point at its page: (02_recompute.ipynb) -> (02_recompute.html)."""
    return re.sub(r"\]\((?!https?:)([^)\s]*?)\.ipynb(#[^)]*)?\)", lambda m: f"]({Path(m.group(1)).name}.html"
                  f"{m.group(2) or ''})", source)


def _for_reading(cell: nbformat.NotebookNode) -> None:
    """A code cell as the reader sees it: without the test and generator markers, its widgets a note."""
    if cell.cell_type != "code":
        return
    cell.source = "\n".join(line for line in cell.source.splitlines()
                             if not line.lstrip().startswith("# NBVAL_") and BEGIN not in line and END not in line)
    outputs = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        text = data.get("text/plain", "")
        text = text if isinstance(text, str) else "".join(text)
        if set(data) <= {"text/plain", WIDGET} and PROGRESS.match(text):
            continue  # a progress bar (a widget, saved as its first frame)
        if WIDGET in data or (set(data) == {"text/plain"} and WIDGET_REPR.match(text)):
            outputs.append(nbformat.v4.new_output("stream", name="stdout", text=WIDGET_NOTE + "\n"))
            continue
        outputs.append(output)
    cell.outputs = outputs


HEADING = re.compile(r"^#{1,3}\s+(.+?)\s*$", re.M)


def _alt_text(cell: nbformat.NotebookNode, lab: str, section: str) -> None:
    """Give each figure of a code cell alt text: what drew it (the cell's last line, a call of lk.plots or
    lk.widgets, or the name it shows) and the section of the lab it is in."""
    if cell.cell_type != "code":
        return
    lines = [l.strip() for l in cell.source.splitlines() if l.strip() and not l.strip().startswith("#")]
    drawn = lines[-1] if lines else "a figure"
    for output in cell.get("outputs", []):
        if "image/png" in output.get("data", {}):
            meta = output.setdefault("metadata", {}).setdefault("image/png", {})
            meta["alt"] = f"Figure of {lab}, section \"{section}\": {drawn[:160]}"


def build(solutions: Path, out: Path) -> list[Path]:
    """Write the site of every lab of the catalog, from its solution in `solutions`, into `out`; the pages
    written, index first."""
    notebooks = [solutions / lab.notebook for lab in LABS]
    missing = [p.name for p in notebooks if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{solutions}: no {', '.join(missing)} to build the site from")
    read = [nbformat.read(path, as_version=4) for path in notebooks]
    pages = [(f"{path.stem}.html", _title(nb, path.stem)) for path, nb in zip(notebooks, read)]
    exporter = HTMLExporter(template_name="lab", extra_template_paths=[str(TEMPLATE)],
                            template_file="offline.html.j2")
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"* [{title}]({page}): {lab.builds}" for (page, title), lab in zip(pages, LABS)]
    index = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        f"# {INDEX_TITLE}\n\nEach lab as its solution notebook, executed on the `cpu` profile, with its "
        "outputs and figures. Read them beside the lessons; the exercises are in `notebooks/`.\n\n"
        + "\n".join(lines))])
    written = [out / "index.html"]
    written[0].write_text(exporter.from_notebook_node(index, resources={"metadata": {"name": INDEX_TITLE}})[0])
    for i, (nb, (page, title)) in enumerate(zip(read, pages)):
        section = title
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = _local_links(cell.source)
                section = ([m.group(1) for m in HEADING.finditer(cell.source)] or [section])[-1]
            _for_reading(cell)
            _alt_text(cell, title, section)
        nav = _nav(pages, i)
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(nav))
        nb.cells.append(nbformat.v4.new_markdown_cell(nav))
        html, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
        written.append(out / page)
        written[-1].write_text(html)
    return written
