"""From what the judge decided to a gradebook: one row per student and exercise, CSV and JSON; one row per
student with the points of each exercise and a total (``totals``); and a summary.

Points: an exercise passed earns its points, anything else none; each exercise is worth 1 unless a points table
(``read_points``: CSV lines `exercise,points`, the instructor's) says otherwise.

The CSV is for a spreadsheet and Python's `csv` module alike: every field at most ``FIELD_CHARS`` characters (a
cut message says so; the JSON beside it, `grades.json`, keeps it whole), no control characters, and no field
that a spreadsheet would run as a formula (one starting with `=`, `+`, `-` or `@` gets a leading `'`).
"""
from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

STATUSES = ("passed", "failed", "not attempted", "timeout", "error", "missing", "tampered")
COLUMNS = ("student", "lab", "exercise", "status", "message", "seconds")
FIELD_CHARS = 500
CUT = " [cut: the JSON report has it whole]"


@dataclass
class Row:
    student: str
    lab: str
    exercise: str
    status: str
    message: str
    seconds: float = 0.0


def ordered(rows: list[Row]) -> list[Row]:
    """The gradebook's order: by student, then lab, each submission's exercises as graded (one run and merged
    parts alike)."""
    return sorted(rows, key=lambda r: (r.student, r.lab))


