"""Outside the box: one submission graded, exercise by exercise, the verdict decided where the student's code cannot reach.

``Judge.run(argv, job)`` starts the box (the worker in bubblewrap, sandbox.py), watches its memory, processes and
time from outside (``Watch``), and for each exercise asks the worker for a child process. A ``remote`` exercise's
checker runs here, in this process: every call of a student's function is a ``StudentFunction`` (calls.py) that
sends the arguments into the box and reads back an encoded value (wire.py), which this side rebuilds as plain data;
the checker compares it with what it computes itself, and nothing the student's code prints or sends is a verdict.
A ``local`` exercise's checker runs in the box; its verdict is the box's word (docs/design.md, "Grading a class").
"""
from __future__ import annotations

import base64
import contextlib
import io
import itertools
import os
import pickle
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.checks import base
from labkit.course import catalog
from labkit.course.grade import messages
from labkit.course.grade.calls import BoxGone, Channel, StudentFunction
from labkit.course.grade.options import Limits
from labkit.course.grade.sandbox import Cgroups
from labkit.course.grade.watch import Watch  # the box from outside: its memory, processes and CPU share

__all__ = ["Outcome", "BoxGone", "Channel", "StudentFunction", "Watch", "Judge"]  # calls.py's, for its callers


@dataclass
class Outcome:
    """What became of one exercise."""

    status: str  # passed | failed | not attempted | timeout | error | tampered
    message: str
    seconds: float = 0.0


_BOXES = itertools.count()


