"""`labkit grade`: a returned notebook's answers, cut to their definitions, graded exercise by exercise in a box,
the data checkers outside it.

Fixture submissions are made by code from Lab 02's student notebook (answers taken from the solution by cell id).
The first tests run nothing (rebuild, scan, program, the wire, files, rows, the CSV); the slow ones grade whole
folders as an instructor would, in bubblewrap (`.ci/run` installs it): every lab solved, tampering, attacks from a
red team (tests/test_grade_attacks.py), escapes tried as root, attacks on the checkers that run outside the box.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from labkit.checks import base, lab00
from labkit.course.catalog import LABS
from labkit.course.grade import bench, calls, files, grader, guard, report, sandbox, wire
from labkit.course.grade.options import Limits, Options
from labkit.course.grade.rebuild import Pristine, definitions, program, rebuild, scan

ROOT = Path(__file__).resolve().parent.parent
LAB = "02"
STUDENT = ROOT / "notebooks" / "02_recompute.ipynb"
SOLUTION = ROOT / "solutions" / "02_recompute.ipynb"
EXERCISES = ["2.1", "2.2", "2.3", "2.4", "2.5"]
needs_bwrap = pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))


def pristine() -> Pristine:
    return Pristine.read(LAB, STUDENT)


def answered(*exercises: str, lab: str = LAB) -> nbformat.NotebookNode:
    """A lab's student notebook with the solution's answer cells for `exercises` (stubs elsewhere)."""
    return bench.answered(lab, set(exercises), ROOT)


def cell_of(nb: nbformat.NotebookNode, kind: str, exercise: str, lab: str = LAB) -> nbformat.NotebookNode:
    """The answer or checker cell of `exercise`."""
    p = pristine() if lab == LAB else Pristine.read(lab, next(x.student(ROOT) for x in LABS if x.number == lab))
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
    with out.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(report.COLUMNS)
    return {(r["student"], r["exercise"]): r for r in rows}, done.stdout + done.stderr, seconds


def statuses(rows: dict, student: str, exercises: list[str] = EXERCISES) -> dict[str, str]:
    return {ex: rows[(student, ex)]["status"] for ex in exercises}


# ---------------------------------------------------------------- the rebuild and the program, without running anything
def test_only_answer_cells_come_from_the_submission():
    nb = answered(*EXERCISES)
    checker = cell_of(nb, "checker", "2.1")
    checker.source = 'print("[ex 2.1] passed: trust me")'
    given = next(c for c in nb.cells if c.cell_type == "code" and c.id not in pristine().answers)
    given.source += "\nlk.checks.ex_2_2 = print"
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", text="stale")]
    built = rebuild(nb, pristine())
    assert built.found == set(pristine().answers), "every answer cell is matched by id"
    original = {c.id: c for c in nbformat.read(STUDENT, as_version=4).cells}
    for cell in built.nb.cells:
        if cell.id in pristine().answers:
            assert cell.source == cell_of(answered(*EXERCISES), "answer", pristine().answers[cell.id][0]).source
        else:
            assert cell.source == original[cell.id].source
        assert cell.get("outputs", []) == []
    assert pristine().calls["2.2"] == ("ex_2_2", ["stash_rng", "restored_rng", "RecomputeRNG"])


def test_deleted_cells_fall_back_to_the_pristine_stub_and_nbval_markers_are_dropped():
    nb = answered(*EXERCISES)
    nb.cells = [c for c in nb.cells if c.id != cell_of(nb, "answer", "2.5").id]
    cell_of(nb, "answer", "2.1").source += "\n# NBVAL_SKIP"
    built = rebuild(nb, pristine())
    assert cell_of(built.nb, "answer", "2.5").source == cell_of(nbformat.read(STUDENT, as_version=4), "answer", "2.5").source
    assert "NBVAL_SKIP" not in cell_of(built.nb, "answer", "2.1").source
    assert built.lost == {"2.5"}


def test_one_pristine_notebook_rebuilds_each_student_apart():
    """A Pristine serves a whole class: a student with no answer cells, rebuilt after one with every answer, gets
    the stubs, never the previous student's answers."""
    shared = pristine()
    rebuild(answered(*EXERCISES), shared)
    empty = answered(*EXERCISES)
    empty.cells = [c for c in empty.cells if c.id not in shared.answers]
    built = rebuild(empty, shared)
    stubs = nbformat.read(STUDENT, as_version=4)
    for ex in EXERCISES:
        assert cell_of(built.nb, "answer", ex).source == cell_of(stubs, "answer", ex).source
    assert built.lost == set(EXERCISES)


