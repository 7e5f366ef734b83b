"""A class of hub homes in the states an instructor meets (issue 51), and the gradebook they must give: a full clone
of the kit that did nothing, a finished lab, an untouched lab renamed, work under JupyterLab's duplicate name beside
a link out of the home, an empty home; and the instructor's own home. Lab 02 throughout
(tests/test_collect.py's run of the docs' commands, tests/test_hub.py's booted hub)."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import nbformat

from labkit.course.grade import bench

ROOT = Path(__file__).resolve().parents[2]
LAB = "02"
NOTEBOOK = "02_recompute.ipynb"
EXERCISES = ("2.1", "2.2", "2.3", "2.4", "2.5")
HANDOUT = Path("labkit-handout") / "notebooks"  # where the README's nbgitpuller link puts a bundle's notebooks
DUPLICATE = "02_recompute-Copy1.ipynb"  # JupyterLab's Duplicate
RENAMED = "my lab 2.ipynb"
# every student's verdict per exercise, and their total
EXPECTED = {"carol": dict.fromkeys(EXERCISES, "not attempted"),  # her clone's own view, untouched; never solutions/
            "dana": dict.fromkeys(EXERCISES, "passed"),  # the bundle, lab 02 finished
            "erin": dict.fromkeys(EXERCISES, "not attempted"),  # the bundle, lab 02 renamed and never written
            "fay": {"2.1": "passed", **dict.fromkeys(EXERCISES[1:], "not attempted")},  # 2.1 in the duplicate
            "gil": dict.fromkeys(EXERCISES, "missing")}  # nothing in his home
TOTALS = {name: sum(v == "passed" for v in verdicts.values()) for name, verdicts in EXPECTED.items()}


def answered(exercises: tuple[str, ...]) -> str:
    """Lab 02's student view with the solution's answers to `exercises`, its cells' marks kept, as JupyterLab
    saves a notebook a student wrote them into."""
    return nbformat.writes(bench.answered(LAB, set(exercises), ROOT))


def answer_sources(exercises: tuple[str, ...]) -> dict[str, str]:
    """{cell id: the solution's source} of the answer cells of `exercises`: what a student types into them."""
    view = nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4)
    mine = {c.id: c.source for c in bench.answered(LAB, set(exercises), ROOT).cells}
    return {c.id: mine[c.id] for c in view.cells if mine[c.id] != c.source}


def clone(home: Path) -> Path:
    """A clone of the whole kit in `home` (its notebooks/ and solutions/, every lab), touched by nothing since."""
    kit = home / "labkit"
    for folder in ("notebooks", "solutions"):
        shutil.copytree(ROOT / folder, kit / folder)
    return kit


def make_homes(homes: Path, instructor: str = "instructor") -> Path:
    """The five students' homes and the instructor's (a clone of the kit in it, her gradebook's place), below
    `homes`; returns her home."""
    clone(homes / "carol")
    for name in ("dana", "erin", "fay"):
        (homes / name / HANDOUT).mkdir(parents=True)
    (homes / "dana" / HANDOUT / NOTEBOOK).write_text(answered(EXERCISES))
    (homes / "erin" / HANDOUT / RENAMED).write_text((ROOT / "notebooks" / NOTEBOOK).read_text())
    (homes / "fay" / HANDOUT / DUPLICATE).write_text(answered(("2.1",)))
    (homes / "fay" / HANDOUT / NOTEBOOK).symlink_to(ROOT / "solutions" / NOTEBOOK)  # out of her home
    (homes / "gil").mkdir(parents=True)
    mine = homes / instructor
    clone(mine)
    (mine / "labkit" / "notebooks" / DUPLICATE).write_text(answered(EXERCISES))  # her own tries: never a student's
    return mine


def problems(book: Path, collected: str) -> list[str]:
    """What the gradebook `book` (CSV, with its _students.csv beside it) and collect's report `collected` get
    wrong against EXPECTED: every student a row, each verdict, each total, no row for the instructor."""
    found = []
    with book.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    got = {}
    for r in rows:
        got.setdefault(r["student"], {})[r["exercise"]] = r["status"]
    if got != EXPECTED:
        found.append(f"verdicts {json.dumps(got)}, expected {json.dumps(EXPECTED)}")
    with book.with_name(f"{book.stem}_students.csv").open(newline="", encoding="utf-8") as f:
        totals = {r["student"]: float(r["total"]) for r in csv.DictReader(f)}
    if totals != TOTALS:
        found.append(f"totals {totals}, expected {TOTALS}")
    gil = next((r["message"] for r in rows if r["student"] == "gil"), "")
    if "no notebook of Lab 02 found below" not in gil:
        found.append(f"gil's missing row says {gil!r}, not why")
    lines = {line.split(" ")[2]: line for line in collected.splitlines() if line.startswith("labkit collect: ")
             and not line.startswith("labkit collect: left out")}
    if "the kit's solution notebook" not in lines.get("carol", ""):
        found.append(f"collect did not name carol's solutions: {lines.get('carol')!r}")
    if DUPLICATE not in lines.get("fay", "") or "a link out of the home" not in lines.get("fay", ""):
        found.append(f"collect did not say fay's duplicate was taken and her link refused: {lines.get('fay')!r}")
    if "your own home ($HOME)" not in collected:
        found.append("collect did not say it left the instructor's own home out")
    return found
