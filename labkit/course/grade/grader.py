"""The grading run: the pristine labs, a template kit per lab, the judges, one submission after another.

`run(Options) -> Gradebook` (options.py) is `python -m labkit grade`: each returned file (files.py) is matched to
its lab, rebuilt (rebuild.py) and sent, as a job, to a judge (judge.py), which runs it in a box (sandbox.py,
worker.py); the rows come back (report.py).
"""
from __future__ import annotations

import json
import os
import queue
import select
import shutil
import site
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from tqdm.auto import tqdm

from labkit.course import release
from labkit.course.catalog import LABS
from labkit.course.grade import files, leaderboard, messages, report, sandbox, shards
from labkit.course.grade.rebuild import Pristine, match, program, rebuild
from labkit.course.grade.options import Gradebook, Options
from labkit.course.grade.report import Row
from labkit.env import variables

# seconds a judge may take beyond a notebook's limit and one exercise's (the limit is checked between exercises):
# starting the box, ending it, decoding; past them the judge is ended
JUDGE_MARGIN = 60.0


class GradeError(ValueError):
    """A grading run that cannot start: the message names the value and what is allowed."""


class JudgeProcess:
    """A judge in a process of its own (python -m labkit.course.grade.judge), serving one job slot."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.proc = self._start()

    @staticmethod
    def _start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "labkit.course.grade.judge"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True,
                                env=variables.for_child(os.environ, profile="tiny"))

    def grade(self, request: dict, seconds: float) -> dict:
        """The judge's answer to `request` (messages.REQUESTS' "grade": held to it before it is sent, the answer to
        ANSWERS' "graded" when it comes back); past `seconds` the judge (and with it its box) is ended and a fresh one
        takes the slot, so that no submission holds the class's run, whatever the judge was doing. A judge that
        died (before this request or while serving it) is replaced too: one submission never fails the next."""
        if self.proc.poll() is not None:
            self._restart()
        try:
            self.proc.stdin.write(json.dumps(messages.checked(messages.REQUESTS, request, ["grade"])) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            status = self._restart()
            raise RuntimeError(f"the judge of slot {self.slot} had stopped (status {status}); a new one grades "
                               "the next") from None
        if not select.select([self.proc.stdout], [], [], seconds)[0]:
            self._restart()
            raise RuntimeError(f"its grading ran past {seconds:g} s (the notebook's limit and a margin)")
        line = self.proc.stdout.readline()
        if not line:  # its answer pipe closed: ended, or alive without one (ended now)
            status = self._restart()
            raise RuntimeError(f"the judge of slot {self.slot} stopped answering (exit status {status}, None: "
                               "it was still running and was ended); a new one grades the next")
        try:
            return messages.checked(messages.ANSWERS, json.loads(line), ["graded"])
        except ValueError as e:  # not JSON, or not an answer: a judge's bug, this submission's error
            raise RuntimeError(f"the judge of slot {self.slot} answered out of protocol ({str(e)[:200]})") from None

    def _restart(self) -> int | None:
        """End this slot's judge (if it still runs: never waited for) and its boxes' groups, and start a fresh
        one; the old one's exit status (None: it was running, and was killed)."""
        pid, status = self.proc.pid, self.proc.poll()
        if status is None:
            self.proc.kill()
        self.proc.wait()
        sandbox.Cgroups.remove_left(f"labkit-box-{pid}-")  # its boxes' groups, which it can no longer remove
        self.proc = self._start()
        return status

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Grader:
    """One grading run: the pristine labs, a template kit per lab, the box, the judges, the limits."""

    def __init__(self, options: Options, hidden: list[Path]) -> None:
        """The run `options` asks for, each box covering `hidden`."""
        root, jobs, limits = options.root, options.jobs, options.limits
        self.labs, self.limits, self.executed, self.jobs = list(options.labs), limits, options.executed, jobs
        self.race, self.raced = options.race, {}  # the leaderboard's race (lab 07), and student -> what came of it
        self.seed = limits.seed
        self.catalog = {lab.number: lab for lab in LABS}
        self.notebooks = {n: lab.student(root) for n, lab in self.catalog.items()}
        self.pristine = {n: Pristine.read(n, p) for n, p in self.notebooks.items()}
        self.withheld = {lab: frozenset(m[:-3] for m in release.withheld(root, [lab])) for lab in self.labs}
        self.tmp = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
        self.tmp.chmod(0o755)  # the box's uid reads the kits and jobs in here
        self.templates = {lab: release.package(root, self.tmp / "kits" / lab, [lab]) for lab in self.labs}
        (self.tmp / "jobs").mkdir()
        threads = max(1, (os.cpu_count() or 1) // jobs)
        self.box = sandbox.Box.make(root / "labkit", hidden + [self.tmp], threads, limits.profile) \
            if options.sandbox else None
        if self.box is not None:
            self.box.env.update(_imports(self.box.package))
        self.threads = threads
        self.judges: queue.Queue = queue.Queue()
        for slot in range(jobs):
            self.judges.put(JudgeProcess(slot))

    def close(self) -> None:
        while not self.judges.empty():
            self.judges.get().close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def expected(self, path: Path) -> str | None:
        """The graded lab a file should be: the one its name says (`02_...`), or the only one graded."""
        by_name = path.name[:2] if path.name[2:3] == "_" else None
        return by_name if by_name in self.labs else self.labs[0] if len(self.labs) == 1 else None

    def identify(self, nb: nbformat.NotebookNode | None, path: Path) -> tuple[str | None, str]:
        """(lab to grade it as, or None; why it is not that lab's notebook, or ""). A file named like a lab graded
        here is that lab's submission whatever it holds (another lab's notebook is refused under the lab its name
        says): its student's name is unique per that lab only (files.discover), and grading it as another lab
        would give that lab two submissions of one name."""
        expected = self.expected(path)
        scores = {lab: match(nb, p) for lab, p in self.pristine.items()} if nb is not None else {}
        best = max(scores, key=scores.get) if scores and max(scores.values()) >= 0.5 else None
        named = next((n for n, p in self.notebooks.items() if p.stem == path.stem), None)  # the lab its name says
        if best is not None and named in self.labs and best != named:
            return named, (f"this is the notebook of Lab {best} ({self.notebooks[best].name}), not Lab {named}, "
                           f"as its name {path.name} says")
        if best is not None and best not in self.labs:
            wanted = f"Lab {expected}" if expected else f"a lab graded here ({', '.join(self.labs)})"
            return expected, f"this is the notebook of Lab {best} ({self.notebooks[best].name}), not {wanted}"
        return best or expected, ""

    def rows_for(self, student: str, lab: str | None, status: str, message: str) -> list[Row]:
        if lab is None:
            return [Row(student, "?", "", status, message)]
        return [Row(student, lab, ex, status, message) for ex in self.pristine[lab].exercises]

    def grade(self, returned: files.Returned) -> list[Row]:
        """Every row of one submission; never raises for anything the submission holds."""
        try:
            return self._grade(returned)
        except Exception as e:  # noqa: BLE001  (a file no check foresaw: this student's rows, not the class's run)
            return self.rows_for(returned.student, self.expected(returned.path), "error",
                                 f"could not be graded ({type(e).__name__}: {e})"[:300])

    def _grade(self, returned: files.Returned) -> list[Row]:
        student, path = returned.student, returned.path
        if returned.refused:
            kind = "missing" if returned.refused.startswith("missing") else "error"
            return self.rows_for(student, self.expected(path), kind, returned.refused)
        nb, problem = None, ""
        try:
            nb = nbformat.reads(files.read_text(path), as_version=4)
        except OSError as e:
            problem = f"cannot be read ({e})"
        except Exception as e:  # noqa: BLE001  (invalid JSON, not a notebook: this student's rows)
            problem = f"not a valid notebook ({type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''})"
        lab, other = self.identify(nb, path)
        if problem:
            return self.rows_for(student, lab, "error", problem)
        if other or lab is None:
            return self.rows_for(student, lab, "missing", other or "cannot tell which lab this notebook is")
        return self.run(student, lab, nb)

    def job(self, lab: str, nb: nbformat.NotebookNode) -> tuple[dict, dict, dict, set]:
        """(the job the box runs, scan flags per exercise, statements left out per exercise, lost exercises)."""
        pristine, entry = self.pristine[lab], self.catalog[lab]
        built = rebuild(nb, pristine, self.withheld[lab])
        cells, dropped = program(built, pristine)
        checks = entry.checkers
        exercises = [{"id": ex, "checker": pristine.calls[ex][0], "args": pristine.calls[ex][1],
                      "mode": "remote" if getattr(getattr(checks, pristine.calls[ex][0]), "remote", False) else "local",
                      "seed": self.seed} for ex in pristine.exercises]
        job = {"lab": lab, "module": entry.module, "notebook": entry.notebook, "checks": entry.checks,
               "program": cells, "exercises": exercises}
        return job, built.flags, dropped, built.lost

    def run(self, student: str, lab: str, nb: nbformat.NotebookNode) -> list[Row]:
        job, flags, dropped, lost = self.job(lab, nb)
        job_file = Path(tempfile.mkstemp(dir=self.tmp / "jobs", suffix=".json")[1])
        job_file.write_text(json.dumps(job))
        job_file.chmod(0o644)
        judge = self.judges.get()
        try:
            request = self.request(lab, job, job_file, judge.slot)
            race = 0.0 if request["race"] is None else JUDGE_MARGIN + leaderboard.race_seconds(
                self.race["step"], len(self.race["budgets"]), self.limits.cell_timeout)  # the judge's own limit
            answer = judge.grade(request, self.limits.notebook_timeout + self.limits.cell_timeout + JUDGE_MARGIN
                                 + race)
        finally:
            self.judges.put(judge)
            job_file.unlink(missing_ok=True)
        if answer["race"] is not None:
            self.raced[student] = answer["race"]
        if self.executed is not None:
            self._keep(student, lab, job, answer)
        return report.rows(student, lab, self.pristine[lab].exercises, answer["outcomes"], answer["ended"], flags,
                           dropped, lost)

    def request(self, lab: str, job: dict, job_file: Path, slot: int) -> dict:
        """The judge's request for one submission of `lab` (messages.REQUESTS' "grade"): its job, the limits, the
        box's CPU share (watch.py), the worker's command line and, for lab 07 with a race, the race (to the judge
        only: the box never reads the reference plans)."""
        command = self._command(lab, job_file, slot)
        race = self.race if self.race is not None and lab == leaderboard.LAB else None
        return messages.make(messages.REQUESTS, "grade", job=job, limits=self.limits.as_json(), cpus=self.threads,
                             argv=command["argv"], env=command.get("env"), cwd=command.get("cwd"), race=race)

    def _command(self, lab: str, job_file: Path, slot: int) -> dict:
        """The worker's command line, in its box (or, without one, on a copy of the kit in a folder of its own)."""
        memory = str(int(self.limits.memory_gib * 2**30))
        if self.box is not None:
            inner = [sys.executable, str(self.box.package / "course" / "grade" / "worker.py"), sandbox.INNER_JOB,
                     "--memory", memory]
            return {"argv": self.box.argv(self.templates[lab], job_file, slot, inner)}
        kit = self.templates[lab]
        work = Path(tempfile.mkdtemp(prefix="run-", dir=self.tmp))
        env = dict(variables.for_child(os.environ, profile=self.limits.profile),  # no box: never said to be one
                   PYTHONPATH=str(kit.parent),
                   PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS=str(self.threads), MPLBACKEND="Agg")
        return {"argv": [sys.executable, str(kit / "course" / "grade" / "worker.py"), str(job_file), "--memory", memory],
                "env": env, "cwd": str(work)}

    def _keep(self, student: str, lab: str, job: dict, answer: dict) -> None:
        """What was run for `student` and what came of it, as JSON in --executed, written without following links."""
        name = "".join(c if c.isalnum() or c in "-_.#" else "_" for c in student)[:100]
        target = self.executed / f"{name}.{lab}.json"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump({"student": student, "lab": lab, "program": job["program"], **answer}, f, indent=1)


def preflight(grader: Grader) -> str | None:
    """Why the boxes would not grade with the kit the grader prepared (another checkout's labkit on the path,
    say), or None: a box imports labkit and says where from."""
    lab = grader.labs[0]
    probe = "import labkit, sys; print(labkit.__file__)"
    if grader.box is not None:
        argv = grader.box.argv(grader.templates[lab], grader.tmp / "jobs", 0, [sys.executable, "-c", probe])
        env, want = None, grader.box.package / "__init__.py"
    else:
        argv = [sys.executable, "-c", probe]
        env = dict(os.environ, PYTHONPATH=str(grader.templates[lab].parent))
        want = grader.templates[lab] / "__init__.py"
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=grader.tmp, timeout=120)
    where = done.stdout.strip()
    if done.returncode != 0 and not where:  # the box (or Python in it) did not start: nothing was imported at all
        return (f"a box could not start Python with the kit ({done.stderr.strip()[-300:] or f'exit {done.returncode}'})"
                "; nothing was graded")
    if done.returncode != 0 or Path(where) != want:
        return (f"a box imports labkit from {where or '(nowhere: ' + done.stderr.strip()[-200:] + ')'}, not from the "
                f"copy the grader prepared ({want}): another checkout's labkit is installed in this environment "
                "(an editable install pointing elsewhere?); grade from that checkout, or reinstall this one")
    return None


