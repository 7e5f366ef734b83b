"""`labkit grade --shard K/N` and `labkit grade merge PART.csv...`: a class split by the students' names alone, graded
in parts (one per machine of a batch system), joined into the gradebook one run writes.

The first tests run nothing (the split, the parts' facts, the refusals); the long one grades a class in four shards
and in one run, in the sandbox, and compares the two gradebooks (`make long-test`)."""
from __future__ import annotations

import csv
import hashlib
import itertools
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit.course.grade import files, report, sandbox, shards, signature
from labkit.course.grade.report import Row

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))
LIMITS = {"cell_timeout": 60.0, "profile": "tiny", "seed": 7}
SECRET = b"a test key, never a class's: 0123456789abcdef"
KEY = signature.Key(Path("/nowhere/grade.key"), SECRET)  # signs every part these tests write, unless told not to


def _class(count: int) -> list[Row]:
    """Rows of `count` students of lab 02 (two exercises each), with names a spreadsheet would run and a cut message."""
    names = [f"s{i:02d}" for i in range(count)] + ["=cal", "ann\u00e9"]
    return [Row(name, "02", ex, random.Random(name + ex).choice(["passed", "failed"]), "-m" + "x" * 600 * (ex == "2.2"),
                1.5) for name in names for ex in ("2.1", "2.2")]


def _roster(rows: list[Row]) -> list[str]:
    return sorted({r.student for r in rows})


def _exercises(rows: list[Row], labs: list[str]) -> dict[str, list[str]]:
    """Each lab's exercises, as the class `rows` has them (2.1 where it has none)."""
    return {lab: list(dict.fromkeys(r.exercise for r in rows if r.lab == lab)) or ["2.1"] for lab in labs}


def _write(rows: list[Row], path: Path, part: dict, as_json: bool = False, key: signature.Key | None = KEY) -> Path:
    """A part as `labkit grade --shard` writes it: report.write's files, then signed (unless `key` is None)."""
    report.write(rows, path, as_json, part["limits"], None, part)
    if key is not None:
        signature.sign_files(path, as_json, key)
    return path


def _write_parts(rows: list[Row], folder: Path, n: int, limits: dict = LIMITS, as_json: bool = False,
                 roster: list[str] | None = None, key: signature.Key | None = KEY) -> list[Path]:
    """The parts a sharded run of the class `rows` (or of the class `roster`, where given) writes."""
    paths = []
    for k in range(n):
        mine = [r for r in rows if shards.part_of(r.student, n) == k]
        path = folder / f"part{k}.{'json' if as_json else 'csv'}"
        part = shards.facts(["02"], limits, k, n, roster=_roster(rows) if roster is None else roster,
                            exercises=_exercises(rows, ["02"]))
        paths.append(_write(mine, path, part, as_json, key))
    return paths


def _merged(paths: list[Path], unsigned: bool = False) -> shards.Merged:
    return shards.merge(paths, KEY, unsigned)


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
    merged = _merged(_write_parts(rows, tmp_path / "parts", 4, as_json=as_json))
    assert merged.limits == LIMITS and merged.unsigned == []
    report.write(merged.rows, tmp_path / "merged" / "grades.csv", False, merged.limits)
    for name in ("grades.csv", "grades_students.csv", "grades.json"):
        assert (tmp_path / "merged" / name).read_text() == (tmp_path / "one" / name).read_text(), name


def test_a_part_s_csv_alone_merges_as_its_json_would_bar_the_cut_messages(tmp_path):
    rows = _class(5)
    parts = _write_parts(rows, tmp_path, 3)
    for p in parts:
        p.with_suffix(".json").unlink()
    short = {(r.student, r.exercise): (r.status, r.message) for r in _merged(parts).rows}
    assert {k: v[0] for k, v in short.items()} == {(r.student, r.exercise): r.status for r in rows}
    assert short[("=cal", "2.1")][1] == "-m" and short[("s01", "2.2")][1].endswith(report.CUT)


def test_merge_refuses_parts_of_other_runs_a_missing_or_doubled_part_and_a_student_in_two(tmp_path):
    rows = _class(8)
    parts = _write_parts(rows, tmp_path / "a", 4)
    with pytest.raises(shards.ShardError, match=r"parts 3/4 are missing"):
        _merged(parts[:3])
    with pytest.raises(shards.ShardError, match=r"part 1/4 is given twice"):
        _merged([*parts, parts[1]])
    other_seed = _write_parts(rows, tmp_path / "b", 4, dict(LIMITS, seed=8))
    with pytest.raises(shards.ShardError, match=r"different runs: limit seed 7 against 8"):
        _merged([*parts[:3], other_seed[3]])
    other_n = _write_parts(rows, tmp_path / "c", 2)
    with pytest.raises(shards.ShardError, match=r"N 4 against 2"):
        _merged([*parts[:3], other_n[1]])
    other_lab = _write([], tmp_path / "d" / "part3.csv", shards.facts(["03"], LIMITS, 3, 4, roster=_roster(rows),
                                                                      exercises={"03": ["3.1"]}))
    with pytest.raises(shards.ShardError, match=r"labs \['02'\] against \['03'\]"):
        _merged([*parts[:3], other_lab])
    k = shards.part_of("s00", 4)
    moved = tmp_path / "e" / f"part{(k + 1) % 4}.csv"  # s00 again, in a part its name does not belong to
    mine = [r for r in rows if shards.part_of(r.student, 4) == (k + 1) % 4] + [r for r in rows if r.student == "s00"]
    _write(mine, moved, shards.facts(["02"], LIMITS, (k + 1) % 4, 4, roster=_roster(rows),
                                     exercises=_exercises(rows, ["02"])))
    with pytest.raises(shards.ShardError, match=r"'s00' is in two parts|'s00' is in .* belongs to part"):
        _merged([p if p.name != moved.name else moved for p in parts])
    plain = tmp_path / "plain.csv"
    report.write(rows, plain, False, LIMITS)
    with pytest.raises(shards.ShardError, match="not a part"):
        _merged([plain])