def test_the_program_is_the_export_cells_with_the_answers_cut_to_their_definitions():
    nb = answered(*EXERCISES)
    cell_of(nb, "answer", "2.1").source += "\nprint('a top-level statement')\ntorch.equal = lambda *a: True"
    cells, dropped = program(rebuild(nb, pristine()), pristine())
    exported = [c.id for c in nbformat.read(STUDENT, as_version=4).cells if c.source.startswith("#| export")]
    assert [c["id"] for c in cells] == exported
    answer = next(c for c in cells if c["exercises"] == ["2.1"])
    assert "print(" not in answer["source"] and "torch.equal" not in answer["source"] and dropped["2.1"] == 2


@pytest.mark.parametrize("source, kept, left_out", [
    ("import math\nX = {1: math.pi}\ndef f():\n    return X", "import math\nX = {1: math.pi}\n\ndef f():\n    return X", 0),
    ("f()\nY = f()\nZ = [g() for g in h]", "", 3),  # calls at load: not run
    ("torch.equal = None\nd['k'] = 1\nos.environ['X'] = '1'", "", 3),  # attributes and items: not run
    ("a, b = 1, 2\nclass C:\n    pass", "a, b = (1, 2)\n\nclass C:\n    pass", 0),
    ("def broken(:\n    pass", "def broken(:\n    pass", 0),  # kept whole: its SyntaxError is the grade
])
def test_definitions_keep_what_defines_and_nothing_that_runs(source, kept, left_out):
    assert definitions(source) == (kept, left_out)


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
    ("def difference(n, a, b):\n    return lk.checks.lab06.oracle.difference(n, a, b)", "uses lk.checks"),
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
    "from labkit.labs.recompute import checkpoint  # an earlier lab's code: allowed",
    "import numpy as np\nimport math",
    "from labkit.reference.recompute import checkpoint  # a shipped answer of a lab not withheld",
])
def test_scan_leaves_ordinary_answers_alone(source):
    assert scan(source) == []


# ---------------------------------------------------------------- the guard, in this process
def test_guard_puts_back_a_monkeypatched_checker_and_names_it(capsys):
    import labkit as lk

    original, allclose, fork_rng = lk.checks.ex_2_1, torch.allclose, torch.random.fork_rng
    guard.arm()
    try:
        lk.checks.ex_2_1 = lambda *a, **k: None
        torch.allclose = lambda *a, **k: True
        torch.random.fork_rng = lambda *a, **k: None  # a context that swallows a checker's failure
        lk.checks.base.passed.__code__ = (lambda ex, what: None).__code__
        real = sys.modules["labkit.checks"]
        sys.modules["labkit.checks"] = object()
        lk.checks = object()  # the top-level package is watched too
        changed = guard.verify()
    finally:
        lk.checks.ex_2_1, torch.allclose, torch.random.fork_rng = original, allclose, fork_rng
    assert sys.modules["labkit.checks"] is real and lk.checks is real
    assert {"labkit.checks.ex_2_1", "torch.allclose", "labkit.checks.base.passed", "sys.modules.labkit.checks",
            "torch.random.fork_rng", "labkit.checks"} <= set(changed)
    assert lk.checks.base.passed.__code__.co_name == "passed"
    assert guard.MARK in capsys.readouterr().out
    assert guard.verify() == [], "nothing changed since: nothing to report"


def test_guard_puts_back_sys_hooks_and_a_swapped_module_and_names_them():
    import builtins

    tracer, before_input = sys.gettrace(), builtins.input
    real = sys.modules["torch.utils.checkpoint"]
    guard.arm()
    try:
        sys.setprofile(lambda *a: None)
        sys.settrace(lambda *a: None)
        builtins.input = lambda *a: "yes"
        sys.modules["torch.utils.checkpoint"] = object()
        changed = guard.verify()
        after = sys.getprofile(), sys.gettrace(), builtins.input, sys.modules["torch.utils.checkpoint"]
    finally:
        sys.setprofile(None)
        sys.settrace(tracer)
        builtins.input = before_input
        sys.modules["torch.utils.checkpoint"] = real
    assert {"sys.getprofile", "sys.gettrace", "builtins.input", "sys.modules.torch.utils.checkpoint"} <= set(changed), \
        changed
    assert after == (None, tracer, before_input, real)  # the guard put each back