def first_line(text: str) -> str:
    """The first line of `text` with something on it, colours dropped."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _span(exercises: list[str], start: str) -> str:
    rest = exercises[exercises.index(start):]
    return start if len(rest) == 1 else f"{rest[0]}\u2013{rest[-1]}"


def rows(student: str, lab: str, exercises: list[str], outcomes: dict, ended: str, flags: dict[str, list[str]],
         dropped: dict[str, int], lost: set[str]) -> list[Row]:
    """Rows for one submission. `outcomes`: exercise -> the judge's Outcome (as a dict); `ended`: "" or why the box
    stopped before the rest; `flags`: scan findings per exercise; `dropped`: top-level statements of each
    exercise's answer cell left out (grading runs definitions only); `lost`: exercises whose answer cell the
    returned file does not have."""
    status: dict[str, tuple[str, str, float]] = {}
    for ex in exercises:
        found = outcomes.get(ex)
        if found is None:
            first = next(e for e in exercises if e not in outcomes)
            status[ex] = ("error" if "time limit" not in ended else "timeout",
                          f"{ended or 'not run'}; {_span(exercises, first)} not graded"[:300], 0.0)
            continue
        kind, message = found["status"], found["message"]
        kind = kind if kind in STATUSES else "error"
        if kind == "failed":
            message = message.split("\nHint:")[0].strip()
        status[ex] = (kind, first_line(message) if kind != "failed" else message[:1000], found.get("seconds", 0.0))
    for ex in lost:
        if status.get(ex, ("",))[0] == "not attempted":
            kind, message, seconds = status[ex]
            status[ex] = (kind, message + " (its exercise cell is not in the returned file: deleted, or the notebook "
                                          "lost its cell ids)", seconds)
    for ex, found in flags.items():
        if ex in status:
            status[ex] = ("tampered", "the answer cell " + "; ".join(found), status[ex][2])
    for ex, n in dropped.items():
        if ex in status and n:
            kind, message, seconds = status[ex]
            status[ex] = (kind, f"{message} ({n} top-level statement{'s' * (n != 1)} of the answer cell not run: "
                                "grading runs its definitions only)", seconds)
    return [Row(student, lab, ex, status[ex][0], status[ex][1], round(status[ex][2], 2)) for ex in exercises]


def _text(value: object) -> object:
    """A string as UTF-8 can hold it: a lone surrogate (from a submission's message, or an undecodable file
    name) becomes "?", so that writing the gradebook cannot fail on one row."""
    return value.encode("utf-8", "replace").decode("utf-8") if isinstance(value, str) else value


def cell(value: object) -> object:
    """One CSV field as every gradebook of the kit writes it: bounded (FIELD_CHARS), printable, never a formula."""
    if not isinstance(value, str):
        return value
    text = "".join(c if c.isprintable() else " " for c in value)
    formula = text[:1] in ("=", "+", "-", "@")
    room = FIELD_CHARS - formula  # the quote that disarms a formula counts
    if len(text) > room:
        text = text[:room - len(CUT)] + CUT
    return "'" + text if formula else text


def read_points(path: Path | None) -> dict[str, float]:
    """The points table: `exercise,points` per line (a header line `exercise,points` allowed); {} for None. A
    ValueError names a line that is not an exercise and a number of points, 0 or more."""
    if path is None:
        return {}
    table: dict[str, float] = {}
    for number, line in enumerate(csv.reader(path.read_text(encoding="utf-8").splitlines()), 1):
        if not line or line == ["exercise", "points"]:
            continue
        try:
            exercise, points = line[0].strip(), float(line[1])
            if len(line) != 2 or not re.fullmatch(r"\d+\.\d+", exercise) or not 0 <= points < math.inf:
                raise ValueError
        except (ValueError, IndexError):
            raise ValueError(f"{path}, line {number}: {','.join(line)!r} is not `exercise,points` (say `2.1,3`: an "
                             "exercise number and its points, a finite number, 0 or more)") from None
        table[exercise] = int(points) if points.is_integer() else points
    return table


def totals(rows: list[Row], points: dict[str, float]) -> tuple[list[str], list[dict]]:
    """(the columns, one row per student): each exercise of every lab graded, with its points earned (its points
    when passed, else 0: a lab a student did not return, or a file that was no lab's, earns 0), the total, and
    what every student's total is out of (all those exercises)."""
    exercises = list(dict.fromkeys(r.exercise for r in rows if r.exercise))
    passed = {(r.student, r.exercise) for r in rows if r.status == "passed"}
    out_of = sum(points.get(ex, 1) for ex in exercises)
    table = []
    for student in dict.fromkeys(r.student for r in rows):
        row = {"student": student, **{ex: points.get(ex, 1) if (student, ex) in passed else 0 for ex in exercises}}
        row["total"], row["out of"] = sum(row[ex] for ex in exercises), out_of
        table.append(row)
    return ["student", *exercises, "total", "out of"], table


def write(rows: list[Row], path: Path, as_json: bool, limits: dict, points: dict[str, float] | None = None,
          part: dict | None = None) -> Path:
    """The gradebook: JSON {"limits": ..., "rows": [...], "students": [...]} at `path`, or CSV with COLUMNS at
    `path`, the same JSON, whole, beside it (`grades.json` for `grades.csv`), and one row per student with points
    and a total (`grades_students.csv`). Returns the per-student file (the JSON itself in JSON mode). A part of a
    class graded with --shard (`part`: shards.facts) says so in the JSON's "part" and the CSV's first line, a
    comment, which `labkit grade merge` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = [{k: _text(v) for k, v in asdict(r).items()} for r in rows]
    columns, students = totals(rows, points or {})
    students = [{k: _text(v) for k, v in s.items()} for s in students]
    whole = json.dumps({"limits": limits, **({"part": part} if part else {}), "rows": clean, "students": students},
                       indent=1, ensure_ascii=False) + "\n"
    if as_json:
        path.write_text(whole, encoding="utf-8")
        return path
    path.with_suffix(".json").write_text(whole, encoding="utf-8")
    with path.open("w", newline="", encoding="utf-8") as f:
        if part:
            f.write("# labkit grade part " + json.dumps(part, ensure_ascii=False) + "\n")  # shards.MARK
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: cell(v) for k, v in r.items()} for r in clean)
    book = path.with_name(f"{path.stem}_students.csv")
    with book.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: cell(v) for k, v in s.items()} for s in students)
    return book


def summary(rows: list[Row], points: dict[str, float] | None = None) -> str:
    """A few lines for the terminal: per lab, its submissions and the students with nothing to grade; per exercise,
    how many of each status; then each student's total."""
    lines = []
    for lab in sorted({r.lab for r in rows}):
        mine = [r for r in rows if r.lab == lab]
        students = {r.student for r in mine}
        missing = students - {r.student for r in mine if r.status != "missing"}  # every row of theirs missing
        lines.append(f"Lab {lab}: {len(students - missing)} submissions" + (
            f", {len(missing)} student{'s' * (len(missing) != 1)} with nothing to grade (missing)" if missing else ""))
        for ex in dict.fromkeys(r.exercise for r in mine):
            counts = Counter(r.status for r in mine if r.exercise == ex)
            lines.append(f"  {ex or '-':>5}  " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s]))
    _, students = totals(rows, points or {})
    if students:
        lines.append("Totals:")
        width = max(len(s["student"]) for s in students)
        lines += [f"  {s['student']:<{width}}  {s['total']:g} / {s['out of']:g}" for s in students]
    return "\n".join(lines)