# ---------------------------------------------------------------- names in any order
def _clashing_class(root: Path) -> list[Path]:
    """Files that take one name when listed (`ann`, `bob`: a file not named like a lab is its own name), in three
    rooms, and a folder per student that does not clash."""
    made = []
    for room in ("room1", "room2", "room3"):
        for name in ("ann.ipynb", "bob.ipynb"):
            made.append(root / room / name)
    made.append(root / "room2" / "cy" / "02_recompute.ipynb")
    for path in made:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    return made


def _names(paths: list[Path], root: Path) -> dict[str, str]:
    """Each file's name, by its path below `root` (what two machines that mount the class apart agree on)."""
    return {r.path.relative_to(root).as_posix(): r.student for r in files.discover(paths, {"02_recompute"})}


def test_files_that_clash_are_named_alike_whatever_order_they_are_given_in(tmp_path):
    """`#N` is given in one order (the files' paths below the class's common folder), never the order of the
    arguments: shards given the files in other orders (a glob, `find`) grade each file once."""
    made = _clashing_class(tmp_path / "class")
    rooms = [tmp_path / "class" / room for room in ("room1", "room2", "room3")]
    want = _names(made, tmp_path / "class")
    assert sorted(want.values()) == ["ann", "ann#2", "ann#3", "bob", "bob#2", "bob#3", "cy"]
    assert want["room1/ann.ipynb"] == "ann" and want["room3/bob.ipynb"] == "bob#3"  # the first path, the plain name
    for seed in range(30):
        order = random.Random(seed).sample(made, len(made))
        assert _names(order, tmp_path / "class") == want, order
    for order in itertools.permutations(rooms):  # folders given in any order: the same rule
        assert _names(list(order), tmp_path / "class") == want, order
    graded = []  # four shards, each given the files in its own order, grade every file once
    for k in range(4):
        order = random.Random(k).sample(made, len(made))
        graded += [r.path for r in files.discover(order, {"02_recompute"}) if shards.part_of(r.student, 4) == k]
    assert sorted(graded) == sorted(made)


def test_a_class_mounted_at_other_places_is_named_alike(tmp_path):
    """Two machines that mount the class at different folders (and list it in other orders) give the same names."""
    here = _clashing_class(tmp_path / "zz" / "class")
    there_root = tmp_path / "aa" / "deeper" / "class"
    shutil.copytree(tmp_path / "zz" / "class", there_root)
    there = [there_root / p.relative_to(tmp_path / "zz" / "class") for p in here]
    assert _names(here, tmp_path / "zz" / "class") == _names(there[::-1], there_root)


def test_a_student_folder_linked_outside_the_class_is_named_alike_wherever_the_link_points(tmp_path):
    """A room that is a link to a folder elsewhere (another disk, mounted at another place on each machine) takes
    its place among the names by its path as given (`class/room1/...`), not by where the link points."""
    made = {}
    for machine, outside in (("one", "aa"), ("two", "zz")):  # the room's disk: before and after the class
        root = tmp_path / machine / "class"
        made[machine] = _clashing_class(root)
        target = tmp_path / machine / outside / "disk" / "room1"
        target.parent.mkdir(parents=True)
        (root / "room1").rename(target)
        (root / "room1").symlink_to(target, target_is_directory=True)
    one = _names(made["one"], tmp_path / "one" / "class")
    assert one == _names(made["two"][::-1], tmp_path / "two" / "class")
    assert one["room1/ann.ipynb"] == "ann" and one["room3/ann.ipynb"] == "ann#3"  # room1 first, as given


# ---------------------------------------------------------------- the roster
def test_a_part_says_which_class_it_was_split_from(tmp_path):
    """The part's facts carry the roster: the SHA-256 of the whole class's names, sorted, and the names, in the
    CSV's first line and the JSON's "part" alike."""
    class_ = ["bo", "ann", "=cal", "ann"]  # as discovered: any order, a name per file
    part = shards.facts(["02"], LIMITS, 1, 3, roster=class_, exercises={"02": ["2.1"]})
    names = sorted(set(class_))
    assert part["roster"] == {"sha256": hashlib.sha256("\n".join(names).encode()).hexdigest(), "students": names}
    assert shards.facts(["02"], LIMITS, 0, 3, roster=list(reversed(class_)))["roster"] == part["roster"]
    _write([Row("ann", "02", "2.1", "passed", "")], tmp_path / "p.csv", part)
    assert shards.read(tmp_path / "p.csv")[0] == part
    (tmp_path / "p.json").unlink()
    assert shards.read(tmp_path / "p.csv")[0] == part  # the CSV alone says it too