def test_guard_names_a_thread_and_a_torch_mode_left_behind():
    import threading

    from torch.overrides import TorchFunctionMode

    before = threading.active_count()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    mode = TorchFunctionMode()
    mode.__enter__()
    try:
        assert set(guard.leftovers(before)) == {"1 thread(s) started", "a TorchFunctionMode left active"}
    finally:
        mode.__exit__(None, None, None)
        stop.set()
        thread.join()
    assert guard.leftovers(before) == []


# ---------------------------------------------------------------- what crosses the box's wall
def test_the_wire_rebuilds_data_and_the_kit_s_dataclasses_and_runs_nothing():
    from dataclasses import dataclass

    from labkit.instruments.harness import Difference

    @dataclass
    class Segment:
        start: int
        stop: int

    class Evil:
        def __reduce__(self):  # what pickle would run; the wire never unpickles what the box sends
            return (os.system, ("echo pwned",))

    value = [1, 2.5, float("inf"), "x", None, True, (1, 2), frozenset({"a"}), {"k": [1]}, torch.float16,
             torch.arange(6).reshape(2, 3).float(), torch.tensor(1.5), Difference("a", False, 1.0, 2.0, ""),
             Segment(1, 2), Evil(), 2**70]
    back = wire.decode(json.loads(json.dumps(wire.encode(value))))
    assert back[:10] == value[:10]
    assert torch.equal(back[10], value[10]) and torch.equal(back[11], value[11])
    assert back[12] == value[12] and (back[13].start, back[13].stop) == (1, 2) and isinstance(back[13], wire.Record)
    assert isinstance(back[14], wire.Opaque) and back[14].type_name == "Evil" and back[15] == 2**70
    import numpy as np  # a numpy array (lab 03's tables) comes back as a tensor of its dtype and values
    table = np.array([[1.0, np.inf], [0.5, -2.0]])[:, ::-1]
    for array in (table, np.arange(6, dtype=np.int16).reshape(2, 3)):
        got = wire.decode(json.loads(json.dumps(wire.encode(array))))
        assert isinstance(got, torch.Tensor) and np.array_equal(np.asarray(got), array) and got.numpy().dtype == array.dtype


