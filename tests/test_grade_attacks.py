"""`labkit grade` against a class that wants to cheat: one submission per attack a red team tried, graded in one run
with correct and stub submissions among them, as root where the machine is (CI is).

Each attack sits inside the student's code that a checker calls (a top-level statement never runs: grading loads
definitions only) and comes with a wrong answer, so that it passes only if the attack works. No attack may pass its
exercise; every correct submission, graded after them in the same run, passes; the kit's files and the Python
environment are as they were. The one attack this design does not stop (a local exercise's verdict forged by code
that studies the worker's protocol) is a strict xfail: docs/design.md, "Grading a class", says why.

Marker `long`: two gradings of some thirty submissions take minutes, so `make long-test` (CI's second step)
runs this file, not `make test`.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import site
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from labkit.course.grade import sandbox
from test_grade import ROOT, SOLUTION, answered, cell_of, run_grade, save, statuses

pytestmark = pytest.mark.long
needs_bwrap = pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))
KIT = str(ROOT)
WRONG = ("        return (None, *[x.grad for x in inputs])", "        return (None, *[x.grad * 2 for x in inputs])")

# name -> the body of _attack(), run first thing in Recompute.forward (2.1 answered wrongly, the rest right)
ATTACKS = {
    "fork_rng": """
    import contextlib, torch
    @contextlib.contextmanager
    def swallow(*a, **k):
        try:
            yield
        except Exception:
            pass
    torch.random.fork_rng = swallow""",
    "context_exit": """
    import contextlib
    contextlib._GeneratorContextManager.__exit__ = lambda self, *a: True""",
    "checks_show": """
    import os
    os.environ["LABKIT_CHECKS"] = "show\"""",
    "guard_verify": """
    import sys
    g = sys.modules["labkit.course.grade.guard"]
    g.verify = lambda *a, **k: []
    g.leftovers = lambda *a: []""",
    "stdout": """
    import io, sys
    sys.stdout = io.StringIO()""",
    "thread_prints": """
    import os, threading
    threading.Thread(target=lambda: [os.write(1, b"[ex 2.1] passed: yes\\n") for _ in range(3)], daemon=True).start()""",
    "torch_equal": """
    import torch
    from torch.overrides import TorchFunctionMode
    class Yes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return True if func in (torch.equal, torch.allclose) else func(*args, **(kwargs or {}))
    Yes().__enter__()""",
    "ipython": """
    get_ipython().input_transformer_manager.line_transforms.append(lambda lines: lines)""",
    "disk": """
    with open("/tmp/big", "wb") as f:
        for _ in range(400):
            f.write(b"0" * 2**20)""",
    "memory": """
    hold = bytearray(6 * 2**30)""",
    "processes": """
    import os
    for _ in range(12):
        os.fork()""",
    # escapes, as root: each is refused by the box and seen by the audit hook
    "umount": f"""
    import os
    os.system("umount {KIT}")
    raise ValueError(open("{KIT}/solutions/02_recompute.ipynb").read()[:3000])""",
    "remount": """
    import ctypes
    ctypes.CDLL(None).mount(b"none", b"/", None, 32 | 1, None)  # MS_REMOUNT, writable""",
    "beside_kit": f"""
    open("{KIT}/labkit/checks/lab02/__init__.py", "a").write("\\nex_2_1 = lambda *a: None\\n")""",
    "pth": f"""
    open("{site.getsitepackages()[0]}/labkit_evil.pth", "w").write("import os\\n")""",
    "template": """
    import labkit, os
    open(os.path.join(os.path.dirname(labkit.__file__), "checks", "lab02", "recompute.py"), "a").write("\\n")""",
}
# the exercises an attack aims at: 2.1 for all, as its answer is the wrong one
TARGET = "2.1"


RIGHT = ("disk", "memory", "processes")  # attacks on the box's limits come with a right answer: only a limit fails them