def test_merge_refuses_parts_split_from_different_rosters_naming_the_hashes_and_the_students(tmp_path):
    rows = _class(6)
    names = _roster(rows)
    parts = _write_parts(rows, tmp_path / "a", 3)
    other = _write_parts(rows, tmp_path / "b", 3, roster=[*names, "zed"])  # another node saw one more file
    with pytest.raises(shards.ShardError) as refused:
        _merged([*parts[:2], other[2]])
    said = str(refused.value)
    assert "rosters differ" in said and "'zed'" in said and str(other[2]) in said
    for roster in (names, [*names, "zed"]):
        assert shards.roster_of(roster)["sha256"][:16] in said


def test_merge_refuses_a_student_of_the_roster_in_no_part_and_a_student_not_on_it(tmp_path):
    rows = _class(6)
    ghost = _write_parts(rows, tmp_path / "a", 3, roster=[*_roster(rows), "ghost"])  # graded by no part
    with pytest.raises(shards.ShardError, match=r"'ghost' is on the roster .* but in no part"):
        _merged(ghost)
    short = _write_parts(rows, tmp_path / "b", 3, roster=[n for n in _roster(rows) if n != "s03"])
    with pytest.raises(shards.ShardError, match=r"'s03' is in .* but not on the roster"):
        _merged(short)


@pytest.mark.parametrize("ghosts, listed", [(10, "'g09' are on the roster"), (11, "'g09' and 1 more are on")])
def test_students_in_no_part_are_named_ten_at_most_then_counted(tmp_path, ghosts, listed):
    rows = _class(6)
    names = [f"g{i:02d}" for i in range(ghosts)]
    parts = _write_parts(rows, tmp_path, 3, roster=[*_roster(rows), *names])
    with pytest.raises(shards.ShardError) as refused:
        _merged(parts)
    said = str(refused.value)
    assert listed in said and "more" not in said.replace(listed, ""), said


def test_parts_of_other_classes_are_named_by_the_first_16_hex_digits_of_their_rosters(tmp_path):
    rows = _class(6)
    parts = _write_parts(rows, tmp_path / "a", 3)
    other = _write_parts(rows, tmp_path / "b", 3, roster=[*_roster(rows), "zed"])
    with pytest.raises(shards.ShardError) as refused:
        _merged([*parts[:2], other[2]])
    said = str(refused.value)
    shown = re.findall(r"sha256 ([0-9a-f]+)\.\.\. of (\d+) names against ([0-9a-f]+)\.\.\. of (\d+)", said)
    assert shown == [(shards.roster_of([*_roster(rows), "zed"])["sha256"][:16], "9",
                      shards.roster_of(_roster(rows))["sha256"][:16], "8")], str(refused.value)


def test_merge_refuses_a_part_without_a_roster_or_with_names_its_hash_does_not_match(tmp_path):
    rows = _class(4)
    parts = _write_parts(rows, tmp_path, 2)
    whole = json.loads(parts[0].with_suffix(".json").read_text())
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({**whole, "part": {k: v for k, v in whole["part"].items() if k != "roster"}}))
    with pytest.raises(shards.ShardError, match=rf"{bare}: .*no roster"):
        _merged([bare, parts[1]])
    forged = tmp_path / "forged.json"
    roster = dict(whole["part"]["roster"], students=[*whole["part"]["roster"]["students"], "eve"])
    forged.write_text(json.dumps({**whole, "part": {**whole["part"], "roster": roster}}))
    with pytest.raises(shards.ShardError, match=rf"{forged}: .*sha256"):
        _merged([forged, parts[1]])


# ---------------------------------------------------------------- a part's files, read with care
def _twin(part: Path, text: str) -> Path:
    twin = part.with_suffix(".json")
    twin.write_text(text)
    return twin


def test_a_malformed_json_twin_or_part_is_refused_naming_the_file_and_what_is_wrong(tmp_path):
    rows = _class(4)
    parts = _write_parts(rows, tmp_path, 2)
    whole = json.loads(parts[0].with_suffix(".json").read_text())
    bad = {
        "not JSON": "{",
        "not a JSON object": "[1, 2]",
        "no 'rows'": json.dumps({k: v for k, v in whole.items() if k != "rows"}),
        "'status'": json.dumps({**whole, "rows": [{k: v for k, v in r.items() if k != "status"}
                                                  for r in whole["rows"]]}),
        "'rows' is not a list": json.dumps({**whole, "rows": {"a": 1}}),
    }
    for said, text in bad.items():
        twin = _twin(parts[0], text)
        with pytest.raises(shards.ShardError) as refused:
            _merged(parts)
        assert str(twin) in str(refused.value) and said in str(refused.value), (said, str(refused.value))
    for key in ("shard", "labs", "limits"):  # a part given as JSON whose facts lack one
        part = tmp_path / f"no_{key}.json"
        part.write_text(json.dumps({**whole, "part": {k: v for k, v in whole["part"].items() if k != key}}))
        with pytest.raises(shards.ShardError, match=rf"{part}: .*'{key}'"):
            _merged([part, parts[1]])
    for shard in ([3, 2], "0/2", [0]):
        part = tmp_path / "bad_shard.json"
        part.write_text(json.dumps({**whole, "part": {**whole["part"], "shard": shard}}))
        with pytest.raises(shards.ShardError, match=rf"{part}: .*shard"):
            _merged([part, parts[1]])
    _twin(parts[0], json.dumps(whole))
    lines = parts[1].read_text().splitlines(keepends=True)
    parts[1].write_text(shards.MARK + "{not json\n" + "".join(lines[1:]))
    with pytest.raises(shards.ShardError, match=rf"{parts[1]}: its first line"):
        _merged(parts)


