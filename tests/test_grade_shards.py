"""`labkit grade --shard K/N` and `labkit grade merge PART.csv...`: a class split by the students' names alone, graded
in parts (one per machine of a batch system), joined into the gradebook one run writes.

The first tests run nothing (the split, the parts' facts, the refusals); the long one grades a class in four shards
and in one run, in the sandbox, and compares the two gradebooks (`make long-test`)."""
from __future__ import annotations

import csv
import random
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.course.grade import report, sandbox, shards
from labkit.course.grade.report import Row

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))
LIMITS = {"cell_timeout": 60.0, "profile": "tiny", "seed": 7}


def _class(count: int) -> list[Row]:
    """Rows of `count` students of lab 02 (two exercises each), with names a spreadsheet would run and a cut message."""
    names = [f"s{i:02d}" for i in range(count)] + ["=cal", "ann\u00e9"]
    return [Row(name, "02", ex, random.Random(name + ex).choice(["passed", "failed"]), "-m" + "x" * 600 * (ex == "2.2"),
                1.5) for name in names for ex in ("2.1", "2.2")]


def _write_parts(rows: list[Row], folder: Path, n: int, limits: dict = LIMITS, as_json: bool = False) -> list[Path]:
    paths = []
    for k in range(n):
        mine = [r for r in rows if shards.part_of(r.student, n) == k]
        path = folder / f"part{k}.{'json' if as_json else 'csv'}"
        report.write(mine, path, as_json, limits, None, shards.facts(["02"], limits, k, n))
        paths.append(path)
    return paths


def test_a_student_s_part_is_chosen_from_the_name_alone_and_every_student_is_in_exactly_one():
    names = [f"student{i}" for i in range(400)]
    parts = {name: shards.part_of(name, 4) for name in names}
    assert parts == {name: shards.part_of(name, 4) for name in reversed(names)}  # whatever the order
    assert set(parts.values()) == {0, 1, 2, 3} and min(list(parts.values()).count(k) for k in range(4)) > 60
    assert shards.part_of("alice", 1) == 0
    assert shards.parse("3/4") == (3, 4) and shards.parse("0/1") == (0, 1)
    for bad in ("4/4", "1", "-1/4", "a/b", "0/0"):
        with pytest.raises(shards.ShardError, match="--shard"):
            shards.parse(bad)


@pytest.mark.parametrize("as_json", [False, True])
def test_parts_merged_are_the_gradebook_one_run_writes(tmp_path, as_json):
    rows = _class(9)
    whole = tmp_path / "one" / "grades.csv"
    report.write(report.ordered(rows), whole, False, LIMITS)
    limits, merged = shards.merge(_write_parts(rows, tmp_path / "parts", 4, as_json=as_json))
    assert limits == LIMITS
    report.write(merged, tmp_path / "merged" / "grades.csv", False, limits)
    for name in ("grades.csv", "grades_students.csv", "grades.json"):
        assert (tmp_path / "merged" / name).read_text() == (tmp_path / "one" / name).read_text(), name


def test_a_part_s_csv_alone_merges_as_its_json_would_bar_the_cut_messages(tmp_path):
    rows = _class(5)
    parts = _write_parts(rows, tmp_path, 3)
    for p in parts:
        p.with_suffix(".json").unlink()
    _, merged = shards.merge(parts)
    short = {(r.student, r.exercise): (r.status, r.message) for r in merged}
    assert {k: v[0] for k, v in short.items()} == {(r.student, r.exercise): r.status for r in rows}
    assert short[("=cal", "2.1")][1] == "-m" and short[("s01", "2.2")][1].endswith(report.CUT)


