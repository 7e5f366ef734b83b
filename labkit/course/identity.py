"""What a notebook is, told by what the kit writes into it: a lab's student view, the kit's solution, or neither.

The generator (student.py) marks every cell of a student view with `metadata.labkit.generated`, a digest of the
source it wrote, and the release bundle writes the same views; a solution carries the answer markers
(`### BEGIN SOLUTION`) and none of those marks. The marks travel with the cells, so they survive what students do
to a notebook: JupyterLab keeps a cell's metadata when it saves (an edited cell keeps its mark, which then no
longer matches its source: that is how an edit shows), its Duplicate and Rename copy or move the file whole, and
nbgitpuller's merge keeps the student's file where both sides changed it (tests/test_hub.py does all four in a
booted hub). Nothing is written for this: the views as generated today already say it.

Which lab: the digests of a notebook's marks and of its cells' sources, against each lab's student view, counting
only the digests no other lab's view has (every lab shares its setup cell). A lab is named when at least
``LEAST_SHARE`` of its own digests are found: a view keeps all of its marks however much is edited, a solution
shares its prose and its code outside the answers, and a view handed out by an older kit shares what has not
changed since.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labkit.course import student
from labkit.course.catalog import LABS
from labkit.stubs import BEGIN

__all__ = ["LEAST_SHARE", "Identity", "identify", "signatures"]

LEAST_SHARE = 0.25  # of a lab's own digests, found in a notebook, for it to be that lab's


@dataclass(frozen=True)
class Identity:
    """What one notebook is."""

    lab: str  # "02", or "" when no lab's student view shares enough of it
    kind: str  # "view" (a cell carries the generator's mark), "solution" (answer markers, no mark), "other"
    edited: int = 0  # cells of a view changed or added since generated (0: untouched)


def _cells(nb: object) -> list[dict]:
    """The cells of a notebook parsed from a file nobody checked: only the dicts of a list."""
    cells = nb.get("cells") if isinstance(nb, dict) else None
    return [c for c in cells if isinstance(c, dict)] if isinstance(cells, list) else []


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    if isinstance(source, list):
        return "".join(s for s in source if isinstance(s, str))
    return source if isinstance(source, str) else ""


def _mark(cell: dict) -> str | None:
    """The generator's digest on a cell, or None."""
    meta = cell.get("metadata")
    kit = meta.get("labkit") if isinstance(meta, dict) else None
    mark = kit.get("generated") if isinstance(kit, dict) else None
    return mark if isinstance(mark, str) else None


def _digests(path: Path) -> set[str]:
    """Every mark the student view at `path` carries."""
    return {m for m in map(_mark, _cells(json.loads(path.read_text(encoding="utf-8")))) if m}


def signatures(root: Path) -> dict[str, frozenset[str]]:
    """Each lab's own digests (those of its student view no other lab's view has), for the labs of the kit at
    `root` that have a student view or a solution."""
    every: dict[str, set[str]] = {}
    for lab in LABS:
        view, solution = lab.student(root), lab.solution(root)
        if view.is_file():
            every[lab.number] = _digests(view)
        elif solution.is_file():
            made = student.student_view(student.read(solution), f"solutions/{solution.name}")
            every[lab.number] = {c.metadata["labkit"]["generated"] for c in made.cells}
    return {lab: frozenset(d - set().union(*(o for n, o in every.items() if n != lab))) for lab, d in every.items()}


def identify(data: bytes, signs: dict[str, frozenset[str]]) -> Identity:
    """What the notebook in `data` (a file's bytes, from anyone) is; a file that is not a notebook is "other"."""
    try:
        cells = _cells(json.loads(data.decode("utf-8", "replace")))
    except (ValueError, RecursionError):  # not JSON, or nested past what the parser takes
        return Identity("", "other")
    marks = [(_mark(c), _source(c)) for c in cells]
    found = {m for m, _ in marks if m} | {student.generated_digest(s) for _, s in marks}
    shares = {lab: len(own & found) / len(own) for lab, own in signs.items() if own}
    best = max(shares, key=shares.get, default="")
    lab = best if best and shares[best] >= LEAST_SHARE else ""
    if any(m for m, _ in marks):
        return Identity(lab, "view", sum(1 for m, s in marks if m != student.generated_digest(s)))
    solution = any(line.strip() == BEGIN for c in cells if c.get("cell_type") == "code"
                   for line in _source(c).splitlines())
    return Identity(lab, "solution" if solution else "other")