def _csv_only(part: Path, rows_after_header: list[str]) -> Path:
    """`part`'s CSV with its JSON twin gone and its rows replaced by `rows_after_header` (the facts' line, the
    signature's and the header kept: the rows are lines 4 on)."""
    part.with_suffix(".json").unlink(missing_ok=True)
    head = part.read_text().splitlines(keepends=True)[:3]
    assert head[1].startswith(signature.LINE) and head[2].startswith("student,")
    part.write_text("".join(head) + "".join(line + "\n" for line in rows_after_header))
    return part


@pytest.mark.parametrize("row, said", [("ada,02", "2 fields, not 6"),
                                       ("ada,02,2.1,passed,,1.5,extra", "7 fields, not 6"),
                                       ("ada,02,2.1,passed,,abc", "seconds 'abc' is not a number"),
                                       ("ada,02,2.1,passed,,nan", "seconds 'nan' is not a number"),
                                       ("ada,02,2.1,passed,,1_000", "seconds '1_000' is not a number"),
                                       ("ada,02,2.2,passed,,0.5", "exercise '2.2' again (first: ")])
def test_a_csv_row_cut_short_run_long_or_with_bad_seconds_is_refused_naming_the_part_and_line(tmp_path, capsys,
                                                                                             row, said):
    """A part's CSV alone (no JSON twin): a row with fields missing or extra, seconds that is not a number as the
    grader writes one, or an exercise of a student already read (a second verdict: which would count?), is
    refused naming the file, its line (the facts' line is 1, the signature 2, the header 3) and what is wrong;
    never a TypeError
    (a missing field read as None) or a bare ValueError, which `grade merge` would print as a traceback."""
    parts = _write_parts([Row("ada", "02", "2.1", "passed", "", 1.5)], tmp_path, 1, roster=["ada"])
    _csv_only(parts[0], ["ada,02,2.2,failed,,0.5", row])
    with pytest.raises(shards.ShardError) as refused:
        _merged(parts)
    assert f"{parts[0]}, line 5: " in str(refused.value) and said in str(refused.value), str(refused.value)
    code, err = _merge(str(parts[0]), "--out", str(tmp_path / "merged" / "g.csv"), capsys=capsys)
    assert code == 2 and f"{parts[0]}, line 5" in err and "Traceback" not in err, err


def test_a_json_row_whose_fields_are_not_text_or_seconds_not_a_number_or_given_twice_is_refused(tmp_path):
    parts = _write_parts(_class(2), tmp_path, 1)
    twin = parts[0].with_suffix(".json")
    whole = json.loads(twin.read_text())
    for key, value, said in (("student", None, "'student' is None"),
                             ("seconds", "abc", "seconds 'abc' is not a number"),
                             ("seconds", "1.5", "seconds '1.5' is not a number"),  # the CSV's text, not JSON's
                             ("seconds", 10**400, "is not a number"),  # past a float: no OverflowError
                             ("seconds", True, "seconds True is not a number")):
        rows = [dict(whole["rows"][0], **{key: value}), *whole["rows"][1:]]
        twin.write_text(json.dumps({**whole, "rows": rows}))
        with pytest.raises(shards.ShardError) as refused:
            _merged(parts)
        assert str(twin) in str(refused.value) and "row 1: " in str(refused.value) and said in str(refused.value), \
            str(refused.value)
    twin.write_text(json.dumps({**whole, "rows": [*whole["rows"], whole["rows"][0]]}))  # a verdict given twice
    with pytest.raises(shards.ShardError) as refused:
        _merged(parts)
    assert f"row {len(whole['rows']) + 1}: " in str(refused.value) and "again (first: " in str(refused.value) and \
        "row 1)" in str(refused.value), str(refused.value)


def test_a_csv_alone_reads_back_the_roster_s_names_that_start_with_a_quote_or_a_formula_sign(tmp_path):
    """The CSV arms `-x` as `'-x`, and writes a name `'-x` as it is: a field `'-x` is whichever of the two the roster
    holds (roster and rows compared as the gradebook writes them), and both on one roster are refused, naming the
    JSON beside the part, which holds the names whole."""
    names = ["'-x", "-y", "'z", "=cal", "@at", "+p", "ann"]
    rows = [Row(name, "02", "2.1", "passed", "") for name in names]
    parts = _write_parts(rows, tmp_path / "a", 2)
    for p in parts:
        p.with_suffix(".json").unlink()
    assert sorted(r.student for r in _merged(parts).rows) == sorted(names)
    both = [Row(name, "02", "2.1", "passed", "") for name in ("-x", "'-x", "ann")]
    parts = _write_parts(both, tmp_path / "b", 1)
    parts[0].with_suffix(".json").unlink()
    with pytest.raises(shards.ShardError, match=r"line \d+: .*\"'-x\".*'-x'.*cannot tell.*part0\.json"):
        _merged(parts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sets(st.text(alphabet="'=-+@a \t\"", min_size=1, max_size=4), min_size=1, max_size=8),
       st.integers(1, 3))