def test_merge_refuses_parts_of_other_runs_a_missing_or_doubled_part_and_a_student_in_two(tmp_path):
    rows = _class(8)
    parts = _write_parts(rows, tmp_path / "a", 4)
    with pytest.raises(shards.ShardError, match=r"parts 3/4 are missing"):
        shards.merge(parts[:3])
    with pytest.raises(shards.ShardError, match=r"part 1/4 is given twice"):
        shards.merge([*parts, parts[1]])
    other_seed = _write_parts(rows, tmp_path / "b", 4, dict(LIMITS, seed=8))
    with pytest.raises(shards.ShardError, match=r"different runs: limit seed 7 against 8"):
        shards.merge([*parts[:3], other_seed[3]])
    other_n = _write_parts(rows, tmp_path / "c", 2)
    with pytest.raises(shards.ShardError, match=r"N 4 against 2"):
        shards.merge([*parts[:3], other_n[1]])
    other_lab = tmp_path / "d" / "part3.csv"
    report.write([], other_lab, False, LIMITS, None, shards.facts(["03"], LIMITS, 3, 4))
    with pytest.raises(shards.ShardError, match=r"labs \['02'\] against \['03'\]"):
        shards.merge([*parts[:3], other_lab])
    k = shards.part_of("s00", 4)
    moved = tmp_path / "e" / f"part{(k + 1) % 4}.csv"  # s00 again, in a part its name does not belong to
    mine = [r for r in rows if shards.part_of(r.student, 4) == (k + 1) % 4] + [r for r in rows if r.student == "s00"]
    report.write(mine, moved, False, LIMITS, None, shards.facts(["02"], LIMITS, (k + 1) % 4, 4))
    with pytest.raises(shards.ShardError, match=r"'s00' is in two parts|'s00' is in .* belongs to part"):
        shards.merge([p if p.name != moved.name else moved for p in parts])
    plain = tmp_path / "plain.csv"
    report.write(rows, plain, False, LIMITS)
    with pytest.raises(shards.ShardError, match="not a part"):
        shards.merge([plain])


def _grade(tmp_path: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "labkit", "grade", *args, "--out", str(out)], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _book(path: Path) -> list[dict]:
    """A gradebook's rows, each without its seconds (they differ from run to run)."""
    with path.open(newline="", encoding="utf-8") as f:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]


@needs_bwrap
@pytest.mark.slow
@pytest.mark.long  # a class graded twice in the sandbox, once in four parts: about two minutes on two cores
def test_four_shards_merged_are_one_run_s_verdicts_and_points(tmp_path):
    """bars/grade-shards: a class of lab 02 (passes, a wrong 2.1, stubs) graded in four parts, each given the class
    as the shell's glob of its files, merged, is the gradebook one run of the class's folder writes (but seconds)."""
    import nbformat

    from labkit.course.grade import bench
    from labkit.course.grade.rebuild import Pristine

    pristine = Pristine.read("02", ROOT / "notebooks" / "02_recompute.ipynb")
    folder = tmp_path / "returned"
    for i, name in enumerate(["ada", "bo", "cy", "di", "ed", "flo", "gus", "hal"]):
        (folder / name).mkdir(parents=True)
        nbformat.write(bench.submission(i + 3, pristine, ROOT)[0], folder / name / "02_recompute.ipynb")
    common = ("--labs", "02", "--seed", "11", "--jobs", "2")
    _grade(tmp_path, tmp_path / "one" / "grades.csv", str(folder), *common)
    listed = sorted(str(p) for p in folder.glob("*/02_recompute.ipynb"))
    parts = [tmp_path / "parts" / f"part{k}.csv" for k in range(4)]
    for k, part in enumerate(parts):
        _grade(tmp_path, part, *listed, *common, "--shard", f"{k}/4")
    merged = tmp_path / "merged" / "grades.csv"
    subprocess.run([sys.executable, "-m", "labkit", "grade", "merge", *map(str, parts), "--out", str(merged)],
                   check=True, capture_output=True, cwd=tmp_path)
    one = _book(tmp_path / "one" / "grades.csv")
    assert {r["student"] for r in one} == {"ada", "bo", "cy", "di", "ed", "flo", "gus", "hal"}
    assert {r["status"] for r in one} >= {"passed", "failed", "not attempted"}
    assert _book(merged) == one
    assert (tmp_path / "merged" / "grades_students.csv").read_text() == \
        (tmp_path / "one" / "grades_students.csv").read_text()
    sizes = [len({r.student for r in shards.read(p)[1]}) for p in parts]
    assert sum(sizes) == 8 and max(sizes) < 8, sizes  # each student in one part, and not all in one


def test_a_shard_without_a_seed_or_a_leaderboard_in_a_shard_is_refused_before_grading(tmp_path, capsys):
    from labkit.__main__ import main

    for extra, said in ((["--shard", "0/4"], "--shard needs --seed N"),
                        (["--shard", "5/4", "--seed", "1"], "K must be 0 to 3"),
                        (["--shard", "0/4", "--seed", "1", "--labs", "07", "--leaderboard"], "not in a --shard"),
                        (["--labs", "02", "--leaderboard"], "--labs 02 leaves it out")):
        assert main(["grade", str(tmp_path), *extra, "--out", str(tmp_path / "g.csv")]) == 2
        assert said in capsys.readouterr().err, extra
