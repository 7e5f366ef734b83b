"""The leaderboard's judge: a submission that breaks the judge never fails the next one, and the race (lab 07's
planners timed by worker.race) runs alone in its box, within a time limit sized from the model's step.

The first tests run nothing in a box (a judge whose grading raises, the race's limit with a fake box); the long
ones grade lab 07 submissions through the judge in this process: a planner whose plans hold tensors, then one whose
exercise leaves a process behind (without the sandbox: it leaves the worker's tree), and, in bubblewrap as root, a
process in the box's pid namespace that no exercise's reap saw (put there by the test, as a process that forks
faster than a reap reads /proc would be)."""
from __future__ import annotations

import base64
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from labkit.course.grade import calls, grader, judge, leaderboard, messages, sandbox
from labkit.course.grade.options import Limits, Options
from labkit.plans import BlockCosts, Profile

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "07_capstone.ipynb"
MARKER = "labkit-left-behind"  # in the command line of the process a submission leaves behind
needs_bwrap = pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))


class _Box:
    """A box that answers nothing: the race's process ended past its time limit."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.deadline, self.ended = 0.0, {}

    def send(self, message: dict) -> None:
        self.sent.append(message)

    def from_child(self, ops=None) -> dict:
        self.ended = {"op": "ended", "how": "timeout", "status": -9}
        raise judge.BoxGone("ended: timeout")


def test_a_submission_whose_grading_raises_is_its_own_error_and_the_judge_serves_the_next(monkeypatch):
    """json.dumps of a plan holding a tensor ended the judge's process, and with it every later submission of its
    job slot: whatever grading one submission raises is that submission's error."""
    def run(self, argv, job, env=None, cwd=None, race=None):
        if job["n"] == 0:
            raise TypeError("Object of type Tensor is not JSON serializable")
        self.raced = {"budgets": []}
        return {"7.1": judge.Outcome("passed", "[ex 7.1] passed", 1.0)}, ""
    monkeypatch.setattr(judge.Judge, "run", run)
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # serve() points it at stderr
    limits = Limits(memory_gib=1.0, processes=8, seed=1).as_json()
    lines = "".join(json.dumps(messages.make(messages.REQUESTS, "grade", job={"n": n}, limits=limits, cpus=None, argv=[],
                                             env=None, cwd=None, race={"budgets": []})) + "\n" for n in range(2))
    out = io.StringIO()
    judge.serve(io.StringIO(lines), out)
    first, second = map(json.loads, out.getvalue().splitlines())
    assert first["outcomes"] == {} and "TypeError: Object of type Tensor" in first["ended"], first
    assert first["race"]["why"].startswith("not raced: ") and "TypeError" in first["race"]["why"]
    assert second == {"op": "graded", "outcomes": {"7.1": {"status": "passed", "message": "[ex 7.1] passed",
                                                           "seconds": 1.0}}, "ended": "", "race": {"budgets": []}}


def test_the_race_s_limit_grows_with_the_model_s_step_and_its_timeout_says_what_it_was(monkeypatch):
    """At 10 s a step, five steps' worth of budgets do not fit an exercise's 60 s: the race is given time for its
    steps, and a race past its limit says which limit it was."""
    profile = Profile((BlockCosts(4, 1, 1.0), BlockCosts(4, 1, 1.0)), 0, 0, 10.0)
    race = {"profile": base64.b64encode(pickle.dumps(profile)).decode(), "budgets": [100, 200],
            "reference": {"100": [[0, 2, "recompute"]], "200": [[0, 2, "recompute"]]}}
    planned = {b: {"steps": [[0, 2, "recompute"]], "plan": "recompute 0-1"} for b in (100, 200)}
    monkeypatch.setattr(judge.Judge, "_plans", lambda self, channel, job, profile, budgets: planned)
    box = _Box()
    start = time.monotonic()
    raced = judge.Judge(60.0, 2**30, 8, 300.0)._race(box, {}, race)
    limit = box.sent[0].get("seconds")
    assert box.sent[0]["op"] == "race" and isinstance(limit, float), box.sent
    assert limit == leaderboard.SLACK * leaderboard.race_steps(2) * 10.0 > 60  # its steps at the profile's step
    assert box.deadline >= start + limit
    assert raced["why"].startswith("not raced: the race ran past its time limit") and f"({limit:g} s" in raced["why"]