def test_parts_csv_alone_name_the_students_as_their_json_does_or_are_refused_as_ambiguous(names, n):
    """Reference: the same parts merged with their JSON twins, which hold the names whole. Merged from the CSVs
    alone they give the same rows but seconds, unless two names of the roster are written alike in the CSV."""
    import tempfile

    rows = [Row(name, "02", "2.1", "passed", "", 1.25) for name in sorted(names)]
    with tempfile.TemporaryDirectory() as folder:
        parts = _write_parts(rows, Path(folder), min(n, len(names)))  # N at most the class's size
        reference = _merged(parts).rows
        for p in parts:
            p.with_suffix(".json").unlink()
        alike = len({report.cell(name) for name in names}) < len(names)
        if alike:
            with pytest.raises(shards.ShardError, match="cannot tell"):
                _merged(parts)
        else:
            assert _merged(parts).rows == reference


# ---------------------------------------------------------------- parts checked against what they say they graded
def _rows_of(path: Path) -> list[Row]:
    return [Row(**r) for r in json.loads(path.with_suffix(".json").read_text())["rows"]]


def _whole(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


def _facts_of(path: Path) -> dict:
    return _whole(path)["part"]


@pytest.mark.parametrize("change, said", [
    (lambda rows: rows + [Row(rows[0].student, "02", "9.9", "passed", "")], "exercise '9.9' is not one of lab 02's"),
    (lambda rows: rows + [Row(rows[0].student, "99", "2.1", "passed", "")], "a row of lab '99', not a lab"),
    (lambda rows: [r for r in rows if (r.student, r.exercise) != (rows[0].student, "2.2")], "but not 2.2"),
    (lambda rows: [Row(rows[0].student, "02", "2.1", "passd", ""), *rows[1:]], "status 'passd' is none the grader"),
    (lambda rows: rows + [Row(rows[0].student, "?", "2.1", "missing", "")], "exercise '2.1' is not one of lab ?'s"),
])
def test_a_part_whose_rows_are_not_what_it_says_it_graded_is_refused_naming_the_file(tmp_path, change, said):
    """Rewritten whole and signed again (a forger who holds the key): only the check of its rows against its own
    facts (its labs, each lab's exercises, the grader's statuses, every exercise of a lab a student returned) can
    refuse it, and does, naming the row."""
    parts = _write_parts(_class(6), tmp_path, 2)
    _write(change(_rows_of(parts[0])), parts[0], _facts_of(parts[0]))
    with pytest.raises(shards.ShardError) as refused:
        _merged(parts)
    assert said in str(refused.value) and str(parts[0]) in str(refused.value), str(refused.value)


def test_a_json_twin_edited_alone_is_refused_naming_the_csv_s_line(tmp_path):
    """The JSON twin's rows (which merge takes, whole) must be the CSV's, as the CSV writes them: a student promoted
    in the JSON alone (signed again) is refused at the CSV's line that says otherwise."""
    parts = _write_parts(_class(6), tmp_path, 2)
    twin = parts[0].with_suffix(".json")
    whole = json.loads(twin.read_text())
    row = next(i for i, r in enumerate(whole["rows"]) if r["status"] == "failed")
    whole["rows"][row]["status"] = "passed"
    whole.pop("signature")
    twin.write_text(json.dumps(whole))
    signature.sign_files(twin, True, KEY)
    with pytest.raises(shards.ShardError) as refused:
        _merged(parts)
    said = str(refused.value)
    assert f"{parts[0]}, line {row + 4} is " in said and "failed" in said and "one edited apart" in said, said
    whole["rows"].pop()  # a row fewer in the JSON: counted
    twin.write_text(json.dumps(whole))
    signature.sign_files(twin, True, KEY)
    with pytest.raises(shards.ShardError, match="one edited apart|but not"):
        _merged(parts)


def test_a_part_that_claims_more_parts_than_the_class_has_students_is_refused_at_once(tmp_path):
    """N = 10**9 on a class of 6: refused before anything counts the parts (set(range(N)) took 24 GB)."""
    parts = _write_parts(_class(4), tmp_path, 2)
    facts = _facts_of(parts[0])
    _write(_rows_of(parts[0]), parts[0], {**facts, "shard": [0, 10**9]})
    with pytest.raises(shards.ShardError, match=rf"{parts[0]}: shard 0/1000000000: N is more than the 6 students"):
        _merged(parts)
    assert shards.oversplit((0, 7), [f"s{i}" for i in range(6)]).startswith("--shard 0/7: 7 parts of a class of 6")
    assert shards.oversplit((5, 6), [f"s{i}" for i in range(6)] * 2) == ""  # a name per file: the class is 6
    assert shards.oversplit((0, 1), []) == ""  # an empty class is one part
    with pytest.raises(shards.ShardError, match="--shard"):
        shards.parse("0/" + "9" * 5000)  # int() of it would raise a ValueError past Python's digit limit


@pytest.mark.parametrize("facts, said", [({"labs": "02"}, "are not a list and an object"),
                                         ({"limits": [1]}, "are not a list and an object"),
                                         ({"exercises": {"02": "2.1"}}, "are not each lab's exercises"),
                                         ({"exercises": {"03": ["3.1"]}}, "are not each lab's exercises"),
                                         ({"exercises": None}, "are not each lab's exercises")])
def test_facts_of_the_wrong_type_are_refused_by_name_never_a_type_error(tmp_path, facts, said):
    parts = _write_parts(_class(2), tmp_path, 1, as_json=True)
    whole = json.loads(parts[0].read_text())
    parts[0].write_text(json.dumps({**whole, "part": {**whole["part"], **facts}}))
    with pytest.raises(shards.ShardError, match=rf"{parts[0]}: .*{said}"):
        _merged(parts)
    bare = {k: v for k, v in whole["part"].items() if k != "exercises"}  # a part from before exercises were kept
    parts[0].write_text(json.dumps({**whole, "part": bare}))
    with pytest.raises(shards.ShardError, match=rf"{parts[0]}: its facts have no exercises"):
        _merged(parts)


def test_an_unreadable_part_or_twin_is_refused_naming_it(tmp_path):
    parts = _write_parts(_class(2), tmp_path, 1)
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    with pytest.raises(shards.ShardError, match=rf"{folder}: cannot be read \(Is a directory\)"):
        _merged([folder])
    twin = parts[0].with_suffix(".json")
    twin.write_bytes(b"\xff\xfe not UTF-8")
    with pytest.raises(shards.ShardError, match=rf"{twin} \(the JSON beside {parts[0]}.*\): cannot be read"):
        _merged(parts)
    parts[0].write_bytes(b"\xff" + parts[0].read_bytes())
    with pytest.raises(shards.ShardError, match=rf"{parts[0]}: cannot be read \(.*utf-8"):
        _merged(parts)


def test_a_part_larger_than_any_class_s_is_refused_unread(tmp_path, monkeypatch):
    """A forged part of GiBs (a roster of 10**9 names) is refused by its size before it is parsed, naming it."""
    parts = _write_parts(_class(2), tmp_path, 1)
    monkeypatch.setattr(shards, "PART_BYTES", parts[0].stat().st_size - 1)  # the CSV; its JSON twin is larger
    with pytest.raises(shards.ShardError, match=rf"^{parts[0]}: over [\d,]+ B, more than any class's part holds"):
        _merged(parts)
    twin = parts[0].with_suffix(".json")
    monkeypatch.setattr(shards, "PART_BYTES", twin.stat().st_size - 1)
    with pytest.raises(shards.ShardError, match=rf"^{twin} \(the JSON beside .*\): over [\d,]+ B, more than any"):
        _merged(parts)


def _twin_alone(part: Path) -> None:
    whole = _whole(part)
    row = next(r for r in whole["rows"] if r["status"] != "passed")
    row["status"], row["message"] = "passed", "[ex 2.1] passed"
    part.with_suffix(".json").write_text(json.dumps(whole))
    signature.sign_files(part.with_suffix(".json"), True, KEY)


def _rows_changed(change) -> object:
    return lambda part: _write(change(_rows_of(part)), part, _facts_of(part))


FORGERIES = {  # name -> (the forgery, done to a part by one who holds the key; what merge says of it)
    "json_twin_alone": (_twin_alone, "one edited apart from the other"),
    "invented_exercise": (_rows_changed(lambda rows: rows + [Row(rows[0].student, "02", "9.9", "passed", "")]),
                          "exercise '9.9' is not one of lab 02's"),
    "another_lab": (_rows_changed(lambda rows: rows + [Row(rows[0].student, "99", "2.1", "passed", "")]),
                    "a row of lab '99', not a lab this part graded"),
    "dropped_rows": (_rows_changed(lambda rows: [r for r in rows if r.exercise != "2.2" or r.status == "passed"]),
                     "but not 2.2: one run writes every exercise"),
    "n_1e9": (lambda part: _write(_rows_of(part), part, {**_facts_of(part), "shard": [0, 10**9]}),
              "shard 0/1000000000: N is more than the 10 students"),
}


def _four_gib() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))  # set(range(10**9)) would not fit


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_forged_part_is_refused_by_the_command_line_in_one_line(tmp_path, forgery):
    """bars/grade-merge-forgery: a class of 10 graded in two signed parts, one of them forged by one who holds the
    key (signed again: only the checks of a part against itself stand): `python -m labkit grade merge`, run as the
    instructor runs it with 4 GiB of address space, refuses it in one line naming the file, with no traceback,
    within 60 s, and writes nothing."""
    parts = _write_parts(_class(8), tmp_path, 2)
    forge, said = FORGERIES[forgery]
    forge(parts[0])
    out = tmp_path / "merged" / "grades.csv"
    done = subprocess.run([sys.executable, "-m", "labkit", "grade", "merge", *map(str, parts), "--key",
                           str(_key_file(tmp_path)), "--out", str(out)], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, preexec_fn=_four_gib)
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err and "Traceback" not in err, done.stderr
    assert err.startswith("labkit grade merge: /") and str(parts[0]) in err and said in err, err
    assert not out.parent.exists()