class Judge:
    """Grades submissions one after another, each in a box of its own (one Judge per job slot)."""

    def __init__(self, seconds: float, memory: int, processes: int, total: float, cpus: float | None = None) -> None:
        self.seconds, self.memory, self.processes, self.total = seconds, memory, processes, total
        self.cpus = cpus  # the CPUs a box may use (None: no share)
        self.raced: dict = {"why": "not raced"}  # the leaderboard's answer for the last submission run

    def _race(self, channel: Channel, job: dict, race: dict) -> dict:
        """The student's planner at each budget (in a child that loads the program, called from here), then each
        plan that is one raced against the reference's (in a child that runs none of the student's code):
        {"budgets": [{budget, plan, peak, over_reference, why}, ...]}."""
        from labkit.course.grade import leaderboard

        profile = pickle.loads(base64.b64decode(race["profile"]))
        planned = self._plans(channel, job, profile, race["budgets"])
        mine = {str(b): p["steps"] for b, p in planned.items() if p.get("steps")}
        measured: dict = {}
        if mine:
            limit = leaderboard.race_seconds(profile.step, len(mine), self.seconds)
            channel.deadline = time.monotonic() + limit + 10  # the worker ends the race at `limit`
            channel.send({"op": "race", "plans": mine, "reference": {b: race["reference"][b] for b in mine},
                          "seconds": limit})
            try:
                measured = channel.from_child(("raced", "unraced"))
                while True:  # nothing more comes but its end (it runs none of the student's code)
                    channel.from_child(None)
            except BoxGone as e:
                if not str(e).startswith("ended: "):
                    raise
                if channel.ended.get("how") == "timeout":
                    measured = {"why": f"the race ran past its time limit ({limit:g} s: the larger of an exercise's "
                                       f"{self.seconds:g} s and {leaderboard.SLACK} times its "
                                       f"{leaderboard.race_steps(len(mine))} steps at the model's plain step of "
                                       f"{profile.step:.3g} s)"}
            if measured.get("op") != "raced":
                why = measured.get("why") or f"the race's process ended (exit status {channel.ended.get('status')})"
                return {"why": f"not raced: {why}"}
        out = []
        for budget in race["budgets"]:
            row = {"budget": budget, **{k: v for k, v in planned[budget].items() if k != "steps"}}
            got = measured.get("peaks", {}).get(str(budget)) if str(budget) in mine else None
            if isinstance(got, dict) and isinstance(got.get("peak"), int) and isinstance(got.get("ratio"), float):
                row.update(peak=got["peak"], over_reference=round(got["ratio"], 4), **leaderboard.judged(got))
            elif str(budget) in mine:
                row["why"] = f"not raced: {str(got.get('error') if isinstance(got, dict) else got)[:200]}"
            out.append(row)
        return {"budgets": out}

    def _raced(self, channel: Channel, job: dict, race: dict) -> dict:
        """``_race``'s answer, or, where the race raised (a bug of the grader's, say), a row that says so: the
        exercises graded before it keep their outcomes."""
        try:
            return self._race(channel, job, race)
        except Exception as e:  # noqa: BLE001  (BoxGone is no Exception: a box that died still ends the run)
            return {"why": f"not raced: the judge's race raised {type(e).__name__}: {_first_line(str(e))[:200]}"}

    def _plans(self, channel: Channel, job: dict, profile: Any, budgets: list[int]) -> dict[int, dict]:
        """budget -> {"steps": the plan, "plan": its line} or {"why": why there is none}, from the student's
        plan_for, called in a child that loaded the program (the checker's way: data in, data back)."""
        from labkit.course.grade import leaderboard

        exercise = {"id": "race", "checker": "ex_7_1", "args": ["plan_for"], "mode": "remote", "seed": None}
        channel.deadline = time.monotonic() + self.seconds + 10
        channel.send({"op": "start", "exercise": exercise})
        out: dict[int, dict] = {b: {"why": "not planned: the planner's process ended first"} for b in budgets}
        try:
            loaded = channel.from_child(("loaded",))
            error = loaded["errors"].get("7.1")
            planner = StudentFunction("plan_for", channel)
            for budget in budgets:
                try:
                    steps, why = leaderboard.plan_of(planner(profile, budget), profile)
                except BoxGone:
                    raise
                except Exception as e:  # the student's planner raised: its row says so
                    steps, why = None, f"the planner raised {type(e).__name__}: {_first_line(str(e))[:200]}"
                    if isinstance(error, str):
                        why += f" (its cell raised {error[:150]})"
                out[budget] = {"steps": steps, "plan": leaderboard.described(steps)} if steps else {"why": why}
            channel.send({"op": "end"})
            tried = channel.from_child(None)  # read as it comes: anything but an empty report is tampering
            if tried.get("op") != "tried" or tried.get("what"):
                what = "; ".join(str(w)[:100] for w in tried.get("what") or [])[:300] or "no report of what it tried"
                out = {b: {"why": f"tampered: tried {what}"} for b in budgets}
            while True:
                channel.from_child(None)
        except BoxGone as e:
            if not str(e).startswith("ended: "):
                raise
            if channel.ended.get("how") == "timeout":
                out = {b: o if "steps" in o else {"why": f"the planner ran past its time limit ({self.seconds:g} s)"}
                       for b, o in out.items()}
        return out

    def run(self, argv: list[str], job: dict, env: dict | None = None, cwd: Path | None = None,
            race: dict | None = None) -> tuple[dict[str, Outcome], str]:
        """Each exercise's Outcome, and how the box ended ("" when it ended as asked). `argv` ends with the worker's
        command line, missing only its --fd-in/--fd-out, which this adds. With `race` (leaderboard.prepare's), the
        student's planner is raced after the exercises, in the same box: ``self.raced`` is what came of it."""
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        command = argv + ["--fd-in", str(to_r), "--fd-out", str(from_w), "--seconds", str(self.seconds)]
        groups = Cgroups(f"labkit-box-{os.getpid()}-{next(_BOXES)}", self.processes, self.memory, self.cpus)
        proc = subprocess.Popen(groups.entering(command), pass_fds=(to_r, from_w), env=env, cwd=cwd,
                                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        os.close(to_r), os.close(from_w)
        errors = _Tail(proc.stderr)
        watch = Watch(proc, self.memory, self.processes, None if groups.keeps("cpu") else self.cpus)
        channel = Channel(to_w, from_r, watch)
        outcomes: dict[str, Outcome] = {}
        ended, started = "", time.monotonic()
        try:
            for exercise in job["exercises"]:
                if time.monotonic() - started > self.total:
                    ended = f"the notebook's time limit ({self.total:g} s) ran out in Exercise {exercise['id']}"
                    break
                outcomes[exercise["id"]] = self._exercise(channel, job, exercise)
            if race is not None:
                self.raced = {"why": f"not raced: the notebook's time limit ({self.total:g} s) ran out"} \
                    if time.monotonic() - started > self.total else self._raced(channel, job, race)
            channel.deadline = time.monotonic() + 5
            channel.send({"op": "quit"})
        except BoxGone as e:
            ended = watch.why or f"the grader's worker stopped ({e}){errors.last()}"
            self.raced = {"why": f"not raced: {ended}"}
        finally:
            hit = groups.hits()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                watch.kill()
                proc.wait()
            watch.stop()
            groups.remove()
            os.close(to_w), os.close(from_r)
        if ended and hit:
            ended += f"; the box ran into {' and '.join(hit)}"
        return outcomes, ended

    def _exercise(self, channel: Channel, job: dict, exercise: dict) -> Outcome:
        """One exercise: the child loads the program, then the check runs (here or there), then the child ends."""
        start = time.monotonic()
        channel.deadline = start + self.seconds + 10  # the worker kills the child at `seconds`; this is its margin
        channel.send({"op": "start", "exercise": exercise})
        outcome, loaded = None, {}
        try:
            loaded = channel.from_child(("loaded",))
            if exercise["mode"] == "remote":
                outcome = self._remote(channel, job, exercise)
                channel.send({"op": "end"})
                tried = channel.from_child(("tried",))
                if tried["what"]:
                    outcome = Outcome("tampered", "tried " + "; ".join(str(w)[:100] for w in tried["what"][:4]))
            else:
                verdict = channel.from_child(("verdict",))
                outcome = Outcome(verdict["status"][:20], verdict["message"][:2000])
            channel.from_child(None)  # nothing more comes from the child but its end
            outcome = Outcome("tampered", "its process sent more after the check was done (a forked copy, a forgery)")
            while True:  # read what else it sends until the worker reports its end
                channel.from_child(None)
        except BoxGone as e:
            if not str(e).startswith("ended: "):
                raise  # the box is gone: nothing more of this submission is graded
            outcome = _ended(channel.ended, outcome, self.seconds)
        errors = loaded.get("errors") if isinstance(loaded.get("errors"), dict) else {}
        error = errors.get(exercise["id"])
        if isinstance(error, str) and outcome.status in ("not attempted", "failed", "error"):
            outcome = Outcome("error", f"the exercise cell raised {error[:300]}")
        outcome.seconds = round(time.monotonic() - start, 2)
        return outcome

    def _remote(self, channel: Channel, job: dict, exercise: dict) -> Outcome:
        check = getattr(catalog.lab(job["lab"]).checkers, exercise["checker"])
        functions = [StudentFunction(name, channel) for name in exercise["args"]]
        out = io.StringIO()
        try:
            with base.hidden_cases(exercise.get("seed")), contextlib.redirect_stdout(out):
                check(*functions)
        except base.NotAttempted as e:
            return Outcome("not attempted", _first_line(str(e)))
        except base.CheckFailure as e:
            return Outcome("failed", str(e)[:2000])
        except Exception as e:  # the student's error, come back through a call the checker did not trap
            failure = base.student_failure(exercise["id"], "your code, called by the checker", e,
                                           "run your function by hand on a small input to see where it fails")
            return Outcome("not attempted" if isinstance(failure, base.NotAttempted) else "failed", str(failure)[:2000])
        line = next((x for x in out.getvalue().splitlines() if x.startswith(f"[ex {exercise['id']}] passed")), "")
        return Outcome("passed", line[:300] or f"[ex {exercise['id']}] passed")


def _ended(ended: dict, outcome: Outcome | None, seconds: float) -> Outcome:
    """The outcome of an exercise whose child ended: its verdict if it ended as it should (status 0, in time),
    else why not. A verdict of passed from a child that then crashed is no pass."""
    how, status = ended.get("how"), ended.get("status")
    if how == "timeout":
        return Outcome("timeout", f"the exercise ran past its time limit ({seconds:g} s)")
    if outcome is None:
        return Outcome("error", f"its process ended before the check did (exit status {status}; an os._exit, a crash "
                                "or a kill)")
    if status != 0 and outcome.status == "passed":
        return Outcome("error", f"its process ended with exit status {status} after the check")
    return outcome


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:300]


