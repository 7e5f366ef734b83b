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

A part's CSV read alone (no JSON twin beside it) names each student as the roster does: the roster's names and the
rows' are compared as the CSV writes them (``_student``). The CSV disarms a formula with a leading quote, so `-x` is
written `'-x`, and so is a name that is `'-x`: a field is whichever of them the roster holds, and a roster that holds
both is refused for that field (the JSON holds the names whole).
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path

from labkit.course.grade.report import COLUMNS, Row, ordered
from labkit.course.grade.report import _cell  # a CSV field as the gradebook writes it

__all__ = ["MARK", "ShardError", "parse", "part_of", "roster_of", "facts", "read", "merge", "written",
           "check_out"]

SECONDS = re.compile(r"([0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)?")  # seconds as the CSV writes a float, or ""
MARK = "# labkit grade part "  # the first line of a part's CSV, before its JSON facts


class ShardError(ValueError):
    """A shard that cannot be graded or parts that cannot be merged: the message names the value and what is
    allowed."""


def parse(text: str) -> tuple[int, int]:
    """(K, N) from "K/N": N parts, K from 0 to N-1."""
    found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not found:
        raise ShardError(f"--shard {text!r}: say K/N, the K-th of N parts (K from 0 to N-1: 0/4 ... 3/4)")
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


def facts(labs: list[str], limits: dict, k: int, n: int, roster: Iterable[str] | None = None) -> dict:
    """What a part was graded as: merge joins only parts that agree on all of it but K. `roster`: the name of every
    file of the class to be graded (other labs' files left out), before the split; merge refuses a part without
    one."""
    found = {"labs": sorted(labs), "limits": limits, "shard": [k, n]}
    return found if roster is None else {**found, "roster": roster_of(roster)}


def _checked(found: object, where: str) -> dict:
    """A part's facts as read from `where`, each checked, so that merge never meets a KeyError."""
    if not isinstance(found, dict):
        raise ShardError(f"{where}: its part is {found!r}, not an object of facts (labs, limits, shard, roster)")
    lacks = [key for key in ("labs", "limits", "shard") if key not in found]
    if lacks:
        raise ShardError(f"{where}: its facts lack {', '.join(map(repr, lacks))} (a part written by hand?)")
    shard = found["shard"]
    if not (isinstance(shard, list) and len(shard) == 2 and all(type(v) is int for v in shard)
            and 0 <= shard[0] < shard[1]):
        raise ShardError(f"{where}: shard {shard!r} is not [K, N] with 0 <= K < N")
    if not isinstance(found["labs"], list) or not isinstance(found["limits"], dict):
        raise ShardError(f"{where}: labs {found['labs']!r} and limits {found['limits']!r} are not a list and an "
                         "object")
    if "roster" not in found:
        raise ShardError(f"{where}: its facts have no roster (the class it was split from): written by a labkit "
                         "from before parts recorded one, so merge cannot tell that the parts cover one class; "
                         "grade the parts again with this kit")
    roster = found["roster"]
    names = roster.get("students") if isinstance(roster, dict) else None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ShardError(f"{where}: its roster is {roster!r:.200}, not {{\"sha256\": ..., \"students\": [...]}}")
    if roster_of(names) != roster:
        raise ShardError(f"{where}: its roster's sha256 {roster.get('sha256')!r} is not that of its {len(names)} "
                         f"names, sorted ({roster_of(names)['sha256']}): edited or cut?")
    return found


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


def _student(cell: str, by_cell: dict[str, list[str]], where: str, twin: Path) -> str:
    """The roster's name that the CSV field `cell` is (see the module's note: the roster and the rows compared as
    the CSV writes them), or `cell` unarmed where none is (merge then says it is not on the roster)."""
    names = by_cell.get(cell, [])
    if len(names) > 1:
        raise ShardError(f"{where}: student {cell!r} is how the CSV writes each of {_some(names)}, all on the roster "
                         "(a leading ' disarms a formula, and a name that starts with ' is written as it is), so the "
                         f"CSV alone cannot tell which: merge with the JSON beside the part ({twin}), which holds the "
                         "names whole")
    return names[0] if names else _unarmed(cell)