# ---------------------------------------------------------------- parts signed
def test_a_part_edited_after_grading_is_refused_naming_the_file(tmp_path):
    """Edited whole, consistently (CSV and JSON alike: every other check passes), without the key: the signature
    does not hold. The JSON alone, and the CSV alone, each carry their own."""
    parts = _write_parts(_class(6), tmp_path, 2)
    old = parts[0].read_text().splitlines(keepends=True)[1], _whole(parts[0])["signature"]
    rows = [Row(r.student, r.lab, r.exercise, "passed", r.message, r.seconds) for r in _rows_of(parts[0])]
    _write(rows, parts[0], _facts_of(parts[0]), key=None)  # every verdict a pass, and unsigned ...
    text = parts[0].read_text().splitlines(keepends=True)
    parts[0].write_text("".join([text[0], old[0], *text[1:]]))  # ... then the old signatures put back
    parts[0].with_suffix(".json").write_text(json.dumps({**_whole(parts[0]), "signature": old[1]}))
    with pytest.raises(shards.ShardError, match=rf"^{parts[0]}: its signature does not match what it holds: edited "
                                                "after it was graded"):
        _merged(parts)
    parts[0].with_suffix(".json").unlink()  # the CSV alone: the same
    with pytest.raises(shards.ShardError, match=rf"^{parts[0]}: its signature does not match"):
        _merged(parts)
    json_parts = _write_parts(_class(6), tmp_path / "j", 2, as_json=True)
    whole = json.loads(json_parts[1].read_text())
    whole["rows"][0]["status"] = "passed" if whole["rows"][0]["status"] != "passed" else "failed"
    json_parts[1].write_text(json.dumps(whole))
    with pytest.raises(shards.ShardError, match=rf"^{json_parts[1]}: its signature does not match"):
        _merged(json_parts)