def _class(paths: list[Path], labs: list[str]) -> list[files.Returned]:
    """Every submission of the labs graded under `paths`, and a `missing` one for each student of the class
    collect recorded there who has none (files.absent); a path that does not exist, or a class with nothing to
    grade, is refused naming it (a typo would otherwise be a gradebook of one student, all missing)."""
    gone = [str(p) for p in paths if not os.path.lexists(p)]
    if gone:
        raise GradeError(f"{', '.join(gone)}: no such file or folder; give the class's folder (collect's --out) "
                         "or its notebooks")
    notebooks = {lab.number: lab.notebook for lab in LABS}
    stems = {name.removesuffix(".ipynb") for name in notebooks.values()}
    others = {name.removesuffix(".ipynb") for n, name in notebooks.items() if n not in labs}
    returned = [r for r in files.discover(paths, stems) if r.path.stem not in others]
    try:
        recorded = files.read_class(paths, stems)
    except ValueError as e:
        raise GradeError(str(e)) from None
    returned += files.absent(recorded, returned, {n: notebooks[n] for n in labs}, stems)
    if not returned:
        raise GradeError(f"nothing to grade in {', '.join(map(str, paths))}: no notebook, and no class that "
                         f"labkit collect recorded ({files.CLASS_FILE}); give the class's folder (collect's --out)")
    return returned


