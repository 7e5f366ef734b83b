"""`python -m labkit grade SUBMISSIONS...`: grade a class of returned notebooks without trusting them.

Each submission is matched to its lab (by cell ids, else its file name), rebuilt from the pristine student
notebook with only its answer cells taken (rebuild.py), and run by nbclient (worker.py) in its own bubblewrap
sandbox and kernel (sandbox.py), with a cell timeout, a notebook time limit and a memory cap. What each
checker cell did becomes one row per student and exercise (report.py): passed, failed, not attempted,
timeout, error, missing or tampered, with the checker's one line. Nothing a submission does stops the run:
an unreadable file, a dead kernel, a loop or a notebook of another lab is that student's rows.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from tqdm.auto import tqdm

from labkit.course import release
from labkit.course.grade import report, sandbox
from labkit.course.grade.rebuild import Pristine, match, rebuild
from labkit.course.grade.report import Row

LIMITS = {"cell_timeout": 60.0, "notebook_timeout": 300.0, "memory_gib": 4.0, "profile": "tiny"}
EVENT_KEYS = {"cell", "status", "ename", "evalue", "stdout", "seconds"}


class GradeError(ValueError):
    """A grading run that cannot start: the message names the value and what is allowed."""


def discover(paths: list[Path]) -> list[Path]:
    """The notebooks named: files as given, folders searched (checkpoint copies left out)."""
    found = []
    for path in paths:
        if path.is_dir():
            found += [p for p in sorted(path.rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts]
        else:
            found.append(path)
    return found


def student_name(path: Path, stems: set[str], taken: set[tuple[str, str]]) -> str:
    """The file's stem, or its folder's name when the file is named like a lab; `name#2` for a second notebook
    of the same lab (by file name) under one name."""
    name = path.parent.name if path.stem in stems else path.stem
    lab = path.name[:2] if path.stem in stems else ""
    unique, n = name, 2
    while (unique, lab) in taken:
        unique, n = f"{name}#{n}", n + 1
    taken.add((unique, lab))
    return unique


class Grader:
    """One grading run: the pristine labs, a template kit per lab, the sandbox, the limits."""

    def __init__(self, root: Path, labs: list[str], limits: dict, jobs: int, hidden: list[Path],
                 use_sandbox: bool = True, executed: Path | None = None):
        self.labs, self.limits, self.executed = labs, limits, executed
        self.notebooks = {n: root / "notebooks" / p.name for n, p in release.labs(root).items()}
        self.pristine = {n: Pristine.read(n, p) for n, p in self.notebooks.items()}
        self.tmp = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
        self.templates = {lab: release.package(root, self.tmp / "kits" / lab, [lab]) for lab in labs}
        self.digests = {lab: sandbox.digest(t) for lab, t in self.templates.items()}
        threads = max(1, (os.cpu_count() or 1) // jobs)
        self.withheld = {lab: frozenset(m[:-3] for m in release.withheld(root, [lab])) for lab in labs}
        self.box = sandbox.Box.make(root / "labkit", hidden + [self.tmp], threads,
                                    limits["profile"]) if use_sandbox else None
        self.threads = threads

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def expected(self, path: Path) -> str | None:
        """The graded lab a file should be: the one its name says (`02_...`), or the only one graded."""
        by_name = path.name[:2] if path.name[2:3] == "_" else None
        return by_name if by_name in self.labs else self.labs[0] if len(self.labs) == 1 else None

    def identify(self, nb: nbformat.NotebookNode | None, path: Path) -> tuple[str | None, str]:
        """(lab to grade it as, or None; why it is not that lab's notebook, or "")."""
        expected = self.expected(path)
        scores = {lab: match(nb, p) for lab, p in self.pristine.items()} if nb is not None else {}
        best = max(scores, key=scores.get) if scores and max(scores.values()) >= 0.5 else None
        if best is not None and best not in self.labs:
            wanted = f"Lab {expected}" if expected else f"a lab graded here ({', '.join(self.labs)})"
            return expected, f"this is the notebook of Lab {best} ({self.notebooks[best].name}), not {wanted}"
        return best or expected, ""

    def rows_for(self, student: str, lab: str | None, status: str, message: str) -> list[Row]:
        if lab is None:
            return [Row(student, "?", "", status, message)]
        return [Row(student, lab, ex, status, message) for ex in self.pristine[lab].exercises]

    def grade(self, student: str, path: Path) -> list[Row]:
        """Every row of one submission; never raises for anything the submission holds."""
        try:
            return self._grade(student, path)
        except Exception as e:  # noqa: BLE001  (a file no check foresaw: this student's rows, not the class's run)
            return self.rows_for(student, self.expected(path), "error", f"could not be graded ({type(e).__name__}: {e})"[:300])

    def _grade(self, student: str, path: Path) -> list[Row]:
        nb, problem = None, ""
        try:
            nb = nbformat.reads(path.read_text(errors="replace"), as_version=4)
        except FileNotFoundError:
            problem = "missing: no such file"
        except Exception as e:  # noqa: BLE001  (invalid JSON, not a notebook, unreadable: this student's rows)
            problem = f"not a valid notebook ({type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''})"
        lab, other = self.identify(nb, path)
        if problem:
            return self.rows_for(student, lab, "missing" if problem.startswith("missing") else "error", problem)
        if other or lab is None:
            return self.rows_for(student, lab, "missing", other or "cannot tell which lab this notebook is")
        return self.run(student, lab, nb)

    def run(self, student: str, lab: str, nb: nbformat.NotebookNode) -> list[Row]:
        pristine = self.pristine[lab]
        built = rebuild(nb, pristine, self.withheld[lab])
        work = Path(tempfile.mkdtemp(prefix="sub-", dir=self.tmp))
        copy = work / "kit" / "labkit"
        shutil.copytree(self.templates[lab], copy)
        run = work / "run"
        run.mkdir()
        name = self.notebooks[lab].name
        nbformat.write(built.nb, run / name)
        decoys = {}
        if self.box:
            for i, hidden in enumerate(self.box.hidden):
                decoys[hidden] = work / "decoys" / str(i)
                decoys[hidden].mkdir(parents=True)
        events, ended = self._execute(copy, run, name, decoys)
        written = sandbox.changes(copy, self.digests[lab], decoys)
        if self.executed is not None and (run / "executed.ipynb").is_file():
            self.executed.mkdir(parents=True, exist_ok=True)
            shutil.copy(run / "executed.ipynb", self.executed / f"{student}.{name}")
        cells = [{"index": i, **c.metadata["labkit_grade"]} for i, c in enumerate(built.nb.cells)
                 if c.cell_type == "code"]
        shutil.rmtree(work, ignore_errors=True)
        return report.classify(student, lab, pristine.exercises, cells, events, built.flags, written, ended,
                               self.limits, built.lost)

    def _execute(self, copy: Path, run: Path, name: str, decoys: dict) -> tuple[dict[int, dict], str]:
        """Run the worker on run/name; (events by cell index, how it ended)."""
        read, write = os.pipe()
        inner_run = Path(sandbox.INNER_RUN) if self.box else run
        package = self.box.package if self.box else copy
        # the worker by its path, not `-m labkit.course.grade.worker`: importing the labkit package would import torch
        inner = [sys.executable, str(package / "course" / "grade" / "worker.py"), str(inner_run / name), "--fd", str(write),
                 "--cell-timeout", str(self.limits["cell_timeout"]), "--executed", str(inner_run / "executed.ipynb"),
                 "--memory", str(int(self.limits["memory_gib"] * 2**30))]
        if self.box:
            argv, env, cwd = self.box.argv(copy, run, decoys, inner), None, None
        else:
            env = dict(os.environ, PYTHONPATH=str(copy.parent), LABKIT_PROFILE=self.limits["profile"],
                       LABKIT_CHECKS="raise", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS=str(self.threads))
            argv, cwd = inner, run
        proc = subprocess.Popen(argv, env=env, cwd=cwd, pass_fds=(write,), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(write)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(os.fdopen(read, errors="replace")), daemon=True)
        reader.start()
        stderr: list[bytes] = []
        errors = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)
        errors.start()
        ended = "done"
        try:
            proc.wait(timeout=self.limits["notebook_timeout"])
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            ended = "killed"
        reader.join(timeout=10)
        errors.join(timeout=10)
        events = {}
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and set(ev) == EVENT_KEYS and isinstance(ev["cell"], int) \
                    and all(isinstance(ev[k], str) for k in EVENT_KEYS - {"cell", "seconds"}):
                events[ev["cell"]] = ev
        done = bool(lines) and lines[-1].strip() == json.dumps({"done": True})
        if ended == "done" and (proc.returncode != 0 or not done):
            tail = (b"".join(stderr).decode(errors="replace").strip().splitlines() or [""])[-1][:200]
            ended = f"the grader's worker stopped early (status {proc.returncode}): {tail}"
            events = {}  # a worker that did not finish vouches for nothing it wrote
        return events, ended


def grade(root: Path, paths: list[Path], labs: list[str], limits: dict, jobs: int, hidden: list[Path],
          use_sandbox: bool = True, executed: Path | None = None, progress: bool = True) -> list[Row]:
    """Rows for every submission under `paths`, graded `jobs` at a time."""
    if use_sandbox:
        problem = sandbox.unusable()
        if problem:
            raise GradeError(f"{problem}; --no-sandbox grades without it, for notebooks you trust")
    hidden = hidden + [p if p.is_dir() else p.parent for p in paths] + ([executed] if executed else [])
    grader = Grader(root, labs, limits, jobs, hidden, use_sandbox, executed)
    stems, taken = {p.stem for p in grader.notebooks.values()}, set()
    other_labs = {p.stem for n, p in grader.notebooks.items() if n not in labs}
    files = [p for p in discover(paths) if p.stem not in other_labs]  # alice/01_...: not graded in this run
    named = [(student_name(p, stems, taken), p) for p in files]
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = pool.map(lambda sp: grader.grade(*sp), named)
            rows = [r for rs in tqdm(results, total=len(named), desc="grading", unit="notebook",
                                     disable=not progress) for r in rs]
    finally:
        grader.close()
    return rows
