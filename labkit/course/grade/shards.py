"""A class split across machines: `labkit grade --shard K/N` grades one part, `labkit grade merge PART.csv...` joins them.

A student's part is chosen from the student's name alone (``part_of``: SHA-256 of the name, mod N), so every
machine that is given the same class, in any order, agrees on who is in which part, and every student is in
exactly one. K counts from 0, as a Kubernetes Indexed Job's completion index and a Slurm array's `--array=0-3`
do. Each part's gradebook carries what it was graded as (``facts``: the labs, the limits with the seed, K and N,
and the roster: the whole class's names as that machine found them, and their SHA-256) in its first line, a CSV
comment (`# labkit grade part {...}`), and in its JSON twin's "part"; ``merge`` refuses parts that disagree on any
of them (for rosters, naming the students one has and the other lacks), a part missing or given twice, a student
in two parts (or in a part the name does not belong to, or on no roster), and a student of the roster in no part,
naming what differs. A part's files are checked as they are read: what is missing or malformed is named, with the
file (and the CSV's line).

Each part is checked against what it says it graded (``_graded_as``): every row of a lab of the part (or `?`, a file
that was no lab's, one row of no exercise), of an exercise of that lab (the facts carry each lab's exercises), of a
status the grader writes, and every exercise of a lab for a student with a row of it; its JSON twin's rows must be
its CSV's, as the CSV writes them (``_twin_alike``); N is at most the roster's size, checked before anything counts
the parts (a part claiming N = 10**9 once built set(range(N))). Then its signature (signature.py): a part edited
after grading is refused, naming the file; an unsigned part only where merge is told to take one (``unsigned``).
Every refusal is one ShardError, one line.

A part's CSV read alone (no JSON twin beside it) names each student as the roster does: the roster's names and the
rows' are compared as the CSV writes them (``_student``). The CSV disarms a formula with a leading quote, so `-x` is
written `'-x`, and so is a name that is `'-x`: a field is whichever of them the roster holds, and a roster that holds
both is refused for that field (the JSON holds the names whole).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from pathlib import Path

from labkit.course.grade import signature
from labkit.course.grade.report import COLUMNS, STATUSES, Row, cell, ordered

__all__ = ["MARK", "ShardError", "Merged", "parse", "part_of", "roster_of", "facts", "exercises_of", "oversplit",
           "read", "merge", "written", "check_out"]

SECONDS = re.compile(r"([0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)?")  # seconds as the CSV writes a float, or ""
MARK = "# labkit grade part "  # the first line of a part's CSV, before its JSON facts


class ShardError(ValueError):
    """A shard that cannot be graded or parts that cannot be merged: the message names the value and what is
    allowed."""


def parse(text: str) -> tuple[int, int]:
    """(K, N) from "K/N": N parts, K from 0 to N-1."""
    found = re.fullmatch(r"\s*(\d{1,12})\s*/\s*(\d{1,12})\s*", text or "")
    if not found:
        raise ShardError(f"--shard {text!r:.40}: say K/N, the K-th of N parts (K from 0 to N-1: 0/4 ... 3/4; N at most "
                         "the class's size)")
    k, n = int(found[1]), int(found[2])
    if n < 1 or not 0 <= k < n:
        raise ShardError(f"--shard {text}: K must be 0 to {n - 1} for N={n} (K counts from 0, as a Kubernetes "
                         "Indexed Job's JOB_COMPLETION_INDEX does)" if n >= 1 else f"--shard {text}: N must be 1 or more")
    return k, n


def part_of(student: str, n: int) -> int:
    """The part (0 to n-1) of the student so named: from the name alone, the same on every machine."""
    digest = hashlib.sha256(student.encode("utf-8", "replace")).digest()  # as the gradebook writes the name
    return int.from_bytes(digest[:8], "big") % n


def _as_written(name: str) -> str:
    return name.encode("utf-8", "replace").decode("utf-8")  # as the gradebook writes it (report._text)


def roster_of(students: Iterable[str]) -> dict:
    """The class a part was split from: its names (each once, sorted, as the gradebook writes them) and their
    SHA-256 (of the names joined by newlines, which no name holds), which every part of one class shares."""
    names = sorted({_as_written(s) for s in students})
    return {"sha256": hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest(), "students": names}


def facts(labs: list[str], limits: dict, k: int, n: int, roster: Iterable[str] | None = None,
          exercises: dict[str, list[str]] | None = None) -> dict:
    """What a part was graded as: merge joins only parts that agree on all of it but K. `roster`: the name of every
    file of the class to be graded (other labs' files left out), before the split; `exercises`: each lab's
    exercises, as the grader grades them (``exercises_of``); merge refuses a part without either."""
    found = {"labs": sorted(labs), "limits": limits, "shard": [k, n]}
    found.update({} if exercises is None else {"exercises": {lab: list(exercises[lab]) for lab in sorted(labs)}})
    return found if roster is None else {**found, "roster": roster_of(roster)}


def exercises_of(root: Path, labs: list[str]) -> dict[str, list[str]]:
    """Each lab's exercises, in the order the grader writes their rows (those of its pristine student notebook)."""
    from labkit.course.catalog import LABS
    from labkit.course.grade.rebuild import Pristine

    by_number = {lab.number: lab for lab in LABS}
    return {n: list(Pristine.read(n, by_number[n].student(root)).exercises) for n in sorted(labs)}


def oversplit(shard: tuple[int, int], students: Iterable[str]) -> str:
    """Why the class of `students` cannot be split so (more parts than students), or ""."""
    size = len(roster_of(students)["students"])
    return "" if shard[1] <= max(1, size) else (
        f"--shard {shard[0]}/{shard[1]}: {shard[1]} parts of a class of {size} students (the files found): N is at "
        f"most the class's size, {max(1, size)}")


def _checked(found: object, where: str) -> dict:
    """A part's facts as read from `where`, each checked, so that merge never meets a KeyError."""
    if not isinstance(found, dict):
        raise ShardError(f"{where}: its part is {found!r:.200}, not an object of facts (labs, limits, shard, roster)")
    lacks = [key for key in ("labs", "limits", "shard") if key not in found]
    if lacks:
        raise ShardError(f"{where}: its facts lack {', '.join(map(repr, lacks))} (a part written by hand?)")
    shard = found["shard"]
    if not (isinstance(shard, list) and len(shard) == 2 and all(type(v) is int for v in shard)
            and 0 <= shard[0] < shard[1]):
        raise ShardError(f"{where}: shard {shard!r:.100} is not [K, N] with 0 <= K < N")
    if not isinstance(found["labs"], list) or not isinstance(found["limits"], dict):
        raise ShardError(f"{where}: labs {found['labs']!r:.100} and limits {found['limits']!r:.100} are not a list "
                         "and an object")
    for key, what in (("roster", "the class it was split from"), ("exercises", "each lab's exercises")):
        if key not in found:
            raise ShardError(f"{where}: its facts have no {key} ({what}): written by a labkit from before parts "
                             f"recorded it, so merge cannot check the part against it; grade the parts again with "
                             "this kit")
    roster = found["roster"]
    names = roster.get("students") if isinstance(roster, dict) else None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ShardError(f"{where}: its roster is {roster!r:.200}, not {{\"sha256\": ..., \"students\": [...]}}")
    if shard[1] > max(1, len(names)):  # before anything counts the parts: N = 10**9 is refused at once
        raise ShardError(f"{where}: shard {shard[0]}/{shard[1]}: N is more than the {len(names)} students of the "
                         "class it was split from (its roster): no run of labkit grade splits so")
    if roster_of(names) != roster:
        raise ShardError(f"{where}: its roster's sha256 {roster.get('sha256')!r:.80} is not that of its "
                         f"{len(names)} names, sorted ({roster_of(names)['sha256']}): edited or cut?")
    return _exercises_checked(found, where)


def _exercises_checked(found: dict, where: str) -> dict:
    exercises = found["exercises"]
    if not (isinstance(exercises, dict) and sorted(exercises) == sorted(found["labs"]) and
            all(isinstance(ids, list) and all(isinstance(i, str) and i for i in ids) for ids in exercises.values())):
        raise ShardError(f"{where}: its exercises {exercises!r:.200} are not each lab's exercises (an object of the "
                         f"labs {found['labs']!r:.100}, each with a list of exercise ids)")
    return found


def _graded_as(found: dict, rows: list[tuple[Row, str]]) -> list[Row]:
    """The rows, each checked against what its part says it graded: a lab of the part (or "?", a file that was no
    lab's, with one row of no exercise), an exercise of that lab, a status the grader writes; and every exercise of a
    lab for each student with a row of that lab (one run writes a submission's every exercise)."""
    labs, exercises = found["labs"], found["exercises"]
    seen: dict[tuple[str, str], tuple[list[str], str]] = {}
    for row, where in rows:
        if row.status not in STATUSES:
            raise ShardError(f"{where}: status {row.status!r:.60} is none the grader writes ({', '.join(STATUSES)})")
        if row.lab != "?" and row.lab not in labs:
            raise ShardError(f"{where}: a row of lab {row.lab!r:.60}, not a lab this part graded ({', '.join(labs)})")
        allowed = [""] if row.lab == "?" else exercises[row.lab]
        if row.exercise not in allowed:
            raise ShardError(f"{where}: exercise {row.exercise!r:.60} is not one of lab {row.lab}'s "
                             f"({', '.join(allowed) or 'none: a file that was no lab is one row'})")
        seen.setdefault((row.student, row.lab), ([], where))[0].append(row.exercise)
    for (student, lab), (got, where) in seen.items():
        lacks = [ex for ex in ([""] if lab == "?" else exercises[lab]) if ex not in got]
        if lacks:
            raise ShardError(f"{where}: student {student!r:.80} has lab {lab}'s {', '.join(got)} but not "
                             f"{', '.join(lacks)}: one run writes every exercise of a lab returned (rows dropped?)")
    return [row for row, _ in rows]


def _unarmed(value: str) -> str:
    """A CSV field as the grader meant it: the quote that disarmed a formula taken off."""
    return value[1:] if value[:1] == "'" and value[1:2] in ("=", "+", "-", "@") else value


def _seconds(value: object, where: str, text: bool = False) -> float:
    """A row's seconds: a finite number, 0 or more (JSON), or the text the CSV writes of one (`text`; an empty
    field is 0)."""
    try:
        if text:
            took = float(value or 0) if isinstance(value, str) and SECONDS.fullmatch(value) else math.nan
        else:
            took = float(value) if type(value) in (int, float) else math.nan
    except OverflowError:  # an integer past a float's range
        took = math.inf
    if not 0 <= took < math.inf:
        raise ShardError(f"{where}: seconds {value!r:.100} is not a number of seconds (a finite number, 0 or more, "
                         "as the grader writes it: `1.25`)")
    return took


def _student(field: str, by_cell: dict[str, list[str]], where: str, twin: Path) -> str:
    """The roster's name that the CSV field `field` is (see the module's note: the roster and the rows compared as
    the CSV writes them), or `field` unarmed where none is (merge then says it is not on the roster)."""
    names = by_cell.get(field, [])
    if len(names) > 1:
        raise ShardError(f"{where}: student {field!r} is how the CSV writes each of {_some(names)}, all on the roster "
                         "(a leading ' disarms a formula, and a name that starts with ' is written as it is), so the "
                         f"CSV alone cannot tell which: merge with the JSON beside the part ({twin}), which holds the "
                         "names whole")
    return names[0] if names else _unarmed(field)


def _rows_of_csv(lines: list[str], path: Path, roster: list[str], before: int) -> list[tuple[Row, str]]:
    """A part's rows from its CSV (`lines`: those after the `before` lines of facts and signature), each row
    checked and named by its line."""
    reader = csv.reader(lines)
    header = next(reader, [])
    if tuple(header) != COLUMNS:
        raise ShardError(f"{path}: its columns are {header}, not a gradebook's {list(COLUMNS)}")
    by_cell: dict[str, list[str]] = {}  # a name as the CSV writes it -> the roster's names written so
    for name in roster:
        by_cell.setdefault(cell(name), []).append(name)
    rows = []
    for fields in reader:
        where = f"{path}, line {reader.line_num + before}"
        if not fields:
            continue  # a blank line, as csv.DictReader skips it
        if len(fields) != len(COLUMNS):
            raise ShardError(f"{where}: {len(fields)} fields, not {len(COLUMNS)} ({', '.join(COLUMNS)}): "
                             f"{','.join(fields)!r:.200}, a row cut short or run together with another?")
        student, *middle, seconds = fields
        rows.append((Row(_student(student, by_cell, where, path.with_suffix(".json")), *map(_unarmed, middle),
                         _seconds(seconds, where, text=True)), where))
    return _once(rows)


def _rows_of_json(whole: dict, where: str) -> list[tuple[Row, str]]:
    rows = whole.get("rows")
    if "rows" not in whole:
        raise ShardError(f"{where}: no 'rows' (a gradebook's JSON holds limits, part, rows and students)")
    if not isinstance(rows, list):
        raise ShardError(f"{where}: 'rows' is not a list but {type(rows).__name__}")
    for i, row in enumerate(rows, 1):
        lacks = [c for c in COLUMNS if c not in row] if isinstance(row, dict) else list(COLUMNS)
        if lacks:
            raise ShardError(f"{where}: row {i} lacks {', '.join(map(repr, lacks))} (a row has {list(COLUMNS)})")
        odd = next((c for c in COLUMNS[:-1] if not isinstance(row[c], str)), None)
        if odd:
            raise ShardError(f"{where}: row {i}: {odd!r} is {row[odd]!r:.100}, not text")
    return _once([(Row(*(r[c] for c in COLUMNS[:-1]), _seconds(r["seconds"], f"{where}: row {i}")),
                   f"{where}: row {i}") for i, r in enumerate(rows, 1)])


def _once(rows: list[tuple[Row, str]]) -> list[tuple[Row, str]]:
    """The rows, each (student, lab, exercise) once, as one run writes them; a second is refused, naming both
    places (two parts' files run together, or an edited one: which of its verdicts would count?)."""
    first: dict[tuple[str, str, str], str] = {}
    for row, where in rows:
        key = (row.student, row.lab, row.exercise)
        if key in first:
            raise ShardError(f"{where}: student {row.student!r}, lab {row.lab!r}, exercise {row.exercise!r} again "
                             f"(first: {first[key]}): a part holds each once")
        first[key] = where
    return rows


def _json(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except ValueError as e:
        raise ShardError(f"{where}: not JSON ({e})") from None


def _whole(path: Path, where: str) -> dict:
    """A gradebook's JSON, the part's own or the twin beside its CSV."""
    whole = _json(_text_of(path, where), where)
    if not isinstance(whole, dict):
        raise ShardError(f"{where}: not a JSON object of a gradebook (it holds a {type(whole).__name__})")
    return whole


@dataclass
class _Part:
    """A part as read: its facts, its rows (each checked against the facts), and for each of its files (the CSV,
    the JSON) where it is, its signature (None: unsigned) and what the signature covers."""

    facts: dict
    rows: list[Row]
    signed: list[tuple[str, object, bytes]]


PART_BYTES = 256 * 2**20  # a part's file at most: a class of thousands is tens of MiB; a forged roster of 10**9 names,
#                          GiBs, is refused before it is read


def _text_of(path: Path, where: str | None = None) -> str:
    """A part's file as text, `where` (default: its path) naming it in a refusal."""
    where = where or str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(PART_BYTES + 1)
    except OSError as e:
        raise ShardError(f"{where}: cannot be read ({e.strerror or e})") from None
    if len(raw) > PART_BYTES:
        raise ShardError(f"{where}: over {PART_BYTES:,} B, more than any class's part holds; not read")
    try:  # as read_text reads it: universal newlines
        return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8").read()
    except ValueError as e:
        raise ShardError(f"{where}: cannot be read ({e})") from None


def _as_csv(rows: list[Row]) -> list[str]:
    """The lines of the CSV report.write writes of `rows`, header first (line ends as read: `\\n`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([cell(_as_written(v) if isinstance(v, str) else v) for v in astuple(row)] for row in rows)
    return out.getvalue().split("\n")


def _twin_alike(lines: list[str], rows: list[Row], path: Path, twin: Path, before: int) -> None:
    """Refuse a CSV whose rows are not those its JSON twin holds, as the CSV writes them (one edited alone)."""
    want = _as_csv(rows)
    differ = next((i for i, (a, b) in enumerate(zip(lines, want)) if a != b), None)
    if differ is None and len(lines) == len(want):
        return
    if differ is None:
        raise ShardError(f"{path}: {len(lines) - 2} rows, and its JSON twin {twin} {len(want) - 2}: one edited "
                         "apart from the other (merge takes the rows whole from the JSON)")
    raise ShardError(f"{path}, line {differ + before + 1} is {lines[differ]!r:.150}, but its JSON twin {twin} says "
                     f"{want[differ]!r:.150}: one edited apart from the other (merge takes the rows whole from the "
                     "JSON)")


def _read(path: Path) -> _Part:
    """A part from its CSV (rows whole from the JSON twin beside it, where it is: the CSV cuts long messages; the
    CSV must hold what the twin does) or its JSON (`--json`)."""
    if path.suffix == ".json":
        whole = _whole(path, str(path))
        if "part" not in whole:
            raise ShardError(f"{path}: not a part (a gradebook written without --shard K/N)")
        found = _checked(whole["part"], str(path))
        return _Part(found, _graded_as(found, _rows_of_json(whole, str(path))),
                     [(str(path), whole.get("signature"), signature.json_content(whole))])
    lines = _text_of(path).split("\n")
    if not lines[0].startswith(MARK):
        raise ShardError(f"{path}: not a part: its first line is not `{MARK}{{...}}` (a gradebook written without "
                         "--shard K/N?)")
    found = _checked(_json(lines[0][len(MARK):], f"{path}: its first line, after `{MARK.strip()}`,"), str(path))
    signed = lines[1].startswith(signature.LINE) if len(lines) > 1 else False
    sign = lines.pop(1)[len(signature.LINE):] if signed else None
    files = [(str(path), sign, signature.csv_content(lines))]
    before, body = 1 + signed, lines[1:]
    twin = path.with_suffix(".json")
    if not twin.is_file():
        return _Part(found, _graded_as(found, _rows_of_csv(body, path, found["roster"]["students"], before)), files)
    where = f"{twin} (the JSON beside {path}, read for the rows whole)"
    whole = _whole(twin, where)
    if whole.get("part") != found:
        raise ShardError(f"{where} is another part's ({str(whole.get('part'))[:200]}, not {str(found)[:200]})")
    rows = _graded_as(found, _rows_of_json(whole, where))
    _twin_alike(body, rows, path, twin, before)
    return _Part(found, rows, files + [(str(twin), whole.get("signature"), signature.json_content(whole))])


def read(path: Path) -> tuple[dict, list[Row]]:
    """(a part's facts, its rows), each checked against what the part says it graded; signatures not checked
    (``merge`` does)."""
    part = _read(path)
    return part.facts, part.rows


def _verified(part: _Part, key: signature.Key | None, unsigned: bool) -> list[str]:
    """Check each file's signature under `key`; the files without one, where `unsigned` takes them (else refused)."""
    for where, sign, content in part.signed:  # a signature that does not hold first: it says more than a bare file
        if sign is not None and key is None:
            raise ShardError(f"{where} is signed, and merge was given no key to check it with (--key FILE)")
        try:
            if sign is not None:
                key.check(sign, content, where)
        except signature.SignatureError as e:
            raise ShardError(str(e)) from None
    bare = [where for where, sign, _ in part.signed if sign is None]
    if bare and not unsigned:
        raise ShardError(f"{bare[0]}: not signed (graded without a key, or its signature cut off): merge --unsigned "
                         "takes unsigned parts on their word")
    return bare


def _differ(a: dict, b: dict) -> str:
    """What two parts' facts disagree on, but the part itself."""
    keys = [("labs", a["labs"], b["labs"])] + [(f"limit {k}", a["limits"].get(k), b["limits"].get(k))
                                                for k in sorted(set(a["limits"]) | set(b["limits"]))]
    keys += [("exercises", a["exercises"], b["exercises"]), ("N", a["shard"][1], b["shard"][1])]
    return "; ".join(f"{name} {x!r} against {y!r}" for name, x, y in keys if x != y)


def _some(names: list[str], most: int = 10) -> str:
    shown = ", ".join(map(repr, names[:most]))
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _other_class(a_path: Path, a: dict, b_path: Path, b: dict) -> str:
    """Why parts `a` and `b` were not split from one class ("" when they were)."""
    ra, rb = a["roster"], b["roster"]
    if ra["sha256"] == rb["sha256"]:
        return ""
    only_a = sorted(set(ra["students"]) - set(rb["students"]))
    only_b = sorted(set(rb["students"]) - set(ra["students"]))
    lacks = "; ".join(f"{one} has {_some(names)}, which {other} lacks" for one, other, names in
                      ((b_path, a_path, only_b), (a_path, b_path, only_a)) if names)
    return (f"{b_path} and {a_path} were split from different classes: their rosters differ (sha256 "
            f"{rb['sha256'][:16]}... of {len(rb['students'])} names against {ra['sha256'][:16]}... of "
            f"{len(ra['students'])}): {lacks}. Every machine must find the same files (one folder, given alike)")


def _uncovered(roster: dict, owner: dict[str, Path], by_k: dict[int, Path], n: int) -> str:
    """The students of the roster that no part graded, each with the part its name belongs to ("" when none)."""
    missing = [name for name in roster["students"] if name not in owner]
    if not missing:
        return ""
    where = ", ".join(f"{name!r}: part {part_of(name, n)}/{n}, {by_k[part_of(name, n)]}" for name in missing[:10])
    return (f"{_some(missing)} {'is' if len(missing) == 1 else 'are'} on the roster (the class every part was split "
            f"from, {len(roster['students'])} names) but in no part ({where}): was the file missing on that "
            "machine, or not readable there?")


@dataclass(frozen=True)
class Merged:
    """One class graded in parts, joined: its limits, every row as one run would have written them, and the files
    taken without a signature (merge's `unsigned`)."""

    limits: dict
    rows: list[Row]
    unsigned: list[str]


def merge(paths: list[Path], key: signature.Key | None = None, unsigned: bool = False) -> Merged:
    """The parts at `paths` joined, each checked against itself (its facts, its JSON twin) and its signatures under
    `key` (a part without one refused, unless `unsigned`), then against the others."""
    if not paths:
        raise ShardError("merge: name the parts (PART.csv ...)")
    parts, bare = [], []
    for p in paths:  # each part whole, signature and all, before the next is read
        part = _read(p)
        bare += _verified(part, key, unsigned)
        parts.append((p, part.facts, part.rows))
    first_path, first, _ = parts[0]
    by_k: dict[int, Path] = {}
    for path, found, _ in parts:
        if _differ(first, found):
            raise ShardError(f"{path} and {first_path} are parts of different runs: {_differ(first, found)}")
        if _other_class(first_path, first, path, found):
            raise ShardError(_other_class(first_path, first, path, found))
        k = found["shard"][0]
        if k in by_k:
            raise ShardError(f"part {k}/{found['shard'][1]} is given twice: {by_k[k]} and {path}")
        by_k[k] = path
    n = first["shard"][1]
    missing = sorted(set(range(n)) - set(by_k))
    if missing:
        raise ShardError(f"parts {', '.join(f'{k}/{n}' for k in missing)} are missing (given: "
                         f"{', '.join(f'{k}/{n}' for k in sorted(by_k))}): merge joins all N parts")
    roster = set(first["roster"]["students"])
    owner: dict[str, Path] = {}
    rows: list[Row] = []
    for path, found, got in parts:
        k = found["shard"][0]
        for student in dict.fromkeys(r.student for r in got):
            if student in owner:
                raise ShardError(f"{student!r} is in two parts: {owner[student]} and {path}")
            if part_of(student, n) != k:
                raise ShardError(f"{student!r} is in {path} (part {k}/{n}), but that name belongs to part "
                                 f"{part_of(student, n)}/{n}: not a part of this class's split")
            if student not in roster:
                raise ShardError(f"{student!r} is in {path} but not on the roster its part was split from "
                                 f"({len(roster)} names, sha256 {first['roster']['sha256'][:16]}...)")
            owner[student] = path
        rows += got
    if _uncovered(first["roster"], owner, by_k, n):
        raise ShardError(_uncovered(first["roster"], owner, by_k, n))
    return Merged(first["limits"], ordered(rows), bare)


def written(out: Path, as_json: bool) -> list[Path]:
    """The files report.write writes for the gradebook `out`."""
    return [out] if as_json else [out, out.with_suffix(".json"), out.with_name(f"{out.stem}_students.csv")]


def check_out(out: Path, as_json: bool, parts: list[Path]) -> None:
    """Refuse an --out of merge that is a folder, lies below a file, or would write over a part given (or the JSON
    beside one, which merge reads)."""
    if out.is_dir():
        raise ShardError(f"--out {out}: a folder; name the gradebook's file in it ({out / 'grades.csv'})")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ShardError(f"--out {out}: {above} is a file, not a folder; --out names a file in a folder that is "
                         "there or can be made")
    given = [q for p in parts for q in (p, p.with_suffix(".json")) if q.is_file()]
    for target in written(out, as_json):
        hit = next((q for q in given if target.exists() and os.path.samefile(target, q)), None)
        if hit is not None:
            same = f"{target}" if str(target) == str(hit) else f"{target}, which is {hit}"
            raise ShardError(f"--out {out} would write {same}, a part given (or the JSON beside one, which merge "
                             "reads): name a gradebook apart from the parts")