def test_a_part_signed_with_another_key_or_merged_without_one_says_so(tmp_path):
    parts = _write_parts(_class(4), tmp_path, 2)
    other = signature.Key(Path("/elsewhere/grade.key"), b"another key, 32 bytes or more ....")
    with pytest.raises(shards.ShardError, match=rf"{parts[0]} was signed with another key \(id {KEY.id}\) than "
                                                rf"/elsewhere/grade.key \(id {other.id}\)"):
        shards.merge(parts, other)
    with pytest.raises(shards.ShardError, match=rf"{parts[0]} is signed .*no key at {tmp_path / 'none'}"):
        shards.merge(parts, signature.Key.at(tmp_path / "none"))
    with pytest.raises(shards.ShardError, match="given no key"):
        shards.merge(parts)


def test_line_ends_are_not_signed(tmp_path):
    """A CSV whose \\r\\n became \\n (a copy through a tool that normalises them) still merges."""
    parts = _write_parts(_class(4), tmp_path, 2)
    for p in parts:
        p.with_suffix(".json").unlink()
        assert b"\r\n" in p.read_bytes()
        p.write_bytes(p.read_bytes().replace(b"\r\n", b"\n"))
    assert len(_merged(parts).rows) == 12


def test_unsigned_parts_are_refused_unless_merge_is_told_to_take_them_and_says_so(tmp_path, capsys):
    parts = _write_parts(_class(4), tmp_path, 2, key=None)
    with pytest.raises(shards.ShardError, match=rf"{parts[0]}: not signed .*merge --unsigned"):
        _merged(parts)
    merged = _merged(parts, unsigned=True)
    assert merged.unsigned == [str(p) for part in parts for p in (part, part.with_suffix(".json"))]
    out = tmp_path / "merged" / "g.csv"
    code, err = _merge(*map(str, parts), "--out", str(out), "--key", str(_key_file(tmp_path)), capsys=capsys)
    assert code == 2 and "not signed" in err and not out.exists(), err
    code, err = _merge(*map(str, parts), "--out", str(out), "--unsigned", capsys=capsys)
    assert code == 0 and out.is_file() and err.count("\n") == 1 and "warning" in err and str(parts[1]) in err, err
    signed = _write_parts(_class(4), tmp_path / "s", 2)  # --unsigned still checks the parts that are signed
    with pytest.raises(shards.ShardError, match="another key"):
        shards.merge([signed[0], parts[1]], signature.Key(Path("k"), b"x" * 32), unsigned=True)


def test_the_key_is_made_once_its_owner_s_alone_and_refused_otherwise(tmp_path):
    path = tmp_path / "deep" / "grade.key"
    made = signature.Key.at(path, make=True)
    assert made.made and path.stat().st_mode & 0o777 == 0o600 and len(made.secret) == 64
    again = signature.Key.at(path, make=True)  # a job that starts later (or at once) reads the same key
    assert not again.made and again.secret == made.secret and again.id == made.id
    assert signature.Key.at(tmp_path / "none").secret is None  # merge never makes one
    path.chmod(0o644)
    with pytest.raises(signature.SignatureError, match=rf"--key {path}: others may .* chmod 600 {path}"):
        signature.Key.at(path)
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(signature.SignatureError, match="5 bytes, too short"):
        signature.Key.at(path)
    with pytest.raises(signature.SignatureError, match="not a key file"):
        signature.Key.at(tmp_path)