def _imports(package: Path) -> dict[str, str]:
    """What a box's Python is told so that it imports what the grader's does: the kit's folder first, and the user
    site the grader reads, if it reads one. `make hub` installs the kit and its dependencies there (--user), under
    a HOME the box never reads (its own is /tmp/home), so every box said "No module named 'labkit'"; the site is
    bound back inside with the rest of the environment (sandbox.Box.restores)."""
    env = {"PYTHONPATH": str(package.parent)}
    if site.ENABLE_USER_SITE and site.getusersitepackages() in sys.path:
        env["PYTHONUSERBASE"] = site.getuserbase()
    return env


def _coverable(folder: Path) -> bool:
    """Whether a box may cover `folder` with an empty one: not /tmp, nor a folder above it. The box's /tmp is a
    tmpfs of its own, where its job is put (a cover over it made that fail: "bwrap: Can't mkdir /tmp/job.json"),
    and what the host keeps in its /tmp, a class graded from there included, the box never sees."""
    tmp = Path("/tmp").resolve()
    return not _under(tmp, folder.resolve())


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def run(options: Options) -> Gradebook:
    """Grade the class `options` gives, `options.jobs` submissions at a time: every row, in the gradebook's order
    (report.ordered); with a shard, only the students of its part (shards.part_of: named as in the whole class first);
    with a race, each lab 07 planner raced too. A run that cannot start raises GradeError, naming why."""
    returned = _class(list(options.paths), list(options.labs))
    if options.sandbox:
        problem = sandbox.unusable()
        if problem:
            raise GradeError(f"{problem}; --no-sandbox grades without it, for notebooks you trust")
    if options.executed is not None:
        options.executed.mkdir(parents=True, exist_ok=True)  # made before the first box, so every box has it covered
    grader = Grader(options, _hidden(options))
    try:
        problem = preflight(grader)
        if problem:
            raise GradeError(problem)
        roster = [r.student for r in returned]  # the whole class: merge checks that the parts cover it
        rows = _graded(grader, _part(returned, options.shard), options)
    finally:
        grader.close()
    return Gradebook(report.ordered(rows), roster, grader.raced if options.race is not None else None)