@pytest.mark.parametrize("data", [
    {"object": ["os:system", {}]},  # not an allowed dataclass
    {"tensor": ["float32", [3], "AAAA"]},  # 3 bytes for 12
    {"dtype": "Tensor"},
    {"dict": [[{"list": []}, 1]]},  # an unhashable key
    {"pickle": "gASV..."},
    [1, 2],
])
def test_the_wire_refuses_what_breaks_it(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


@pytest.mark.parametrize("data", [
    {"int": "²"}, {"int": "--5"}, {"int": "١٢"},  # int() takes these; the wire takes ASCII digits only
    {"tensor": ["qint8", [1], "AA=="]}, {"tensor": ["float8_e4m3fn", [1], "AA=="]},
    {"set": [{"int": str(k * (2**61 - 1))} for k in range(1, 200)]},  # ints crafted to share a hash value
    {"dict": [[k * (2**61 - 1), 0] for k in range(1, 200)]},
])
def test_the_wire_refuses_what_would_decode_wrong_or_take_quadratic_time(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_records_that_differ_hash_apart_so_a_large_set_decodes_in_linear_time():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class P:
        i: int

    records = wire.decode(wire.encode({P(i) for i in range(5000)}))
    assert len(records) == 5000 and len({hash(r) for r in records}) == 5000


def test_the_judge_never_writes_the_box_s_word_into_the_checker_s_arguments_and_fails_a_change():
    t, ops = torch.arange(4.0), [1, 2, 3]
    same = [wire.encode(t.clone()), wire.encode(list(ops))]
    assert calls._changed((t, ops), same) is None
    assert calls._changed((t, ops), [wire.encode(t[:0]), None]) == 0
    assert calls._changed((t, ops), [None, wire.encode([])]) == 1
    other = wire.encode([print])
    other["list"][0]["opaque"][1] = "<built-in function at another address>"  # a repr the box makes otherwise
    assert calls._changed((t, [print]), [None, other]) is None
    assert torch.equal(t, torch.arange(4.0)) and ops == [1, 2, 3]  # the checker's own, as they were


def test_a_kit_dataclass_its_own_checks_refuse_comes_back_as_a_wrong_value():
    from labkit.plans import Step

    bad = wire.encode(Step(0, 1, "keep"))
    bad["object"][1]["start"] = "zero"  # Step does not check; Profile does
    assert wire.decode(bad).start == "zero"
    profile = {"object": ["labkit.plans.plan:Profile", {"blocks": {"tuple": []}, "base": 0, "floor": 0, "step": 1.0}]}
    assert isinstance(wire.decode(profile), wire.Opaque)


# ---------------------------------------------------------------- the returned files
def test_only_regular_files_are_graded_under_names_from_their_paths(tmp_path):
    folder = tmp_path / "class"
    save(answered(), folder / "alice" / "02_recompute.ipynb")
    save(answered(), folder / "a" / "zz_victim" / "02_recompute.ipynb")
    save(answered(), folder / "zz_victim" / "02_recompute.ipynb")
    save(answered(), folder / "bob.ipynb")
    (folder / "mallory.ipynb").symlink_to(SOLUTION)
    save(answered(), tmp_path / "other_disk" / "dave" / "02_recompute.ipynb")
    (folder / "dave").symlink_to(tmp_path / "other_disk" / "dave", target_is_directory=True)  # named, not searched
    (folder / "alice" / ".venv").mkdir()
    (folder / "alice" / ".venv" / "lib64").symlink_to("lib")  # below a hidden folder: no lab is handed in there
    os.mkfifo(folder / "fifo.ipynb")
    (folder / "huge.ipynb").write_bytes(b" " * (files.MOST_BYTES + 1))
    weird = os.fsencode(str(folder)) + b"/\xff\xfe"
    os.makedirs(weird)
    save(answered(), Path(os.fsdecode(weird)) / "02_recompute.ipynb")
    found = {r.student: r.refused for r in files.discover([folder], {"02_recompute"})}
    assert found["alice"] == "" and found["bob"] == "" and found["a/zz_victim"] == "" and found["zz_victim"] == ""
    assert "symbolic link" in found["mallory"] and "not a regular file" in found["fifo"] and "over the limit" in found["huge"]
    assert "dave" not in found and files.linked_folders([folder]) == [folder / "dave"]
    assert "\\xff\\xfe" in found and all(name.isprintable() for name in found)
    with pytest.raises(OSError):
        files.read_text(folder / "mallory.ipynb")


def test_every_student_name_is_unique_per_lab_even_against_names_that_look_made_up(tmp_path):
    folder = tmp_path / "class"
    for name in ("alice.ipynb", "alice/02_recompute.ipynb", "alice/03_sqrt_n.ipynb", "bob.ipynb", "x/bob.ipynb",
                 "bob#2.ipynb", "carol/02_recompute.ipynb", "carol.ipynb"):
        save(answered(), folder / name)
    found = files.discover([folder], {"02_recompute", "03_sqrt_n"})
    by_lab = [(r.student, r.path.name[:2] if r.path.stem in {"02_recompute", "03_sqrt_n"} else "") for r in found]
    for i, (name, lab) in enumerate(by_lab):  # no two rows of one lab (or of a lab told by content) share a name
        assert not any(n == name and (lab == l or "" in (lab, l)) for n, l in by_lab[:i]), by_lab


def _class_of_folders(folder: Path) -> list[Path]:
    """A class returned as `folder`/<student>/<lab's notebook>: three students of lab 02, one of them of lab 03 too."""
    files_ = [save(answered(), folder / name / "02_recompute.ipynb") for name in ("alice", "bob", "carol")]
    return files_ + [save(answered(), folder / "carol" / "03_sqrt_n.ipynb")]


def test_a_class_is_named_by_its_folders_whether_given_as_a_folder_a_glob_of_files_or_a_mix(tmp_path):
    """bars/grade-names: `grade returned/`, `grade returned/*/*.ipynb` (the shell's glob) and a mix of folders and
    files give the same names, and a file given twice is graded once."""
    folder = tmp_path / "returned"
    listed = sorted(_class_of_folders(folder))
    stems = {"02_recompute", "03_sqrt_n"}
    named = lambda paths: sorted((r.student, r.path.name) for r in files.discover(paths, stems))  # noqa: E731
    want = [("alice", "02_recompute.ipynb"), ("bob", "02_recompute.ipynb"), ("carol", "02_recompute.ipynb"),
            ("carol", "03_sqrt_n.ipynb")]
    assert named([folder]) == want
    assert named(listed) == want
    assert named([folder / "alice", folder / "bob" / "02_recompute.ipynb", *listed[2:]]) == want
    assert named([folder, *listed]) == want  # each file once
    assert named([listed[1]]) == [("bob", "02_recompute.ipynb")]  # one file alone: its folder


def test_two_files_that_would_take_one_name_are_both_kept_named_apart_and_said_so(tmp_path):
    one = save(answered(), tmp_path / "room1" / "ann" / "02_recompute.ipynb")
    two = save(answered(), tmp_path / "room2" / "ann" / "02_recompute.ipynb")
    found = files.discover([tmp_path / "room1", tmp_path / "room2"], {"02_recompute"})
    assert [(r.path, r.student) for r in found] == [(one, "ann"), (two, "ann#2")]
    assert found[0].note == "" and found[1].note == f"{two} is graded as ann#2: ann is {one}"


# ---------------------------------------------------------------- rows and the gradebook
def _outcome(status: str, message: str = "m") -> dict:
    return {"status": status, "message": message, "seconds": 1.0}


def test_rows_say_what_went_ungraded_flags_and_left_out_statements():
    outcomes = {"2.1": _outcome("passed", "[ex 2.1] passed: fine"), "2.2": _outcome("failed", "[ex 2.2] x: expected 1, got 2.\nHint: h")}
    rows = report.rows("ann", LAB, ["2.1", "2.2", "2.3"], outcomes, "the grader's worker stopped (timeout)",
                       {"2.2": ["uses get_ipython"]}, {"2.1": 2}, set())
    assert [r.status for r in rows] == ["passed", "tampered", "error"]
    assert "2 top-level statements of the answer cell not run" in rows[0].message
    assert rows[2].message == "the grader's worker stopped (timeout); 2.3 not graded"


def test_a_failed_row_keeps_its_whole_message_without_the_hint_and_a_lost_cell_says_so():
    outcomes = {"2.1": _outcome("failed", "[ex 2.1] grad: expected 1,\ngot 2.\nHint: the answer"),
                "2.2": _outcome("passed", "[ex 2.2] passed: fine\nmore"), "2.3": _outcome("not attempted", "stub")}
    rows = report.rows("ann", LAB, ["2.1", "2.2", "2.3"], outcomes, "", {}, {}, {"2.3"})
    assert rows[0].message == "[ex 2.1] grad: expected 1,\ngot 2." and "Hint" not in rows[0].message
    long = report.rows("ann", LAB, ["2.1"], {"2.1": _outcome("failed", "x" * 1500)}, "", {}, {}, set())
    assert len(long[0].message) == 1000  # a failed message is kept to its first 1000 characters
    assert rows[1].message == "[ex 2.2] passed: fine"
    assert rows[2].status == "not attempted" and rows[2].message.startswith("stub (its exercise cell is not in")


def test_the_json_gradebook_is_written_into_a_new_folder_and_again_over_itself(tmp_path):
    rows = [report.Row("ann", LAB, "2.1", "passed", "ok"), report.Row("bob", LAB, "2.1", "failed", "no"),
            report.Row("bob", LAB, "2.2", "passed", "ok")]
    out = tmp_path / "new" / "deeper" / "grades.json"
    for _ in range(2):
        report.write(rows, out, True, {"seed": 3})
    whole = json.loads(out.read_text())
    assert whole["limits"] == {"seed": 3} and [r["student"] for r in whole["rows"]] == ["ann", "bob", "bob"]
    assert report.summary(rows).splitlines() == [f"Lab {LAB}: 2 submissions", "    2.1  1 passed, 1 failed",
                                                 "    2.2  1 passed", "Totals:", "  ann  1 / 2", "  bob  1 / 2"]
    assert whole["students"] == [{"student": "ann", "2.1": 1, "2.2": 0, "total": 1, "out of": 2},  # 2.2: not returned
                                 {"student": "bob", "2.1": 0, "2.2": 1, "total": 1, "out of": 2}]


def test_one_row_per_student_with_the_instructors_points_and_a_total(tmp_path):
    table = tmp_path / "points.csv"
    table.write_text("exercise,points\n2.1,3\n2.2,0.5\n")
    points = report.read_points(table)
    assert points == {"2.1": 3, "2.2": 0.5}
    rows = [report.Row("ann", LAB, "2.1", "passed", "ok"), report.Row("ann", LAB, "2.2", "tampered", "x"),
            report.Row("ann", LAB, "2.3", "passed", "ok"), report.Row("=cal", LAB, "2.1", "failed", "no"),
            report.Row("=cal", LAB, "2.2", "passed", "ok"), report.Row("=cal", LAB, "2.3", "not attempted", "")]
    book = report.write(rows, tmp_path / "grades.csv", False, {}, points)
    assert book == tmp_path / "grades_students.csv"
    with book.open(newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert list(back[0]) == ["student", "2.1", "2.2", "2.3", "total", "out of"]
    assert [(r["student"], r["2.1"], r["2.2"], r["2.3"], r["total"], r["out of"]) for r in back] == [
        ("ann", "3", "0", "1", "4", "4.5"), ("'=cal", "0", "0.5", "0", "0.5", "4.5")]
    assert "  =cal  0.5 / 4.5" in report.summary(rows, points)
    unread = [*rows, report.Row("dan", "?", "", "error", "not a valid notebook")]  # dan's only file: no lab's
    assert report.totals(unread, points)[1][-1] == {"student": "dan", "2.1": 0, "2.2": 0, "2.3": 0, "total": 0,
                                                     "out of": 4.5}
    for bad in ("2.1,lots", "two,1", "2.1,-1", "2.1", "2.1,inf", "2.1,nan"):
        table.write_text(bad + "\n")
        with pytest.raises(ValueError, match="is not `exercise,points`"):
            report.read_points(table)


def test_the_csv_is_read_back_by_python_s_csv_module_and_runs_no_formula(tmp_path):
    rows = [report.Row('=HYPERLINK("x"),"q"\n\r', LAB, "2.1", "failed", "x" * 200_000 + "\x00\x07"),
            report.Row("+1", LAB, "2.2", "passed", "-2 and @3")]
    out = tmp_path / "grades.csv"
    report.write(rows, out, False, {"seed": 1})
    with out.open(newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert len(back) == 2 and all(len(v) <= report.FIELD_CHARS for r in back for v in r.values())
    assert back[0]["student"].startswith("'=") and back[1]["student"] == "'+1" and back[1]["message"] == "'-2 and @3"
    assert back[0]["message"].endswith(report.CUT) and "\x00" not in back[0]["message"]
    whole = json.loads(out.with_suffix(".json").read_text())
    assert len(whole["rows"][0]["message"]) == 200_002


def test_a_lone_surrogate_in_a_message_or_a_name_spoils_no_gradebook(tmp_path):
    rows = [report.Row("ann\udcff", LAB, "2.1", "failed", "bad \ud800 byte"),
            report.Row("bob", LAB, "2.1", "passed", "-" + "x" * 1000)]
    out = tmp_path / "grades.csv"
    report.write(rows, out, False, {"seed": 1})
    with out.open(newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert [r["student"] for r in back] == ["ann?", "bob"] and back[0]["message"] == "bad ? byte"
    assert len(back[1]["message"]) == report.FIELD_CHARS  # the quote before a formula counts
    assert json.loads(out.with_suffix(".json").read_text())["rows"][0]["message"] == "bad ? byte"


# ---------------------------------------------------------------- hidden cases
def test_an_answer_written_for_the_public_cases_fails_the_hidden_ones():
    public = {(3, 4): 48, (5,): 10, (2, 3, 7): 336, (10,): 10, (0, 4): 0, (4,): 16}
    hard_coded = lambda t: public[tuple(t.shape)]  # noqa: E731
    lab00.ex_0_1(hard_coded)  # the cases a student can read: passed
    with base.hidden_cases(12345), pytest.raises(KeyError):
        lab00.ex_0_1(hard_coded)


# ---------------------------------------------------------------- whole classes, in the sandbox
@pytest.mark.slow
def test_without_a_sandbox_it_grades_all_the_same_and_says_so(tmp_path):
    solution = nbformat.read(ROOT / "solutions" / "00_start_here.ipynb", as_version=4)
    save(solution, tmp_path / "class" / "zoe.ipynb")
    (tmp_path / "class" / "room2").symlink_to(tmp_path, target_is_directory=True)  # never searched, but named
    rows, out, _ = run_grade(tmp_path, tmp_path / "class", "--no-sandbox", labs="00")
    assert "sandbox: NONE (--no-sandbox)" in out
    assert f"{tmp_path / 'class' / 'room2'} is a link to a folder, not searched" in out, out
    assert rows[("zoe", "0.1")]["status"] == "passed"


@needs_bwrap
@pytest.mark.slow
def test_every_completed_lab_passes_grading_and_a_hard_coded_answer_does_not(tmp_path):
    """The solutions' answers, returned without outputs: every exercise of every lab passes, none is flagged; an
    answer of lab 00 written for its public cases fails the hidden ones."""
    for lab in LABS:
        nb = nbformat.read(lab.solution(ROOT), as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        save(nb, tmp_path / "class" / "solved" / lab.notebook)
    nb = answered(lab="00")
    cell_of(nb, "answer", "0.1", lab="00").source = (
        "#| export\nimport torch\n\nPUBLIC = {(3, 4): 48, (5,): 10, (2, 3, 7): 336, (10,): 10, (0, 4): 0, (4,): 16}\n\n"
        "def tensor_bytes(t):\n    return PUBLIC[tuple(t.shape)]\n")
    save(nb, tmp_path / "class" / "lazy" / LABS[0].notebook)
    rows, out, _ = run_grade(tmp_path, tmp_path / "class", "--jobs", "2", labs=",".join(lab.number for lab in LABS))
    assert "hidden cases from seed" in out
    assert {r["lab"] for r in rows.values()} == {lab.number for lab in LABS}
    assert {k: r["message"] for k, r in rows.items() if k[0] == "solved" and r["status"] != "passed"} == {}
    # a hidden case of a shape the table lacks is a KeyError; one whose shape is public but whose dtype is not (the
    # run's seed drew a float16 (4,) once) gets the public count: a wrong answer either way
    lazy = rows[("lazy", "0.1")]
    assert lazy["status"] == "failed" and ("KeyError" in lazy["message"] or ": expected " in lazy["message"]), lazy


@needs_bwrap
@pytest.mark.slow
@pytest.mark.long  # a class of ten graded in the sandbox, about 85 s: `make long-test`
def test_bench_grade_grades_a_generated_class_sandboxed_with_every_verdict_as_expected():
    """`bench grade` on a class of 10 (the figures at 1, 10 and 100 are the benchmark's, not a test's): the keys the
    notes read, a box per submission, and every generated verdict (passes, stubs, a wrong 2.1) as it should be."""
    figures = bench.grade_bench((10,), jobs=2)
    assert set(figures) == {"seconds", "as_expected", "jobs", "sandbox", "kept_by", "identity"}
    assert figures["sandbox"] is True and figures["jobs"] == 2 and figures["seconds"]["10"] > 0
    assert figures["as_expected"] == {"10": "50/50"}
    kinds = {v for i in range(10) for v in bench.submission(i, pristine())[1].values()}
    assert kinds == {"passed", "not attempted", "failed"}


@pytest.mark.slow  # two labs' templates: seconds
def test_a_file_named_like_one_lab_graded_holding_another_s_is_refused_under_its_name_s_lab(tmp_path):
    """alice/02_recompute.ipynb holding Lab 03's notebook beside alice/03_sqrt_n.ipynb, both labs graded: graded as
    Lab 03 it gave alice two Lab 03 submissions (one run's gradebook with every 3.x row twice, which merge refuses);
    it is Lab 02's row, saying whose notebook it is, and the real Lab 03 file is graded as Lab 03."""
    lab03 = answered(lab="03")
    wrong = save(lab03, tmp_path / "alice" / "02_recompute.ipynb")
    right = save(lab03, tmp_path / "alice" / "03_sqrt_n.ipynb")
    grade = grader.Grader(Options((), ("02", "03"), Limits(seed=1), sandbox=False, root=ROOT), [])
    try:
        lab, why = grade.identify(nbformat.read(wrong, as_version=4), wrong)
        assert lab == "02" and "the notebook of Lab 03 (03_sqrt_n.ipynb), not Lab 02" in why, (lab, why)
        assert grade.identify(nbformat.read(right, as_version=4), right) == ("03", "")
        renamed = save(lab03, tmp_path / "bob" / "untitled.ipynb")  # a name of no lab: its content says which
        assert grade.identify(nbformat.read(renamed, as_version=4), renamed) == ("03", "")
        rows = grade.grade(files.Returned(wrong, "alice"))
    finally:
        grade.close()
    assert {(r.lab, r.status) for r in rows} == {("02", "missing")} and len(rows) == len(EXERCISES), rows