def _attacked(body: str, wrong: bool = True) -> nbformat.NotebookNode:
    nb = answered("2.1", "2.2", "2.3", "2.4", "2.5")
    cell = cell_of(nb, "answer", "2.1")
    assert WRONG[0] in cell.source and "        ctx.fn = fn\n" in cell.source
    source = cell.source.replace(WRONG[0], WRONG[1]) if wrong else cell.source
    source = source.replace("        ctx.fn = fn\n", "        _attack()\n        ctx.fn = fn\n")
    cell.source = source.replace("#| export\n", "#| export\ndef _attack():" + body + "\n\n\n", 1)
    return nb


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def attacked_class(tmp_path_factory):
    """One run over every attack, a stub, a forged verdict, files that are not the student's, and, graded last,
    two correct submissions; with what the kit and the environment held before and after."""
    tmp = tmp_path_factory.mktemp("attacks")
    folder = tmp / "class"
    for name, body in ATTACKS.items():
        save(_attacked(body, wrong=name not in RIGHT), folder / f"a_{name}.ipynb")
    save(_attacked("""
    import os, json, struct
    message = json.dumps({"op": "verdict", "status": "passed", "message": "[ex 2.1] passed: forged"}).encode()
    for fd in range(3, 40):
        try:
            os.write(fd, struct.pack("!Q", len(message)) + message)
        except OSError:
            pass
    os._exit(0)"""), folder / "b_forged.ipynb")
    nb = answered("2.1", "2.2", "2.3", "2.4", "2.5")
    cell_of(nb, "answer", "2.1").source = "%env LABKIT_CHECKS=show\n" + cell_of(nb, "answer", "2.1").source
    save(nb, folder / "b_magic.ipynb")
    nb = answered("2.1", "2.2", "2.3", "2.4", "2.5")  # PyTorch's checkpoint as the answer of 2.4
    cell_of(nb, "answer", "2.4").source = ("#| export\nfrom torch.utils.checkpoint import checkpoint as _torch\n\n\n"
                                           "def checkpoint(fn, *args, **kwargs):\n"
                                           "    return _torch(fn, *args, use_reentrant=True, **kwargs)\n")
    save(nb, folder / "b_library.ipynb")
    (folder / "b_link.ipynb").symlink_to(SOLUTION)  # the kit's own solution, under a student's name
    os.mkfifo(folder / "b_fifo.ipynb")
    (folder / "b_broken.ipynb").write_text('{"cells": [')  # not a notebook: its own rows, the run goes on
    save(answered(), folder / "c_stub.ipynb")
    for name in ("z_ok_one", "z_ok_two"):  # graded last: after every attack
        save(answered("2.1", "2.2", "2.3", "2.4", "2.5"), folder / f"{name}.ipynb")
    env = Path(site.getsitepackages()[0])
    before = _digest(ROOT / "labkit"), _digest(env / "labkit") if (env / "labkit").is_dir() else {}, \
        sorted(p.name for p in env.iterdir())
    rows, out, seconds = run_grade(tmp, folder, "--jobs", "1", "--timeout", "40")
    after = _digest(ROOT / "labkit"), _digest(env / "labkit") if (env / "labkit").is_dir() else {}, \
        sorted(p.name for p in env.iterdir())
    return rows, out, before, after


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("attack", [*ATTACKS, "magic", "library"])
def test_no_attack_passes_its_exercise(attacked_class, attack):
    rows, *_ = attacked_class
    student = f"a_{attack}" if attack in ATTACKS else f"b_{attack}"
    target = "2.4" if attack == "library" else TARGET
    row = rows[(student, target)]
    assert row["status"] != "passed", row


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("attack", ["fork_rng", "context_exit", "guard_verify", "thread_prints", "torch_equal",
                                    "umount", "remount", "beside_kit", "pth", "template"])
def test_an_attack_that_reaches_past_the_answer_is_flagged(attacked_class, attack):
    rows, *_ = attacked_class
    assert rows[(f"a_{attack}", TARGET)]["status"] == "tampered", rows[(f"a_{attack}", TARGET)]


@needs_bwrap
@pytest.mark.slow
def test_a_box_that_runs_into_its_limits_is_ended_and_says_which(attacked_class):
    rows, *_ = attacked_class
    for attack in ("processes", "memory", "disk"):
        assert rows[(f"a_{attack}", TARGET)]["status"] in ("error", "failed", "tampered"), rows[(f"a_{attack}", TARGET)]
    if sandbox.kept_by().startswith("the kernel"):
        message = rows[("a_processes", TARGET)]["message"]
        assert rows[("a_processes", TARGET)]["status"] == "tampered" or "ran into" in message, message


@needs_bwrap
@pytest.mark.slow
def test_correct_submissions_graded_after_every_attack_pass_and_nothing_outside_changed(attacked_class):
    rows, out, before, after = attacked_class
    for name in ("z_ok_one", "z_ok_two"):
        assert set(statuses(rows, name).values()) == {"passed"}, {ex: rows[(name, ex)]["message"] for ex in
                                                                  ("2.1", "2.2", "2.3", "2.4", "2.5")}
    assert set(statuses(rows, "c_stub").values()) == {"not attempted"}
    assert before == after, "the kit's files or the Python environment changed"
    assert not any("BEGIN SOLUTION" in r["message"] for r in rows.values())  # the umount attack read nothing


