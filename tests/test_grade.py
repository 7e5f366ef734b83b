"""`labkit grade`: a returned notebook is rebuilt from the pristine one, run in a sandbox, and graded per exercise.

Fixture submissions are made by code from Lab 02's student notebook (answers taken from the solution by cell
id). The slow tests grade whole folders of them, as an instructor would: a tamper suite, a poisoning attempt,
and broken submissions. They need bubblewrap (`.ci/run` installs it).
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from labkit.course.grade import guard, report, sandbox
from labkit.course.grade.rebuild import VERIFY, Pristine, rebuild, scan

ROOT = Path(__file__).resolve().parent.parent
LAB = "02"
STUDENT = ROOT / "notebooks" / "02_recompute.ipynb"
SOLUTION = ROOT / "solutions" / "02_recompute.ipynb"
EXERCISES = ["2.1", "2.2", "2.3", "2.4", "2.5"]
needs_bwrap = pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))


def pristine() -> Pristine:
    return Pristine.read(LAB, STUDENT)


def answered(*exercises: str, outputs: bool = False) -> nbformat.NotebookNode:
    """Lab 02's student notebook with the solution's answer cells for `exercises` (stubs elsewhere)."""
    p = pristine()
    solution = {c.id: c for c in nbformat.read(SOLUTION, as_version=4).cells}
    nb = nbformat.read(STUDENT, as_version=4)
    for cell in nb.cells:
        if set(p.answers.get(cell.id, [])) & set(exercises):
            cell.source = solution[cell.id].source
            if outputs:
                cell.outputs = solution[cell.id].outputs
    return nb


def cell_of(nb: nbformat.NotebookNode, kind: str, exercise: str) -> nbformat.NotebookNode:
    """The answer or checker cell of `exercise`."""
    p = pristine()
    table = p.answers if kind == "answer" else p.checkers
    return next(c for c in nb.cells if exercise in table.get(c.id, []))


def save(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def run_grade(tmp_path: Path, folder: Path, *extra: str, labs: str = LAB) -> tuple[dict[tuple[str, str], dict], str, float]:
    """`python -m labkit grade folder --labs 02`; rows by (student, exercise), the terminal output, seconds."""
    out = tmp_path / "book" / "grades.csv"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "labkit", "grade", str(folder), "--labs", labs, "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(report.COLUMNS)
    return {(r["student"], r["exercise"]): r for r in rows}, done.stdout, seconds


def statuses(rows: dict, student: str) -> dict[str, str]:
    return {ex: rows[(student, ex)]["status"] for ex in EXERCISES}


# ---------------------------------------------------------------- the rebuild, without running anything
def test_only_answer_cells_come_from_the_submission():
    nb = answered(*EXERCISES)
    checker = cell_of(nb, "checker", "2.1")
    checker.source = 'print("[ex 2.1] passed: trust me")'
    checker.metadata["tags"] = ["raises-exception", "nbval-skip"]
    given = next(c for c in nb.cells if c.cell_type == "code" and c.id not in pristine().answers)
    given.source += "\nlk.checks.ex_2_2 = print"
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", text="stale")]
    built = rebuild(nb, pristine())
    assert built.found == set(pristine().answers), "every answer cell is matched by id"
    by_id = {c.id: c for c in built.nb.cells[1:]}
    original = {c.id: c for c in nbformat.read(STUDENT, as_version=4).cells}
    for cid, cell in by_id.items():
        if cid in pristine().answers:
            assert cell.source == cell_of(answered(*EXERCISES), "answer", pristine().answers[cid][0]).source
        elif cid in pristine().checkers:
            assert cell.source == VERIFY + original[cid].source and cell.metadata.get("tags") is None
        else:
            assert cell.source == original[cid].source
        assert cell.get("outputs", []) == []
    assert built.nb.cells[0].source.startswith("import labkit.course.grade.guard")


def test_deleted_cells_fall_back_to_the_pristine_stub_and_nbval_markers_are_dropped():
    nb = answered(*EXERCISES)
    nb.cells = [c for c in nb.cells if c.id != cell_of(nb, "answer", "2.5").id]
    cell_of(nb, "answer", "2.1").source += "\n# NBVAL_SKIP"
    built = rebuild(nb, pristine())
    assert cell_of(built.nb, "answer", "2.5").source == cell_of(nbformat.read(STUDENT, as_version=4), "answer", "2.5").source
    assert "NBVAL_SKIP" not in cell_of(built.nb, "answer", "2.1").source


@pytest.mark.parametrize("source, finding", [
    ("import labkit as lk\nlk.checks.ex_2_1 = lambda *a, **k: None", "assigns lk.checks.ex_2_1"),
    ("from labkit.reference.recompute import checkpoint", "imports labkit.reference.recompute"),
    ("setattr(lk.checks, 'ex_2_1', print)", "calls setattr on lk.checks"),
    ("get_ipython().set_custom_exc((Exception,), lambda *a: None)", "uses get_ipython"),
    ("torch.allclose = lambda *a, **k: True", "assigns torch.allclose"),
    ("f.__code__ = g.__code__", "uses .__code__"),
    ("x = __import__('labkit.reference.recompute')", "names a withheld labkit.reference module in a string"),
    ("lk.checks.ex_2_1.__closure__[1].cell_contents = print", "uses .__closure__"),
    ("setattr(__builtins__, '__import__', fake)", "uses __builtins__"),
    ("sys.modules['labkit.checks'] = fake", "assigns an item of sys.modules"),
    ("class lk:\n    pass", "rebinds lk"),
    ("lk = Fake()", "rebinds lk"),
    ("def difference(n, a, b):\n    return lk.checks.lab06.oracle.difference(n, a, b)", "uses lk.checks"),  # an oracle
    ("from labkit import checks", "imports labkit.checks"),
    ("import labkit.checks.lab05.oracle as o", "imports labkit.checks.lab05.oracle"),
    ("from labkit import course", "imports labkit.course"),
    ("c = getattr(lk, 'checks')", "calls getattr on lk"),
    ("c = vars(lk)['checks']", "calls vars on lk"),
    ("importlib.import_module('labkit.checks.lab06.oracle')", "names the checkers or the grader in a string"),
    ("o = sys.modules['labkit.checks.lab06.oracle']", "reads sys.modules"),
])
def test_scan_flags_what_an_answer_has_no_business_doing(source, finding):
    assert finding in scan(source, frozenset({"recompute", "sqrt_n"}))


@pytest.mark.parametrize("source", [
    "def f(x):\n    y = x.detach().requires_grad_(x.requires_grad)\n    return y",
    "ctx.saved = x\nout.grad_fn.name = 'x'",
    "torch.manual_seed(0)\nstate = torch.get_rng_state()",
    "os.environ['X'] = '1'",
])
def test_scan_leaves_ordinary_answers_alone(source):
    assert scan(source) == []


# ---------------------------------------------------------------- the guard, in this process
def test_guard_puts_back_a_monkeypatched_checker_and_names_it(capsys):
    import sys

    import labkit as lk
    import torch

    original, allclose = lk.checks.ex_2_1, torch.allclose
    guard.arm()
    try:
        lk.checks.ex_2_1 = lambda *a, **k: None
        torch.allclose = lambda *a, **k: True
        lk.checks.base.passed.__code__ = (lambda ex, what: None).__code__
        real = sys.modules["labkit.checks"]
        sys.modules["labkit.checks"] = object()
        inner = lk.checks.ex_2_2.__closure__[1]  # the check the student-facing wrapper calls
        held = inner.cell_contents
        inner.cell_contents = lambda *a, **k: print("[ex 2.2] passed: fake")
        torch.Tensor.numel = lambda self: 0  # shadows TensorBase.numel
        changed = guard.verify()
    finally:
        lk.checks.ex_2_1, torch.allclose = original, allclose
    assert sys.modules["labkit.checks"] is real
    assert inner.cell_contents is held and "numel" not in vars(torch.Tensor) and torch.ones(3).numel() == 3
    assert {"labkit.checks.ex_2_1", "torch.allclose", "labkit.checks.base.passed", "sys.modules.labkit.checks",
            "labkit.checks.ex_2_2", "torch.Tensor.(its attributes)"} <= set(changed)
    assert lk.checks.ex_2_1 is original and torch.allclose is allclose
    assert lk.checks.base.passed.__code__.co_name == "passed"
    assert guard.MARK in capsys.readouterr().out
    assert guard.verify() == [], "nothing changed since: nothing to report"


def test_guard_lets_copy_deepcopy_cache_slot_names_on_a_labkit_class():
    import copy

    import labkit as lk

    class Config(lk.GPTConfig):  # a fresh subclass: copyreg has cached nothing on it yet
        pass
    Config.__module__ = "labkit.models"  # the guard watches labkit's classes
    lk.models.FreshConfig = Config
    guard.arm()
    try:
        copy.deepcopy(Config(seq=2, batch=1, hidden=2, heads=1, n_layers=1))  # writes Config.__slotnames__
        assert "__slotnames__" in vars(Config)
        assert guard.verify() == []
    finally:
        del lk.models.FreshConfig


# ---------------------------------------------------------------- turning events into rows
def _cells():
    return [{"index": 1, "role": "answer", "exercises": ["2.1"]}, {"index": 2, "role": "checker", "exercises": ["2.1"]},
            {"index": 3, "role": "answer", "exercises": ["2.2"]}, {"index": 4, "role": "checker", "exercises": ["2.2"]},
            {"index": 5, "role": "checker", "exercises": ["2.3"]}]


def _ev(cell, status="ok", ename="", evalue="", stdout=""):
    return {"cell": cell, "status": status, "ename": ename, "evalue": evalue, "stdout": stdout, "seconds": 1.0}


LIMITS = {"cell_timeout": 10.0, "notebook_timeout": 100.0}


def test_rows_name_a_dead_kernel_and_what_went_ungraded():
    events = {1: _ev(1), 2: _ev(2, stdout="[ex 2.1] passed: fine\n"), 3: _ev(3, "dead")}
    rows = report.classify("ann", LAB, ["2.1", "2.2", "2.3"], _cells(), events, {}, [], "done", LIMITS)
    assert [(r.status, r.message) for r in rows] == [
        ("passed", "[ex 2.1] passed: fine"),
        ("error", "kernel died in Exercise 2.2; 2.2\u20132.3 not graded"),
        ("error", "kernel died in Exercise 2.2; 2.2\u20132.3 not graded")]


def test_rows_for_a_killed_notebook_a_cell_timeout_and_tampering():
    events = {1: _ev(1), 2: _ev(2, "timeout")}
    rows = report.classify("ann", LAB, ["2.1", "2.2", "2.3"], _cells(), events, {}, [], "killed", LIMITS)
    assert rows[0].status == "timeout" and "cell timeout (10 s)" in rows[0].message
    assert rows[1].message == "the notebook's time limit (100 s) ran out in Exercise 2.2; 2.2\u20132.3 not graded"
    events = {1: _ev(1), 2: _ev(2, stdout=f"{guard.MARK} labkit.checks.ex_2_3\n[ex 2.1] passed: x\n"),
              3: _ev(3), 4: _ev(4, "error", "NotAttempted", "[ex 2.2] not attempted: stub"),
              5: _ev(5, "error", "CheckFailure", "[ex 2.3] what: expected 1, got 2.\nHint: h")}
    rows = report.classify("ann", LAB, ["2.1", "2.2", "2.3"], _cells(), events, {"2.2": ["uses get_ipython"]}, [],
                           "done", LIMITS)
    assert [r.status for r in rows] == ["tampered", "tampered", "failed"]
    assert rows[2].message == "[ex 2.3] what: expected 1, got 2."
    rows = report.classify("ann", LAB, ["2.1", "2.2", "2.3"], _cells(), events, {}, ["changed labkit/x.py"], "done",
                           LIMITS)
    assert {r.status for r in rows} == {"tampered"}


def test_a_checker_that_prints_no_pass_line_did_not_pass():
    events = {1: _ev(1), 2: _ev(2, stdout="[ex 2.1] something else\n")}
    rows = report.classify("ann", LAB, ["2.1"], _cells()[:2], events, {}, [], "done", LIMITS)
    assert rows[0].status == "failed"


# ---------------------------------------------------------------- whole classes, in the sandbox
@pytest.mark.slow
def test_without_a_sandbox_it_grades_all_the_same_and_says_so(tmp_path):
    solution = nbformat.read(ROOT / "solutions" / "00_start_here.ipynb", as_version=4)
    save(solution, tmp_path / "class" / "zoe.ipynb")
    rows, out, _ = run_grade(tmp_path, tmp_path / "class", "--no-sandbox", labs="00")
    assert "sandbox: NONE (--no-sandbox)" in out
    assert rows[("zoe", "0.1")]["status"] == "passed"


@needs_bwrap
@pytest.mark.slow
def test_every_completed_lab_passes_grading(tmp_path):
    """The solutions' answers, returned without outputs: every exercise of every lab passes, none is flagged."""
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    for solution in solutions:
        nb = nbformat.read(solution, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        save(nb, tmp_path / "class" / "solved" / solution.name)
    rows, _, _ = run_grade(tmp_path, tmp_path / "class", "--jobs", "2", labs=",".join(p.name[:2] for p in solutions))
    assert {r["lab"] for r in rows.values()} == {p.name[:2] for p in solutions}
    assert {k: r["message"] for k, r in rows.items() if r["status"] != "passed"} == {}


@pytest.fixture(scope="module")
def class_grades(tmp_path_factory):
    """One grading run (--labs 02) over a class of tampered and of broken submissions, two of them right."""
    tmp = tmp_path_factory.mktemp("class")
    folder = tmp / "class"
    # the tamper suite: each notebook tampers with some exercises and answers the others
    # 2.4 and 2.5 build on 2.2 and 2.3, and nothing builds on them: they are the ones left as stubs and tampered with
    nb = answered("2.1", "2.2", "2.3")
    nb.cells.remove(cell_of(nb, "checker", "2.4"))
    cell_of(nb, "checker", "2.5").source = 'print("[ex 2.5] passed: all good")'
    save(nb, folder / "deleted_and_print.ipynb")
    nb = answered("2.1", "2.2")
    c = cell_of(nb, "checker", "2.3")
    c.source = "try:\n    " + c.source + "\nexcept Exception:\n    pass"
    c = cell_of(nb, "checker", "2.4")
    c.source, c.metadata["tags"] = "# NBVAL_SKIP\n" + c.source, ["nbval-skip"]
    c = cell_of(nb, "checker", "2.5")
    c.source, c.metadata["tags"] = "# NBVAL_RAISES_EXCEPTION\n" + c.source, ["raises-exception"]
    save(nb, folder / "silenced.ipynb")
    nb = answered("2.1", "2.2", "2.3")
    early = next(c for c in nb.cells if c.cell_type == "code")
    early.source += '\nlk.checks.ex_2_4 = lambda *a, **k: print("[ex 2.4] passed: yes")'
    cell_of(nb, "answer", "2.5").source += "\nimport labkit as lk\nlk.checks.ex_2_5 = lambda *a, **k: None"
    save(nb, folder / "monkeypatched.ipynb")
    empty = nbformat.v4.new_notebook()
    save(empty, folder / "empty" / "02_recompute.ipynb")
    nb = answered(*EXERCISES)
    cut = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## Exercise 2.4"))
    nb.cells = nb.cells[:cut]
    save(nb, folder / "truncated.ipynb")
    nb = answered(*EXERCISES, outputs=True)  # right answers, outputs kept, counts cleared
    cell_of(nb, "answer", "2.4").source += '\nsetattr(globals()["lk"].checks, "ex_2_4", lambda *a, **k: None)'
    cell_of(nb, "answer", "2.5").source += "\nfrom labkit.reference.recompute import checkpoint_hooks"
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.execution_count = None
    save(nb, folder / "counts_cleared.ipynb")
    # the broken suite: the exercises not asserted on are left as stubs (they run faster)
    for name in ("ok_one", "ok_two"):
        save(answered(*EXERCISES), folder / f"{name}.ipynb")
    broken = {"syntax": ("2.1", "def broken(:\n    pass"), "loop": ("2.1", "while True:\n    pass"),
              "exit": ("2.2", "import os\nos._exit(1)"),
              "huge": ("2.1", "import torch\nhuge = torch.empty(30 * 2**30, dtype=torch.uint8).fill_(1)")}
    for name, (ex, code) in broken.items():
        nb = answered("2.1", ex)
        cell_of(nb, "answer", ex).source = code + "\n" + cell_of(nb, "answer", ex).source
        save(nb, folder / f"{name}.ipynb")
    (folder / "not_json.ipynb").write_text('{"cells": [ this is not json')
    save(nbformat.read(ROOT / "notebooks" / "01_activation_memory.ipynb", as_version=4), folder / "other_lab.ipynb")
    return run_grade(tmp, folder, "--jobs", "2", "--timeout", "20", "--notebook-timeout", "200")


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("student, expected", [
    ("deleted_and_print", {"2.1": "passed", "2.2": "passed", "2.3": "passed", "2.4": "not attempted",
                           "2.5": "not attempted"}),
    ("silenced", {"2.1": "passed", "2.2": "passed", "2.3": "not attempted", "2.4": "not attempted",
                  "2.5": "not attempted"}),
    ("monkeypatched", {"2.1": "passed", "2.2": "passed", "2.3": "passed", "2.4": "not attempted",
                       "2.5": "tampered"}),
    ("empty", dict.fromkeys(EXERCISES, "not attempted")),
    ("truncated", {"2.1": "passed", "2.2": "passed", "2.3": "passed", "2.4": "not attempted", "2.5": "not attempted"}),
    ("counts_cleared", {"2.1": "passed", "2.2": "passed", "2.3": "passed", "2.4": "tampered", "2.5": "tampered"}),
])
def test_tampering_never_passes_and_untampered_answers_do(class_grades, student, expected):
    rows, _, _ = class_grades
    assert statuses(rows, student) == expected, {ex: rows[(student, ex)]["message"] for ex in EXERCISES}


@needs_bwrap
@pytest.mark.slow
def test_a_poisoning_submission_changes_nothing_for_the_next(tmp_path):
    folder, book = tmp_path / "class", tmp_path / "book"
    nb = answered("2.1")
    cell_of(nb, "answer", "2.1").source += (
        '\nm = __import__("labkit.checks.lab02.recompute", fromlist=["x"])'
        '\nopen(m.__file__, "a").write("\\ndef ex_2_1(*a, **k):\\n    print(\'[ex 2.1] passed: poisoned\')\\n")'
        f'\nopen({str(book / "grades.csv")!r}, "w").write("a_poison,02,2.1,passed")'
        f'\nopen({str(book / "extra.csv")!r}, "w").write("x")')
    save(nb, folder / "a_poison.ipynb")
    wrong = answered("2.1")
    c = cell_of(wrong, "answer", "2.1")
    assert "ctx.save_for_backward(" in c.source
    c.source = c.source.replace("ctx.save_for_backward(", "ctx.save_for_backward_typo(", 1)
    save(wrong, folder / "b_wrong.ipynb")
    def kit():  # the kit's files; bytecode caches are the grader's own imports
        return {k: v for k, v in sandbox.digest(ROOT / "labkit").items() if "__pycache__" not in k}

    before = kit()
    rows, _, _ = run_grade(tmp_path, folder, "--jobs", "1")
    assert kit() == before, "the kit's files changed"
    assert statuses(rows, "a_poison") == dict.fromkeys(EXERCISES, "tampered")
    assert "labkit/checks/lab02/recompute.py" in rows[("a_poison", "2.1")]["message"]
    assert rows[("b_wrong", "2.1")]["status"] == "failed", rows[("b_wrong", "2.1")]["message"]
    assert sorted(p.name for p in book.iterdir()) == ["grades.csv"]


@needs_bwrap
@pytest.mark.slow
def test_broken_submissions_each_become_their_own_rows(class_grades):
    rows, out, seconds = class_grades
    assert "limits: cell 20 s, notebook 200 s, memory 4 GiB" in out
    students = {s for s, _ in rows}
    assert {"ok_one", "ok_two", "syntax", "loop", "exit", "huge", "not_json", "other_lab"} <= students
    assert all(len([k for k in rows if k[0] == s]) == len(EXERCISES) for s in students), "one row per exercise"
    for name in ("ok_one", "ok_two"):
        assert set(statuses(rows, name).values()) == {"passed"}, [rows[(name, ex)]["message"] for ex in EXERCISES]
    assert statuses(rows, "syntax")["2.1"] == "error" and "SyntaxError" in rows[("syntax", "2.1")]["message"]
    assert statuses(rows, "loop")["2.1"] == "timeout"
    assert statuses(rows, "exit")["2.1"] == "passed"
    assert statuses(rows, "exit")["2.2"] == "error" and "kernel died in Exercise 2.2" in rows[("exit", "2.2")]["message"]
    assert statuses(rows, "huge")["2.1"] == "error" and "allocate" in rows[("huge", "2.1")]["message"]
    assert set(statuses(rows, "not_json").values()) == {"error"}
    assert "not a valid notebook" in rows[("not_json", "2.1")]["message"]
    assert set(statuses(rows, "other_lab").values()) == {"missing"}
    assert "Lab 01" in rows[("other_lab", "2.1")]["message"]
    print(json.dumps({"class_of_14_seconds": round(seconds, 1)}))


def test_student_names_come_from_files_or_their_folders():
    from labkit.course.grade import student_name

    stems, taken = {"01_activation_memory", "02_recompute"}, set()
    names = [student_name(Path(p), stems, taken) for p in
             ("c/alice/01_activation_memory.ipynb", "c/alice/02_recompute.ipynb", "c/bob.ipynb",
              "d/alice/02_recompute.ipynb")]
    assert names == ["alice", "alice", "bob", "alice#2"]