# ---------------------------------------------------------------- graded through the judge
def _lab07(head: str = "") -> nbformat.NotebookNode:
    """Lab 07's solution without outputs; `head` first in plan_blocks's answer (the solution's body after it)."""
    nb = nbformat.read(SOLUTION, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if head and "def plan_blocks(" in cell.source:
                begin = "    ### BEGIN SOLUTION\n"
                cell.source = cell.source.replace(begin, begin + head, 1)
    return nb


TENSORS = """\
    import torch
    if not globals().get("_inner"):  # the solution's plan, each step's start a tensor
        globals()["_inner"] = True
        try:
            plan = plan_blocks(profile, budget, most)
        finally:
            globals()["_inner"] = False
        return plan and [Step(torch.tensor(s.start), s.stop, s.how) for s in plan]
"""
LEAVES = """\
    import os, sys
    if not os.path.exists(%r):  # Exercise 7.1's first call: a process left behind, orphaned out of the worker's tree
        open(%r, "w").close()
        if os.fork() == 0:
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-S", "-c", "import time; time.sleep(600)", %r])
            os._exit(0)
        os.wait()
"""


def _living(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _left_behind() -> list[int]:
    """The living processes whose command line holds MARKER."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if MARKER.encode() in f.read() and _living(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def race():
    from labkit.labs.capstone import plan_for

    return leaderboard.prepare(plan_for, "tiny")


@pytest.fixture
def at_raced(monkeypatch):
    """probes: each called with the box's channel when the race's process reports (it is still running then)."""
    probes, seen = [], []
    receive = calls.Channel.from_child

    def from_child(self, ops):
        message = receive(self, ops)
        if message.get("op") == "raced":
            seen.append([probe(self) for probe in probes])
        return message
    monkeypatch.setattr(calls.Channel, "from_child", from_child)
    yield probes, seen


def _request(grade: grader.Grader, nb: nbformat.NotebookNode, exercises: bool = True) -> dict:
    job = grade.job(leaderboard.LAB, nb)[0]
    if not exercises:
        job["exercises"] = []
    job_file = Path(tempfile.mkstemp(dir=grade.tmp / "jobs", suffix=".json")[1])
    job_file.write_text(json.dumps(job))
    job_file.chmod(0o644)
    return grade.request(leaderboard.LAB, job, job_file, 0)


@pytest.mark.slow
@pytest.mark.long  # two lab 07 submissions graded and raced (no sandbox): about 40 s on two cores
def test_a_plan_of_tensors_is_refused_and_a_process_left_behind_is_gone_when_the_race_runs(tmp_path, race,
                                                                                          at_raced, monkeypatch):
    mark = str(tmp_path / "left")
    probes, seen = at_raced
    probes.append(lambda channel: _left_behind())
    grade = grader.Grader(Options((), (leaderboard.LAB,), Limits(seed=1), sandbox=False, race=race, root=ROOT), [])
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # serve() points it at stderr
    try:
        lines = "".join(json.dumps(_request(grade, nb, exercises)) + "\n" for nb, exercises in
                        ((_lab07(TENSORS), False), (_lab07(LEAVES % (mark, mark, MARKER)), True)))
        out = io.StringIO()
        judge.serve(io.StringIO(lines), out)
    finally:
        grade.close()
        for pid in _left_behind():
            os.kill(pid, 9)
    tensors, leaves = map(json.loads, out.getvalue().splitlines())
    assert [len(b) for b in (race["budgets"], tensors["race"]["budgets"], leaves["race"]["budgets"])] == [5] * 3
    for row in tensors["race"]["budgets"]:
        assert "start is a Tensor" in row["why"] and "peak" not in row, row
    assert leaves["outcomes"]["7.1"]["status"] == "tampered" and Path(mark).exists(), leaves  # it did fork
    assert seen == [[[]]], seen  # the race's one report, and no process of the submission's then
    for row in leaves["race"]["budgets"]:
        assert isinstance(row["peak"], int) and isinstance(row["over_reference"], float) and "why" not in row, row


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nsenter") is None,
                    reason="puts a process into a box: needs root and nsenter")
@pytest.mark.slow
@pytest.mark.long  # a lab 07 submission raced in bubblewrap: about 20 s on two cores
def test_in_a_box_the_race_runs_with_no_process_of_the_box_but_its_own(race, at_raced, monkeypatch):
    """A process in the box's pid namespace that every exercise's reap missed (one that forks as fast as it can
    escapes a reap now and then: it reads /proc, then kills what it read) is ended before the race starts."""
    probes, seen = at_raced
    placed: list[subprocess.Popen] = []
    send = calls.Channel.send

    def placing(self, message):  # just before the race: a sleeper in the box, as its worker's uid
        if message.get("op") == "race":
            placed.append(_place(self.watch.proc.pid))
        send(self, message)
    monkeypatch.setattr(calls.Channel, "send", placing)
    probes.append(lambda channel: [p.poll() for p in placed])
    grade = grader.Grader(Options((), (leaderboard.LAB,), Limits(seed=1), race=race, root=ROOT), [ROOT])
    try:
        request = _request(grade, _lab07(), exercises=False)
        limits = request["limits"]
        box = judge.Judge(limits["cell_timeout"], int(limits["memory_gib"] * 2**30), limits["processes"],
                          limits["notebook_timeout"])
        outcomes, ended = box.run(request["argv"], request["job"], race=race)
    finally:
        grade.close()
        for p in placed:
            p.kill()
    assert ended == "" and len(placed) == 1 and seen == [[[-9]]], (ended, seen)  # killed before the race reported
    assert all(isinstance(r.get("peak"), int) for r in box.raced["budgets"]), box.raced


def _place(monitor: int) -> subprocess.Popen:
    """`sleep` in the pid namespace of the box whose bubblewrap is `monitor`, as the box's uid; once it runs."""
    children = _children()
    init = children[monitor][0]
    uid = os.stat(f"/proc/{children[init][0]}").st_uid  # the worker's
    placed = subprocess.Popen(["nsenter", "-t", str(init), "-p", "-S", str(uid), "-G", str(uid), "--", "sleep", "600"])
    for _ in range(500):
        inside = _children().get(placed.pid, [])
        if inside and Path(f"/proc/{inside[0]}/comm").read_text().strip() == "sleep":
            return placed
        time.sleep(0.01)
    placed.kill()
    raise AssertionError("nsenter did not start sleep in the box")


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                found.setdefault(int(f.read().rsplit(b")", 1)[1].split()[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


# a request the judge answers with an error of its own (no worker to start)
UNRUNNABLE = messages.make(messages.REQUESTS, "grade", job={"exercises": []}, limits=Limits(seed=1).as_json(), cpus=None,
                           argv=["/nonexistent/worker"], env=None, cwd=None, race=None)


def test_a_judge_that_died_is_replaced_and_the_next_submission_is_answered():
    """A judge process that died (killed, or crashed serving the previous submission) is never written to again:
    the slot starts a fresh one, and the next submission gets that judge's answer rather than an error."""
    slot = grader.JudgeProcess(0)
    try:
        dead = slot.proc
        dead.kill()
        dead.wait()
        answer = slot.grade(UNRUNNABLE, 120)  # a request the judge answers with an error of its own: it was served
        assert isinstance(answer, dict) and slot.proc is not dead and slot.proc.poll() is None
        slot.proc.kill()
        slot.proc.wait()
        # a judge that dies while serving: it reads the request and exits without an answer
        dead = slot.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        with pytest.raises(RuntimeError, match="stopped .* a new one grades the next"):
            slot.grade(UNRUNNABLE, 120)
        assert slot.proc is not dead and slot.proc.poll() is None
        assert isinstance(slot.grade(UNRUNNABLE, 120), dict)
        # a judge that closes its answer pipe and lives on: ended, not waited for (a wait would hold the slot)
        slot.proc.kill()
        slot.proc.wait()
        hung = slot.proc = subprocess.Popen(
            [sys.executable, "-c", "import os, sys, time; sys.stdin.readline(); os.close(1); time.sleep(600)"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the slot waited for a judge that never ends"))
        signal.alarm(30)
        try:
            with pytest.raises(RuntimeError, match=r"exit status None.*a new one grades the next"):
                slot.grade(UNRUNNABLE, 120)
        finally:
            signal.alarm(0)
        assert hung.poll() is not None and slot.proc.poll() is None
    finally:
        slot.close()


class _Answers(_Box):
    """A box whose race process answers `messages`, then ends."""

    def __init__(self, *messages: dict) -> None:
        super().__init__()
        self.messages = list(messages)

    def from_child(self, ops=None) -> dict:
        if self.messages:
            return self.messages.pop(0)
        self.ended = {"op": "ended", "how": "exit", "status": 0}
        raise judge.BoxGone("ended: exit")


def _raced_in_process(plan: list) -> dict:
    """worker.race's answer for `plan` at one budget (it is its own reference), run in this process on the tiny
    profile: what the race's child sends the judge."""
    import torch

    from labkit.course.grade import wire, worker

    read, write = os.pipe()
    with torch.random.fork_rng():
        worker.race({"plans": {"100": plan}, "reference": {"100": plan}}, write, None, repeats=1)
    os.close(write)
    try:
        return wire.receive(read)
    finally:
        os.close(read)


@pytest.mark.slow  # two races of the tiny model, in this process
def test_a_plan_whose_gradients_come_out_wrong_in_the_race_never_ranks_and_its_row_says_why(monkeypatch):
    """The race judges each plan's one-step gradients against the plain step's: the solution's way of applying a
    plan trains bitwise and ranks; planted, an application whose checkpoints do not replay the RNG (backward draws
    fresh dropout masks, as compile below budget 1 does) fits the budget, yet is judged wrong and never ranks."""
    from torch.utils.checkpoint import checkpoint

    import labkit.planners
    from labkit.instruments.blocks import patched

    monkeypatch.setenv("LABKIT_PROFILE", "tiny")
    plan = [[0, 1, "keep"], [1, 2, "keep"]]
    answers = {"right": _raced_in_process(plan)}

    def redraw(model, steps, blocks=None):
        return patched([(b, (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False,
                                                                  preserve_rng_state=False, **k))(b.forward))
                        for b in model.blocks])
    monkeypatch.setattr(labkit.planners, "applied", redraw)
    answers["redraws"] = _raced_in_process(plan)
    profile = Profile((BlockCosts(4, 1, 1.0), BlockCosts(4, 1, 1.0)), 0, 0, 0.01)
    race = {"profile": base64.b64encode(pickle.dumps(profile)).decode(), "budgets": [10**12],
            "reference": {str(10**12): plan}}
    monkeypatch.setattr(judge.Judge, "_plans", lambda self, channel, job, profile, budgets:
                        {10**12: {"steps": plan, "plan": "keep 0 | keep 1"}})
    raced = {}
    for student, answer in answers.items():
        answer["peaks"] = {str(10**12): answer["peaks"]["100"]}
        raced[student] = judge.Judge(60.0, 2**30, 8, 300.0)._race(_Answers(answer), {}, race)
    table = {r["student"]: r for r in leaderboard.rows(race, raced)}
    assert table["right"]["gradients"] == "bitwise" and table["right"]["rank"] == 1, table["right"]
    bad = table["redraws"]
    assert bad["gradients"] == "wrong" and bad["fits"] is False and bad["rank"] == "", bad
    assert bad["why"].startswith("gradients wrong against the plain step: its gradients differ"), bad
