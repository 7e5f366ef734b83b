"""`python -m labkit bench grade [--json]`: the seconds to grade a generated class of Lab 02 on `tiny`, sandboxed.

A class of `count` submissions is made from Lab 02's student notebook, the answers taken from the solution by cell
id: most solve every exercise, some leave one a stub, some answer 2.1 wrongly (`submission` says which), so that
the run grades passes, failures and stubs alike. Each class is graded by `labkit.course.grade.grader.run` as
`python -m labkit grade` does (a box per submission, a judge per job slot), and timed from the call to its last row:
wall-clock seconds of one run, the figure an instructor waits for. The verdicts are counted beside the times, so a
fast run that graded wrongly shows.
"""
from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nbformat

from labkit.course.catalog import LABS
from labkit.course.grade import sandbox
from labkit.course.grade import grader
from labkit.course.grade.options import Limits, Options
from labkit.course.grade.rebuild import Pristine

ROOT = Path(__file__).resolve().parents[3]
LAB = "02"
COUNTS = (1, 10, 100)
# The exercise a generated submission leaves a stub, and those it leaves not attempted with it (the later ones built on it)
STUBBED = {"2.5": ("2.5",), "2.3": ("2.3", "2.4", "2.5")}
BUILT_ON_2_1 = ("2.2", "2.4")  # fail, naming 2.1, when 2.1 is wrong
WRONG_2_1 = ("return (None, *[x.grad for x in inputs])", "return (None, *[x.grad * 2 for x in inputs])")


def answered(lab: str, exercises: set[str], root: Path = ROOT) -> nbformat.NotebookNode:
    """Lab `lab`'s student notebook with the solution's answer cells for `exercises` (the pristine stubs elsewhere)."""
    entry = next(x for x in LABS if x.number == lab)
    pristine = Pristine.read(lab, entry.student(root))
    solved = {c.id: c for c in nbformat.read(entry.solution(root), as_version=4).cells}
    nb = nbformat.read(entry.student(root), as_version=4)
    for cell in nb.cells:
        if set(pristine.answers.get(cell.id, [])) & exercises:
            cell.source = solved[cell.id].source
    return nb


def submission(i: int, pristine: Pristine, root: Path = ROOT) -> tuple[nbformat.NotebookNode, dict[str, str]]:
    """The `i`th generated submission and the verdict each exercise should get: every fifth leaves 2.5 or 2.3 a stub
    (with 2.3, the exercises built on it are not attempted either), every seventh (when not one of those) answers 2.1 with
    its gradients doubled (so 2.1 fails, and 2.2 and 2.4, built on it, fail naming it), the rest solve them all."""
    expect = {ex: "passed" for ex in pristine.exercises}
    stubbed = list(STUBBED)[(i // 5) % len(STUBBED)] if i % 5 == 4 else None
    nb = answered(LAB, set(pristine.exercises) - {stubbed}, root)
    expect.update({ex: "not attempted" for ex in STUBBED.get(stubbed, ())})
    if i % 7 == 6 and stubbed is None:
        cell = next(c for c in nb.cells if "2.1" in pristine.answers.get(c.id, []))
        if WRONG_2_1[0] not in cell.source:
            raise RuntimeError("Lab 02's answer to 2.1 no longer has the line bench grade doubles: update WRONG_2_1")
        cell.source = cell.source.replace(*WRONG_2_1)
        expect.update({ex: "failed" for ex in ("2.1", *BUILT_ON_2_1)})
    return nb, expect


def _student(root: Path) -> Path:
    return next(x for x in LABS if x.number == LAB).student(root)


def grade_class(count: int, jobs: int, folder: Path, root: Path = ROOT) -> dict[str, Any]:
    """Grade `count` generated submissions `jobs` at a time: seconds, and how many verdicts were as expected."""
    pristine = Pristine.read(LAB, _student(root))
    expected = {}
    for i in range(count):
        nb, expect = submission(i, pristine, root)
        (folder / f"s{i:03d}").mkdir(parents=True)
        nbformat.write(nb, folder / f"s{i:03d}" / _student(root).name)
        expected.update({(f"s{i:03d}", ex): v for ex, v in expect.items()})
    start = time.perf_counter()
    rows = grader.run(Options((folder,), (LAB,), Limits(seed=0), jobs, progress=False, root=root)).rows
    seconds = time.perf_counter() - start
    got = {(r.student, r.exercise): r.status for r in rows}
    return {"seconds": round(seconds, 1), "rows": len(rows), "as_expected": sum(got.get(k) == v for k, v in expected.items()),
            "statuses": dict(Counter(got.values()))}


def grade_bench(counts: tuple[int, ...] = COUNTS, jobs: int | None = None, root: Path = ROOT) -> dict[str, Any]:
    """Seconds to grade each class size, the verdicts of each, the job slots, and that every box was sandboxed."""
    problem = sandbox.unusable()
    if problem:
        raise RuntimeError(f"bench grade times the sandboxed grader, and the sandbox is unusable here: {problem}")
    jobs = jobs or os.cpu_count() or 1
    runs = {}
    with tempfile.TemporaryDirectory(prefix="labkit-bench-grade-") as tmp:
        for count in counts:
            runs[str(count)] = grade_class(count, jobs, Path(tmp) / f"class-{count}", root)
    return {"seconds": {k: r["seconds"] for k, r in runs.items()},
            "as_expected": {k: f"{r['as_expected']}/{r['rows']}" for k, r in runs.items()},
            "jobs": jobs, "sandbox": True, "kept_by": sandbox.kept_by(), "identity": sandbox.identity()}