def _hidden(options: Options) -> list[Path]:
    """What every box covers: what the options name, the class's folders and --executed, but /tmp (_coverable)."""
    paths = list(options.paths)
    hidden = [*options.hidden, *(p if p.is_dir() else p.parent for p in paths),
              *([options.executed] if options.executed else [])]
    return [h for h in hidden if _coverable(h)]


def _part(returned: list[files.Returned], shard: tuple[int, int] | None) -> list[files.Returned]:
    """The submissions of part K of N (all of them without a shard); N beyond the class is refused."""
    if shard is None:
        return returned
    names = [r.student for r in returned]
    if shards.oversplit(shard, names):
        raise GradeError(shards.oversplit(shard, names))
    return [r for r in returned if shards.part_of(r.student, shard[1]) == shard[0]]


def _graded(grader: Grader, returned: list[files.Returned], options: Options) -> list[Row]:
    """Every row of `returned`, graded options.jobs at a time; what the class's files could not say is said first."""
    for r in returned:
        if r.note:  # two files that would take one name: both graded, the second named apart
            print(f"labkit grade: {r.note}", file=sys.stderr)
    for link in files.linked_folders(list(options.paths)):
        print(f"labkit grade: {link} is a link to a folder, not searched (links are never followed): give the "
              "folder it points to, if it holds the class's notebooks", file=sys.stderr)
    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        results = pool.map(grader.grade, returned)
        return [r for rs in tqdm(results, total=len(returned), desc="grading", unit="notebook",
                                 disable=not options.progress) for r in rs]
