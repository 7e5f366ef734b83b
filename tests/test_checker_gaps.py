"""Issue 50's wrong answers graded as a class: each gets its exercise not passed, the solution every exercise.

Two students tried labs 03-07 from the student notebooks and wrote eleven plausible wrong answers that `labkit
grade` gave full marks (its hidden cases included) or that only its hidden cases caught. Here each is one student
of a class that also holds the solution of every lab, graded in one run as an instructor grades: the planted
exercise of each wrong student is not passed, and the solution passes all fourteen exercises of labs 03-07. Each
wrong answer is planted into the solution's text of its answer cell, so a solution whose line changes fails here
by name rather than grading the solution twice. The checkers' own tests plant the same mistakes one by one
(tests/test_checks_lab03.py ... lab07.py); this holds the whole path, the box and the hidden cases, at once.
"""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.course.catalog import LABS
from labkit.course.grade import bench, sandbox
from labkit.course.grade.rebuild import Pristine

ROOT = Path(__file__).resolve().parent.parent
GRADED = ["03", "04", "05", "06", "07"]
pytestmark = [pytest.mark.long,
              pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))]

# student -> (lab, exercise, text of the solution's answer, the wrong text): issue 50's eleven
WRONG = {
    "up-3.4": ("03", "3.4", "    top = room // unit", "    top = -(-room // unit)"),
    "input-3.5": ("03", "3.5", "need = np.maximum.accumulate(np.where(js > s, x[js], 0) + f[js])",
                  "need = np.maximum.accumulate(f[js])"),
    "later-tie-4.2": ("04", "4.2", "for r in sorted(items, key=", "for r in sorted(items[::-1], key="),
    "most-4.3": ("04", "4.3", "    if budget // unit > most:\n", "    if False:\n"),
    "timed-5.2": ("05", "5.2", "seconds=float(seconds_of(r))",
                  "seconds=r.seconds if r.seconds is not None else float(seconds_of(r))"),
    "own-dtype-6.1": ("06", "6.1", "a64, b64 = a.double(), b.double()", "a64, b64 = a, b"),
    "nan-is-0-6.1": ("06", "6.1", "max_abs = (a64 - b64)[differ].abs().max().item()",
                     "max_abs = (a64 - b64)[differ].abs().nan_to_num(0.0).max().item()"),
    "none-momentum-6.2": ("06", "6.2", 'if getattr(bn, "rerun_stash", None) is not None:',
                          'if getattr(bn, "rerun_stash", None) is not None and bn.rerun_stash[0] is not None:'),
    "strict-6.3": ("06", "6.3", 's.schemes["none"].peak_bytes <= s.budget', 's.schemes["none"].peak_bytes < s.budget'),
    "units-7.1": ("07", "7.1", "unit = _units(profile, most)", "unit = _units(profile, 256)"),
    "floor-only-7.1": ("07", "7.1", "if profile.floor > budget or profile.base > budget:",
                       "if profile.floor > budget:"),
}


def _exercises(lab: str) -> set[str]:
    entry = next(x for x in LABS if x.number == lab)
    return set(Pristine.read(lab, entry.student(ROOT)).exercises)


def _plant(lab: str, exercise: str, right: str, wrong: str) -> nbformat.NotebookNode:
    """Lab `lab` solved, with `right` replaced by `wrong` in `exercise`'s answer cell (it must be there once)."""
    entry = next(x for x in LABS if x.number == lab)
    answers = Pristine.read(lab, entry.student(ROOT)).answers
    nb = bench.answered(lab, _exercises(lab), ROOT)
    cells = [c for c in nb.cells if exercise in answers.get(c.id, [])]
    found = [c for c in cells if c.source.count(right) == 1]
    assert len(found) == 1, f"{exercise}'s answer no longer holds {right!r} once: update WRONG"
    found[0].source = found[0].source.replace(right, wrong)
    return nb


def _save(nb: nbformat.NotebookNode, folder: Path, lab: str) -> None:
    entry = next(x for x in LABS if x.number == lab)
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / entry.notebook)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[tuple[str, str], str]:
    """The class graded once: (student, exercise) -> status."""
    tmp = tmp_path_factory.mktemp("gaps")
    for lab in GRADED:
        _save(bench.answered(lab, _exercises(lab), ROOT), tmp / "class" / "solution", lab)
    for student, (lab, exercise, right, wrong) in WRONG.items():
        _save(_plant(lab, exercise, right, wrong), tmp / "class" / student, lab)
    out = tmp / "grades.csv"
    done = subprocess.run([sys.executable, "-m", "labkit", "grade", str(tmp / "class"), "--labs", ",".join(GRADED),
                           "--out", str(out), "--seed", "50"], capture_output=True, text=True, timeout=3000, cwd=tmp)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with out.open(newline="", encoding="utf-8") as f:
        return {(r["student"], r["exercise"]): r["status"] for r in csv.DictReader(f)}


def test_the_solution_passes_all_fourteen(graded):
    solved = {ex: status for (student, ex), status in graded.items() if student == "solution"}
    assert len(solved) == 14 and set(solved.values()) == {"passed"}, solved


@pytest.mark.parametrize("student", WRONG)
def test_each_wrong_answer_is_not_passed(graded, student):
    lab, exercise, _, _ = WRONG[student]
    status = graded[(student, exercise)]  # failed by its checker: a crash, a timeout or a box's error is no catch
    assert status == "failed", f"{student}: {exercise} {status}"
