"""From what the worker saw to a gradebook: one row per student and exercise, CSV or JSON, and a summary."""
from __future__ import annotations

import csv
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit.course.grade.guard import MARK

STATUSES = ("passed", "failed", "not attempted", "timeout", "error", "missing", "tampered")
COLUMNS = ("student", "lab", "exercise", "status", "message", "seconds")


@dataclass
class Row:
    student: str
    lab: str
    exercise: str
    status: str
    message: str
    seconds: float = 0.0


def _first_line(text: str) -> str:
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _span(exercises: list[str], start: str) -> str:
    rest = exercises[exercises.index(start):]
    return start if len(rest) == 1 else f"{rest[0]}\u2013{rest[-1]}"


def _checked(ev: dict, ex: str, cell_timeout: float) -> tuple[str, str]:
    """Status and message of one checker cell's run."""
    if ev["status"] == "dead":
        return "error", f"kernel died in Exercise {ex}'s checker"
    if ev["status"] == "timeout":
        return "timeout", f"the checker ran past the cell timeout ({cell_timeout:g} s)"
    if ev["status"] == "error":
        line = _first_line(ev["evalue"]) or ev["ename"]
        kind = {"NotAttempted": "not attempted", "CheckFailure": "failed"}.get(ev["ename"], "error")
        return kind, line if kind != "error" else f"{ev['ename']}: {line}"
    passed = re.search(rf"^\[ex {re.escape(ex)}\] passed.*$", ev["stdout"], re.M)
    if passed:
        return "passed", passed.group(0)[:300]
    return "failed", f"the checker printed no pass line ({_first_line(ev['stdout']) or 'no output'})"


def classify(student: str, lab: str, exercises: list[str], cells: list[dict], events: dict[int, dict],
             flags: dict[str, list[str]], written: list[str], ended: str, limits: dict,
             lost: set[str] = frozenset()) -> list[Row]:
    """Rows for one submission. `cells`: each rebuilt code cell's index, role and exercises; `events`: the worker's
    report by cell index; `flags`: scan findings per exercise; `written`: what it wrote where it must not;
    `ended`: "done", "killed" (the notebook's time limit) or a message of why the worker stopped; `lost`: exercises
    whose answer cell the returned file does not have (deleted, or its cell ids lost)."""
    status: dict[str, tuple[str, str]] = {}
    seconds: Counter = Counter()
    pending: list[str] = []  # exercises whose answer cells ran since the last checker
    answer_error: dict[str, str] = {}
    for cell in cells:
        ev = events.get(cell["index"])
        if cell["role"] == "answer" and ev is not None:
            pending += cell["exercises"]
            if ev["status"] == "timeout":
                for ex in cell["exercises"]:
                    answer_error[ex] = "timeout"
            elif ev["ename"]:
                for ex in cell["exercises"]:
                    answer_error[ex] = f"{ev['ename']}: {_first_line(ev['evalue'])}"[:200]
        if cell["role"] != "checker" or ev is None:
            continue
        if MARK in ev["stdout"]:
            for ex in pending or cell["exercises"]:
                status[ex] = ("tampered", _first_line(ev["stdout"][ev["stdout"].index(MARK):]))
        pending = []
        for ex in cell["exercises"]:
            seconds[ex] += ev["seconds"]
            if status.get(ex, ("passed",))[0] == "passed" or ex not in status:
                kind, message = _checked(ev, ex, limits["cell_timeout"])
                if kind != "passed" and answer_error.get(ex) == "timeout":
                    kind, message = "timeout", f"the exercise cell ran past the cell timeout ({limits['cell_timeout']:g} s)"
                elif kind in ("failed", "error", "not attempted") and ex in answer_error:
                    message += f" (the exercise cell raised {answer_error[ex]})"
                status[ex] = (kind, message)
    ungraded = [ex for ex in exercises if ex not in status]
    if ungraded:
        first, span = ungraded[0], _span(exercises, ungraded[0])
        died = any(ev["status"] == "dead" for ev in events.values())
        why = (("error", f"kernel died in Exercise {first}; {span} not graded") if died else
               ("timeout", f"the notebook's time limit ({limits['notebook_timeout']:g} s) ran out in Exercise {first}; "
                           f"{span} not graded") if ended == "killed" else
               ("error", f"not run ({ended}); {span} not graded"))
        for ex in ungraded:
            status[ex] = why
    for ex in lost:
        if status.get(ex, ("",))[0] == "not attempted":
            status[ex] = ("not attempted", status[ex][1] + " (its exercise cell is not in the returned file: "
                                                           "deleted, or the notebook lost its cell ids)")
    for ex, found in flags.items():
        if ex in status:
            status[ex] = ("tampered", "the answer cell " + "; ".join(found))
    if written:
        note = "tried to write outside its folder: " + "; ".join(written[:3]) + (" ..." if len(written) > 3 else "")
        status = {ex: ("tampered", note) for ex in status}
    return [Row(student, lab, ex, *status[ex], round(seconds[ex], 2)) for ex in exercises]


def write(rows: list[Row], path: Path, as_json: bool, limits: dict) -> None:
    """The gradebook: CSV with COLUMNS, or JSON {"limits": ..., "rows": [...]}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if as_json:
        path.write_text(json.dumps({"limits": limits, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


def summary(rows: list[Row]) -> str:
    """A few lines for the terminal: per lab and exercise, how many of each status."""
    lines = []
    for lab in sorted({r.lab for r in rows}):
        mine = [r for r in rows if r.lab == lab]
        lines.append(f"Lab {lab}: {len({r.student for r in mine})} submissions")
        for ex in dict.fromkeys(r.exercise for r in mine):
            counts = Counter(r.status for r in mine if r.exercise == ex)
            lines.append(f"  {ex or '-':>5}  " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s]))
    return "\n".join(lines)