class _Tail:
    """The last bytes of the box's stderr, read as they come (never more than `most` kept)."""

    def __init__(self, stream: Any, most: int = 1 << 16) -> None:
        self.data = b""
        self._thread = threading.Thread(target=self._read, args=(stream, most), daemon=True)
        self._thread.start()

    def _read(self, stream: Any, most: int) -> None:
        for chunk in iter(lambda: stream.read(4096), b""):
            self.data = (self.data + chunk)[-most:]

    def last(self) -> str:
        lines = self.data.decode(errors="replace").strip().splitlines()
        return f": {lines[-1][:200]}" if lines else ""


# ---------------------------------------------------------------- a judge process per job slot
def serve(stdin: Any = None, stdout: Any = None) -> None:
    """`python -m labkit.course.grade.judge`: grade the submissions the grader sends, one JSON line each (a
    messages.REQUESTS "grade"), answering one JSON line each (a messages.ANSWERS "graded"). A process of its own per
    job slot, so that the checkers that run here (torch's generators, its modes) never share one with another
    submission's. Whatever grading one submission raises is that submission's answer: the next is served."""
    import sys

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    sys.stdout = sys.stderr  # whatever else prints here (a checker's pass line) stays off the protocol's line
    for line in stdin:
        stdout.write(_answer(line) + "\n")
        stdout.flush()


def _answer(line: str) -> str:
    """The answer line to one request line: what came of the submission, or, where grading it raised (a request
    the schema refuses, a value no JSON holds, a bug), why it was not graded, as its own error."""
    import json

    request: Any = None
    try:
        request = json.loads(line)
        request = messages.checked(messages.REQUESTS, request, ["grade"])
        limits = Limits.of(request["limits"])
        judge = Judge(limits.cell_timeout, int(limits.memory_gib * 2**30), limits.processes,
                      limits.notebook_timeout, request["cpus"])
        outcomes, ended = judge.run(request["argv"], request["job"], request["env"],
                                    Path(request["cwd"]) if request["cwd"] else None, request["race"])
        return json.dumps(messages.make(messages.ANSWERS, "graded", outcomes={ex: vars(o) for ex, o in outcomes.items()},
                                        ended=ended, race=judge.raced if request["race"] else None))
    except Exception as e:  # noqa: BLE001  (this submission's error: the judge lives on for the next)
        why = f"the judge could not grade this submission ({type(e).__name__}: {_first_line(str(e))[:200]})"
        raced = {"why": f"not raced: {why}"} if isinstance(request, dict) and request.get("race") else None
        return json.dumps(messages.make(messages.ANSWERS, "graded", outcomes={}, ended=why, race=raced))


if __name__ == "__main__":
    serve()
