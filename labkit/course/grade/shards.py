"""A class split across machines: `labkit grade --shard K/N` grades one part, `labkit grade merge PART.csv...` joins them.

A student's part is chosen from the student's name alone (``part_of``: SHA-256 of the name, mod N), so every
machine that is given the same class, in any order, agrees on who is in which part, and every student is in
exactly one. K counts from 0, as a Kubernetes Indexed Job's completion index and a Slurm array's `--array=0-3`
do. Each part's gradebook carries what it was graded as (``facts``: the labs, the limits with the seed, K and N)
in its first line, a CSV comment (`# labkit grade part {...}`), and in its JSON twin's "part"; ``merge`` refuses
parts that disagree on any of them, a part missing or given twice, and a student in two parts (or in a part the
name does not belong to), naming what differs.
"""
from __future__ import annotations

import csv
import hashlib
import json
import re
from pathlib import Path

from labkit.course.grade.report import COLUMNS, Row, ordered

__all__ = ["MARK", "ShardError", "parse", "part_of", "facts", "read", "merge"]

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


def facts(labs: list[str], limits: dict, k: int, n: int) -> dict:
    """What a part was graded as: merge joins only parts that agree on all of it but K."""
    return {"labs": sorted(labs), "limits": limits, "shard": [k, n]}


def _unarmed(value: str) -> str:
    """A CSV field as the grader meant it: the quote that disarmed a formula taken off."""
    return value[1:] if value[:1] == "'" and value[1:2] in ("=", "+", "-", "@") else value


def _rows_of_csv(lines: list[str], path: Path) -> list[Row]:
    reader = csv.DictReader(lines)
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ShardError(f"{path}: its columns are {reader.fieldnames}, not a gradebook's {list(COLUMNS)}")
    return [Row(*(_unarmed(r[c]) for c in COLUMNS[:-1]), float(r["seconds"] or 0)) for r in reader]


def _rows_of_json(whole: dict) -> list[Row]:
    return [Row(**{c: r[c] for c in COLUMNS}) for r in whole["rows"]]


def read(path: Path) -> tuple[dict, list[Row]]:
    """(a part's facts, its rows) from its CSV (rows whole from the JSON twin beside it, where it is: the CSV cuts
    long messages) or its JSON (`--json`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ShardError(f"{path}: cannot be read ({e.strerror})") from None
    if path.suffix == ".json":
        whole = json.loads(text)
        if "part" not in whole:
            raise ShardError(f"{path}: not a part (a gradebook written without --shard K/N)")
        return whole["part"], _rows_of_json(whole)
    first, _, rest = text.partition("\n")
    if not first.startswith(MARK):
        raise ShardError(f"{path}: not a part: its first line is not `{MARK}{{...}}` (a gradebook written without "
                         "--shard K/N?)")
    found = json.loads(first[len(MARK):])
    twin = path.with_suffix(".json")
    if twin.is_file():
        whole = json.loads(twin.read_text(encoding="utf-8"))
        if whole.get("part") != found:
            raise ShardError(f"{twin}, beside {path}, is another part's ({whole.get('part')}, not {found})")
        return found, _rows_of_json(whole)
    return found, _rows_of_csv(rest.splitlines(), path)


def _differ(a: dict, b: dict) -> str:
    """What two parts' facts disagree on, but the part itself."""
    keys = [("labs", a["labs"], b["labs"])] + [(f"limit {k}", a["limits"].get(k), b["limits"].get(k))
                                                for k in sorted(set(a["limits"]) | set(b["limits"]))]
    keys.append(("N", a["shard"][1], b["shard"][1]))
    return "; ".join(f"{name} {x!r} against {y!r}" for name, x, y in keys if x != y)


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
        k = found["shard"][0]
        if k in by_k:
            raise ShardError(f"part {k}/{found['shard'][1]} is given twice: {by_k[k]} and {path}")
        by_k[k] = path
    n = first["shard"][1]
    missing = sorted(set(range(n)) - set(by_k))
    if missing:
        raise ShardError(f"parts {', '.join(f'{k}/{n}' for k in missing)} are missing (given: "
                         f"{', '.join(f'{k}/{n}' for k in sorted(by_k))}): merge joins all N parts")
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
            owner[student] = path
        rows += got
    return first["limits"], ordered(rows)