def _rows_of_csv(lines: list[str], path: Path, roster: list[str]) -> list[Row]:
    """A part's rows from its CSV (`lines`: all but the facts' line), each row checked and named by its line."""
    reader = csv.reader(lines)
    header = next(reader, [])
    if tuple(header) != COLUMNS:
        raise ShardError(f"{path}: its columns are {header}, not a gradebook's {list(COLUMNS)}")
    by_cell: dict[str, list[str]] = {}  # a name as the CSV writes it -> the roster's names written so
    for name in roster:
        by_cell.setdefault(_cell(name), []).append(name)
    rows = []
    for fields in reader:
        where = f"{path}, line {reader.line_num + 1}"  # + 1: the facts' line, before `lines`
        if not fields:
            continue  # a blank line, as csv.DictReader skips it
        if len(fields) != len(COLUMNS):
            raise ShardError(f"{where}: {len(fields)} fields, not {len(COLUMNS)} ({', '.join(COLUMNS)}): "
                             f"{','.join(fields)!r:.200}, a row cut short or run together with another?")
        student, *middle, seconds = fields
        rows.append((Row(_student(student, by_cell, where, path.with_suffix(".json")), *map(_unarmed, middle),
                         _seconds(seconds, where, text=True)), where))
    return _once(rows)


def _rows_of_json(whole: dict, where: str) -> list[Row]:
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


def _once(rows: list[tuple[Row, str]]) -> list[Row]:
    """The rows, each (student, lab, exercise) once, as one run writes them; a second is refused, naming both
    places (two parts' files run together, or an edited one: which of its verdicts would count?)."""
    first: dict[tuple[str, str, str], str] = {}
    for row, where in rows:
        key = (row.student, row.lab, row.exercise)
        if key in first:
            raise ShardError(f"{where}: student {row.student!r}, lab {row.lab!r}, exercise {row.exercise!r} again "
                             f"(first: {first[key]}): a part holds each once")
        first[key] = where
    return [row for row, _ in rows]


def _json(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except ValueError as e:
        raise ShardError(f"{where}: not JSON ({e})") from None


def _whole(path: Path, where: str) -> dict:
    """A gradebook's JSON, the part's own or the twin beside its CSV."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        raise ShardError(f"{where}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    whole = _json(text, where)
    if not isinstance(whole, dict):
        raise ShardError(f"{where}: not a JSON object of a gradebook (it holds a {type(whole).__name__})")
    return whole


def read(path: Path) -> tuple[dict, list[Row]]:
    """(a part's facts, its rows) from its CSV (rows whole from the JSON twin beside it, where it is: the CSV cuts
    long messages) or its JSON (`--json`)."""
    if path.suffix == ".json":
        whole = _whole(path, str(path))
        if "part" not in whole:
            raise ShardError(f"{path}: not a part (a gradebook written without --shard K/N)")
        return _checked(whole["part"], str(path)), _rows_of_json(whole, str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        raise ShardError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    first, _, rest = text.partition("\n")
    if not first.startswith(MARK):
        raise ShardError(f"{path}: not a part: its first line is not `{MARK}{{...}}` (a gradebook written without "
                         "--shard K/N?)")
    found = _checked(_json(first[len(MARK):], f"{path}: its first line, after `{MARK.strip()}`,"), str(path))
    twin = path.with_suffix(".json")
    if not twin.is_file():
        return found, _rows_of_csv(rest.splitlines(), path, found["roster"]["students"])
    where = f"{twin} (the JSON beside {path}, read for the rows whole)"
    whole = _whole(twin, where)
    if whole.get("part") != found:
        raise ShardError(f"{where} is another part's ({str(whole.get('part'))[:200]}, not {str(found)[:200]})")
    return found, _rows_of_json(whole, where)


def _differ(a: dict, b: dict) -> str:
    """What two parts' facts disagree on, but the part itself."""
    keys = [("labs", a["labs"], b["labs"])] + [(f"limit {k}", a["limits"].get(k), b["limits"].get(k))
                                                for k in sorted(set(a["limits"]) | set(b["limits"]))]
    keys.append(("N", a["shard"][1], b["shard"][1]))
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


def merge(paths: list[Path]) -> tuple[dict, list[Row]]:
    """(the limits, every row) of one class graded in parts, as one run would have written them."""
    if not paths:
        raise ShardError("merge: name the parts (PART.csv ...)")
    parts = [(p, *read(p)) for p in paths]
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
    return first["limits"], ordered(rows)


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