# ---------------------------------------------------------------- the merge command
def _key_file(folder: Path) -> Path:
    """The test key, in a file as `--key` reads it (mode 0600)."""
    path = folder / "grade.key"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def _merge(*args: str, capsys) -> tuple[int, str]:
    """`labkit grade merge ARGS...` in this process; its exit status and what it printed on stderr."""
    from labkit.__main__ import main

    code = main(["grade", "merge", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("option", [["--labs", "02"], ["--timeout", "5"], ["--notebook-timeout", "9"],
                                    ["--memory", "2"], ["--jobs", "2"], ["--profile", "tiny"], ["--no-sandbox"],
                                    ["--seed", "7"], ["--shard", "0/2"], ["--leaderboard"], ["--executed", "x"]])
def test_merge_refuses_the_options_of_grading_saying_it_takes_them_from_the_parts(tmp_path, capsys, option):
    parts = _write_parts(_class(4), tmp_path, 2)
    out = tmp_path / "merged" / "grades.csv"
    code, err = _merge(*map(str, parts), *option, "--out", str(out), capsys=capsys)
    assert code == 2 and option[0] in err and "from the parts" in err and "--out" in err, err
    assert not out.exists()


def test_merge_never_writes_over_a_part_it_was_given_and_checks_out_s_folder(tmp_path, capsys):
    parts = _write_parts(_class(4), tmp_path, 2)
    key = _key_file(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    twins = [p.with_suffix(".json") for p in parts]  # read too: the rows whole
    for out, extra, hit in ((parts[0], [], parts[0]), (twins[1], [], twins[1]), (twins[0], ["--json"], twins[0]),
                            (tmp_path / "part1.txt", [], twins[1])):  # part1.txt's JSON beside it: part1.json
        code, err = _merge(*map(str, parts), "--out", str(out), *extra, capsys=capsys)
        assert code == 2 and "a part given" in err and str(hit) in err, err
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before
    (tmp_path / "plain").write_text("a file, not a folder")
    code, err = _merge(*map(str, parts), "--out", str(tmp_path / "plain" / "g.csv"), capsys=capsys)
    assert code == 2 and "--out" in err and str(tmp_path / "plain") in err and "Traceback" not in err, err
    code, err = _merge(*map(str, parts), "--out", str(tmp_path), capsys=capsys)
    assert code == 2 and "--out" in err and "a folder" in err, err
    code, err = _merge(*map(str, parts), "--out", str(tmp_path / "new" / "deep" / "g.csv"), "--key", str(key),
                       capsys=capsys)
    assert code == 0 and (tmp_path / "new" / "deep" / "g.csv").is_file(), err


def test_what_merge_says_it_writes_is_what_report_writes(tmp_path):
    for as_json in (False, True):
        out = tmp_path / f"j{as_json}" / "g.csv"
        report.write(_class(2), out, as_json, LIMITS)
        assert sorted(out.parent.iterdir()) == sorted(shards.written(out, as_json))

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
    key = tmp_path / "keys" / "grade.key"  # made by the first part, read by the others and by merge
    for k, part in enumerate(parts):  # each machine's shell lists the files in its own order
        done = _grade(tmp_path, part, *random.Random(k).sample(listed, len(listed)), *common, "--shard", f"{k}/4",
                      "--key", str(key))
        assert ("made the key" in done.stderr) == (k == 0), done.stderr
        assert part.read_text().splitlines()[1].startswith(signature.LINE)
    merged = tmp_path / "merged" / "grades.csv"
    subprocess.run([sys.executable, "-m", "labkit", "grade", "merge", *map(str, parts), "--out", str(merged),
                    "--key", str(key)], check=True, capture_output=True, cwd=tmp_path)
    one = _book(tmp_path / "one" / "grades.csv")
    assert {r["student"] for r in one} == {"ada", "bo", "cy", "di", "ed", "flo", "gus", "hal"}
    assert {r["status"] for r in one} >= {"passed", "failed", "not attempted"}
    assert _book(merged) == one
    assert (tmp_path / "merged" / "grades_students.csv").read_text() == \
        (tmp_path / "one" / "grades_students.csv").read_text()
    assert [shards.read(p)[0]["roster"]["students"] for p in parts] == [sorted({r["student"] for r in one})] * 4
    sizes = [len({r.student for r in shards.read(p)[1]}) for p in parts]
    assert sum(sizes) == 8 and max(sizes) < 8, sizes  # each student in one part, and not all in one


def test_a_shard_of_more_parts_than_students_is_refused_and_the_key_is_for_parts(tmp_path, capsys):
    """`--shard 0/1000000000` of a class of two is refused, naming the class's size, before any notebook is graded;
    the key that would sign its part is made (mode 0600) where --key says. --key and --unsigned say nothing to a run
    that is not a part."""
    from labkit.__main__ import main

    for name in ("ada", "bo"):
        (tmp_path / "class" / name).mkdir(parents=True)
        shutil.copy(ROOT / "notebooks" / "02_recompute.ipynb", tmp_path / "class" / name)
    key = tmp_path / "keys" / "grade.key"
    args = [str(tmp_path / "class"), "--labs", "02", "--seed", "1", "--no-sandbox", "--jobs", "1", "--out",
            str(tmp_path / "out" / "g.csv")]
    assert main(["grade", *args, "--shard", "0/1000000000", "--key", str(key)]) == 2
    err = capsys.readouterr().err
    assert "--shard 0/1000000000: 1000000000 parts of a class of 2 students" in err and "made the key" in err, err
    assert key.stat().st_mode & 0o777 == 0o600 and not (tmp_path / "out" / "g.csv").exists()
    for extra in (["--key", str(key)], ["--unsigned"]):
        assert main(["grade", *args, *extra]) == 2
        assert "are for a part (--shard K/N)" in capsys.readouterr().err


def test_a_shard_without_a_seed_or_a_leaderboard_in_a_shard_is_refused_before_grading(tmp_path, capsys):
    from labkit.__main__ import main

    for extra, said in ((["--shard", "0/4"], "--shard needs --seed N"),
                        (["--shard", "5/4", "--seed", "1"], "K must be 0 to 3"),
                        (["--shard", "0/4", "--seed", "1", "--labs", "07", "--leaderboard"], "not in a --shard"),
                        (["--labs", "02", "--leaderboard"], "--labs 02 leaves it out")):
        assert main(["grade", str(tmp_path), *extra, "--out", str(tmp_path / "g.csv")]) == 2
        assert said in capsys.readouterr().err, extra