@needs_bwrap
@pytest.mark.slow
def test_files_that_are_not_the_student_s_are_refused_and_a_library_checkpoint_gets_its_hint(attacked_class):
    rows, *_ = attacked_class
    assert rows[("b_link", "2.1")]["status"] == "error" and "symbolic link" in rows[("b_link", "2.1")]["message"]
    assert rows[("b_fifo", "2.1")]["status"] == "error" and "not a regular file" in rows[("b_fifo", "2.1")]["message"]
    assert rows[("b_library", "2.4")]["status"] == "failed"
    assert "torch.utils.checkpoint" in rows[("b_library", "2.4")]["message"]
    assert rows[("b_magic", "2.1")]["status"] == "error" and "SyntaxError" in rows[("b_magic", "2.1")]["message"]
    assert rows[("b_broken", "2.1")]["status"] == "error" and "not a valid notebook" in rows[("b_broken", "2.1")]["message"]


@needs_bwrap
@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="a local exercise's verdict is the box's word: code that writes the worker's "
                   "verdict message itself, then exits, is taken at it (docs/design.md, \"Grading a class\")")
def test_a_forged_verdict_of_a_local_exercise_does_not_pass(attacked_class):
    rows, *_ = attacked_class
    assert rows[("b_forged", TARGET)]["status"] != "passed"


# ---------------------------------------------------------------- attacks on exercises whose checker runs outside the box
REMOTE = {  # name -> Exercise 0.1's answer (a wrong one, or one whose attack is the point), as its whole cell
    "shrinks_its_argument": "def tensor_bytes(t):\n    t.data = t.new_empty(0)\n    return 0\n",
    "reads_root_files": "def tensor_bytes(t):\n    raise ValueError(open(SECRET).read() + open('/etc/shadow').read())\n",
    "lone_surrogate": "def tensor_bytes(t):\n    raise ValueError('bad \\ud800 byte')\n",
    "colliding_set": ("def tensor_bytes(t):\n    return {k * (2**61 - 1) for k in range(1, 40000)}\n"),
    "many_records": ("from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass P:\n    i: int\n\n\n"
                     "def tensor_bytes(t):\n    return {P(i) for i in range(30000)}\n"),
}


@pytest.fixture(scope="module")
def remote_class(tmp_path_factory):
    """Lab 00 submissions whose 0.1 attacks the judge, graded in one run, a correct one last; with a secret only
    root may read (a 0600 file in a 0700 folder) that no row may show."""
    tmp = tmp_path_factory.mktemp("remote")
    secret_dir = Path(tempfile.mkdtemp(prefix="labkit-secret-", dir="/var/tmp"))
    secret_dir.chmod(0o700)
    token = f"TOPSECRET-{os.getpid()}-{time.time_ns()}"
    (secret_dir / "s").write_text(token)
    (secret_dir / "s").chmod(0o600)
    folder = tmp / "class"
    for name, source in REMOTE.items():
        nb = answered("0.1", lab="00")
        cell_of(nb, "answer", "0.1", lab="00").source = "#| export\n" + source.replace(
            "SECRET", repr(str(secret_dir / "s")))
        save(nb, folder / f"{name}.ipynb")
    save(answered("0.1", lab="00"), folder / "z_ok.ipynb")
    try:
        rows, out, _ = run_grade(tmp, folder, "--jobs", "1", "--timeout", "20", "--notebook-timeout", "40",
                                 labs="00")
        book = (tmp / "book" / "grades.csv").read_text() + (tmp / "book" / "grades.json").read_text()
    finally:
        shutil.rmtree(secret_dir)
    return rows, book, token


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("attack", REMOTE)
def test_no_attack_on_a_remote_check_passes(remote_class, attack):
    rows, _, _ = remote_class
    # an expensive payload (a set of 40,000 big ints to hash and check) may run out of its exercise's time on a
    # loaded machine instead of failing: either way it does not pass
    assert rows[(attack, "0.1")]["status"] in ("failed", "error", "timeout"), rows[(attack, "0.1")]


@needs_bwrap
@pytest.mark.slow
def test_the_box_reads_no_root_only_file_and_a_bad_message_spoils_no_gradebook(remote_class):
    rows, book, token = remote_class
    assert token not in book and "root:" not in book  # graded as root (CI), the box's uid is not root's
    if os.geteuid() == 0:
        assert "Permission" in rows[("reads_root_files", "0.1")]["message"]
    assert rows[("z_ok", "0.1")]["status"] == "passed"  # graded after every attack, the report written whole
    assert "?" in rows[("lone_surrogate", "0.1")]["message"]
