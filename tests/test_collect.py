"""`labkit collect`: the students' notebooks from their hub homes into returned/<name>/, never through a link out
of a home, each told by what it is (a student view under any name, never the kit's solution), and the class kept
so that `labkit grade` gives every student a row (bars/grade-collect, bars/collect-links)."""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import resource
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.course import collect
from labkit.course.grade import files, grader, report, sandbox
from labkit.course.grade.options import Limits, Options

ROOT = Path(__file__).resolve().parent.parent
LAB = "02_recompute.ipynb"
VIEW = (ROOT / "notebooks" / LAB).read_text()  # the student view, as generated and as a release bundle holds it
SOLUTION = (ROOT / "solutions" / LAB).read_text()
HANDOUT = Path("labkit-handout") / "notebooks"  # where nbgitpuller puts a bundle's notebooks


def worked(name: str, view: str = VIEW) -> str:
    """`view` with its first answer cell written by `name` (its generated mark kept, as JupyterLab keeps it)."""
    nb = json.loads(view)
    cell = next(c for c in nb["cells"] if "NotImplementedError(\"Exercise" in "".join(c["source"]))
    cell["source"] = f"# {name}'s answer\ndef f():\n    return 1\n"
    return json.dumps(nb)


def whose(path: Path) -> str:
    """The name written into a notebook by `worked`, or "untouched"."""
    text = path.read_text()
    return next((c["source"].split("'")[0][2:] for c in json.loads(text)["cells"]
                 if "'s answer" in "".join(c["source"])), "untouched")


def _homes(tmp_path: Path) -> Path:
    """Three hub homes as nbgitpuller leaves them: ada and grace with their notebooks, mallory with a link out of
    her home (to a file no student may hand in) in place of hers."""
    homes = tmp_path / "home"
    secret = tmp_path / "kit" / "solutions" / LAB
    secret.parent.mkdir(parents=True)
    secret.write_text(SOLUTION)
    for name in ("ada", "grace", "mallory"):
        (homes / name / HANDOUT).mkdir(parents=True)
    for name in ("ada", "grace"):
        (homes / name / HANDOUT / LAB).write_text(worked(name))
        (homes / name / HANDOUT / "00_start_here.ipynb").write_text((ROOT / "notebooks" / "00_start_here.ipynb")
                                                                     .read_text())
    (homes / "mallory" / HANDOUT / LAB).symlink_to(secret)
    return homes


def _cli(*args: str, cwd: Path = ROOT, home: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m labkit collect ...`, its output strictly UTF-8 (a raw undecodable name would crash it, as on most
    terminals), HOME the instructor's (default: one of no class)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "HOME": str(home or ROOT / "no-such-home")}
    env.pop("SUDO_USER", None)
    return subprocess.run([sys.executable, "-m", "labkit", "collect", *args], capture_output=True, cwd=cwd, env=env)


def _by_student(found: collect.Collection) -> dict[str, collect.Home]:
    return {h.student: h for h in found.homes}


def _collect(homes: Path, out: Path, **kwargs) -> dict[str, collect.Home]:
    return _by_student(collect.collect([f"{homes}/*"], out, own=kwargs.pop("own", []), **kwargs))


# ---------------------------------------------------------------- as people type it (bars/grade-collect)
def test_three_homes_by_the_shells_expansion_fill_returned_and_refuse_the_link(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    expanded = sorted(str(p) for p in homes.iterdir())  # what the shell makes of /home/*
    done = _cli(*expanded, "--out", str(out), "--labs", "02")
    stdout = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*.ipynb"))
    assert got == ["ada/02_recompute.ipynb", "grace/02_recompute.ipynb"]
    assert whose(out / "grace" / LAB) == "grace" and "BEGIN SOLUTION" not in (out / "ada" / LAB).read_text()
    mallory = next(line for line in stdout.splitlines() if line.startswith("labkit collect: mallory"))
    assert "REFUSED" in mallory and "a link out of the home" in mallory and LAB in mallory, stdout
    assert "3 students in the class, 2 notebooks of 2 of them" in stdout and "1 with nothing collected" in stdout
    quoted = _cli(f"{homes}/*", "--out", str(tmp_path / "again"), "--labs", "02")
    assert quoted.stdout.decode().replace("again", "returned") == stdout  # the quoted pattern, the same run


def test_a_home_that_is_not_a_folder_is_named_and_skipped_and_a_pattern_matching_nothing_refused(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (homes / "README").write_text("not a home")
    done = _cli(*sorted(str(p) for p in homes.iterdir()), str(homes / "nobody"), "--out", str(out), "--labs", "02")
    stdout = done.stdout.decode()
    assert f"left out {homes / 'README'}: not a folder" in stdout and f"left out {homes / 'nobody'}: no such" in stdout
    assert "3 students in the class" in stdout
    with pytest.raises(collect.CollectError, match="matches nothing"):
        collect.collect([f"{tmp_path}/nowhere/*"], tmp_path / "again", own=[])
    left = [homes / "README", homes / "ada", homes / "x", homes / "y"]  # a file, her own home, two not there
    with pytest.raises(collect.CollectError, match=r"no student's home among those given \(4 left out: [^;]*; [^;]*; "
                                                   r"[^;]*\); give"):
        collect.collect(list(map(str, left)), tmp_path / "again", own=[homes / "ada"])
    assert not (tmp_path / "again").exists()


def test_the_instructors_own_home_is_left_out_and_said_and_exclude_leaves_out_assistants(tmp_path):
    homes = _homes(tmp_path)
    instructor = homes / "instructor"
    (instructor / "labkit").mkdir(parents=True)
    (instructor / "labkit" / LAB).write_text(worked("the instructor"))
    (homes / "ta").mkdir()
    (homes / "ta" / LAB).write_text(worked("ta"))
    out = instructor / "labkit" / "returned"  # --out returned, run from her clone: inside her own home, accepted
    done = _cli("--exclude", "ta,ghost", *sorted(str(p) for p in homes.iterdir()), "--out", "returned",  # as typed
                "--labs", "02", cwd=instructor / "labkit", home=instructor)  # --exclude before the homes: still homes
    stdout = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert f"left out {instructor}: your own home ($HOME)" in stdout and f"left out {homes / 'ta'}: --exclude" in stdout
    assert "--exclude ghost: no such home among those given" in stdout
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["ada", "grace"]
    assert set(json.loads((out / collect.CLASS_FILE).read_text())["students"]) == {"ada", "grace", "mallory"}
    inside_ta = _cli(*sorted(str(p) for p in homes.iterdir()), "--out", str(homes / "ta" / "out"), "--exclude", "ta",
                     "--exclude", "ghost", home=instructor)
    assert inside_ta.returncode == 2 and b"inside the home" in inside_ta.stderr  # a TA could swap its folders


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files away")
def test_under_sudo_what_is_collected_belongs_to_the_user_who_ran_it(tmp_path, monkeypatch):
    """The docs' collect as root (sudo -E), then grade as herself: the copies, their folders, --out and the class
    file are hers, still 0600 and 0700 (they were root's, so her grade could not read them)."""
    homes, out = _homes(tmp_path), tmp_path / "returned"
    monkeypatch.setenv("SUDO_UID", "4321")
    monkeypatch.setenv("SUDO_GID", "4322")
    _collect(homes, out, labs=["02"])
    made = [out, *out.rglob("*")]
    assert {(p.stat().st_uid, p.stat().st_gid) for p in made} == {(4321, 4322)}, made
    assert {p.stat().st_mode & 0o777 for p in made} == {0o600, 0o700}
    monkeypatch.delenv("SUDO_UID")  # not under sudo: whoever collects keeps them
    _collect(homes, tmp_path / "again", labs=["02"])
    assert {p.stat().st_uid for p in (tmp_path / "again").rglob("*")} == {os.geteuid()}


def test_sudo_leaves_out_the_home_of_the_user_who_ran_it(monkeypatch):
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setenv("SUDO_USER", "root")  # the one user every machine has: its home from the password database
    assert collect.own_homes() == [Path("/root"), Path(collect.pwd.getpwnam("root").pw_dir)]
    monkeypatch.setenv("SUDO_USER", "no-such-user-here")
    assert collect.own_homes() == [Path("/root")]


def test_a_roster_is_the_class(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    roster = tmp_path / "roster.txt"
    roster.write_text("# lab group A\nada\ngrace\n\nzoe\n")
    found = collect.collect([f"{homes}/*"], out, labs=["02"], roster=collect.read_roster(roster), own=[])
    assert [h.student for h in found.homes] == ["ada", "grace", "zoe"]
    assert found.left_out == [f"{homes / 'mallory'}: 'mallory' is not on --roster"]
    zoe = _by_student(found)["zoe"]
    assert zoe.path is None and "no home given is theirs" in zoe.nothing["02"] and "no home" in zoe.line()
    for text, why in (("ada\nada\n", "given twice"), ("../x\n", "not a student's name"), (".hidden\n", "not a")):
        roster.write_text(text)
        with pytest.raises(collect.CollectError, match=why):
            collect.read_roster(roster)


# ---------------------------------------------------------------- the student's own notebook, by what it is
def test_a_full_clone_of_the_kit_is_never_credited_with_its_solutions(tmp_path):
    """A student who cloned the whole repository and did nothing: her untouched view is taken, every solution
    named and refused (each newer than the view, as a clone's files may be)."""
    homes, out = tmp_path / "home", tmp_path / "returned"
    clone = homes / "carol" / "labkit"
    for folder in ("notebooks", "solutions"):
        (clone / folder).mkdir(parents=True)
        for path in sorted((ROOT / folder).glob("0[0-2]_*.ipynb")):
            (clone / folder / path.name).write_bytes(path.read_bytes())
    old = time.time() - 3600
    for path in (clone / "notebooks").iterdir():
        os.utime(path, (old, old))
    (homes / "carol" / "answers.ipynb").write_text(SOLUTION)  # a solution renamed
    carol = _collect(homes, out, labs=["00", "01", "02"])["carol"]
    assert sorted(p.name for p in carol.written) == ["00_start_here.ipynb", "01_activation_memory.ipynb", LAB]
    assert (out / "carol" / LAB).read_text() == VIEW
    solutions = [r for r in carol.refused if "the kit's solution notebook" in r]
    assert sorted(r.split(":")[0] for r in solutions) == sorted(
        [str(homes / "carol" / "answers.ipynb")] + [str(clone / "solutions" / p.name) for p in
                                                    (clone / "solutions").iterdir()])
    assert "untouched" in carol.taken["02"] and "the only candidate" in carol.taken["02"]


def test_the_duplicate_name_beside_a_link_out_is_found_and_the_report_says_which(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    notebooks = homes / "mallory" / HANDOUT
    for name in ("02_recompute-Copy1.ipynb", "Copy of 02_recompute (1).ipynb"):
        (notebooks / name).write_text(worked("mallory" if "Copy1" in name else "an older mallory"))
    old = time.time() - 3600
    os.utime(notebooks / "Copy of 02_recompute (1).ipynb", (old, old))
    mallory = _collect(homes, out, labs=["02"])["mallory"]
    assert whose(out / "mallory" / LAB) == "mallory"
    assert mallory.taken["02"].startswith(str(notebooks / "02_recompute-Copy1.ipynb") + " (Lab 02's student view, 1 cell")
    assert "the newest of 2 with work" in mallory.taken["02"]
    assert mallory.left == [f"{notebooks / 'Copy of 02_recompute (1).ipynb'} (Lab 02's student view, 1 cell edited "
                            "or added)"]
    assert "a link out of the home" in mallory.refused[0] and f"{LAB} from {notebooks / '02_recompute-Copy1.ipynb'} (" in mallory.line()


def test_work_comes_before_an_untouched_view_however_new_and_a_view_before_a_notebook_without_marks(tmp_path):
    homes, out = tmp_path / "home", tmp_path / "returned"
    (homes / "ada" / "a").mkdir(parents=True)
    (homes / "ada" / "a" / "my work.ipynb").write_text(worked("ada"))  # renamed: found by what it is
    (homes / "ada" / LAB).write_text(VIEW)  # pulled again later, untouched: newer
    old = time.time() - 3600
    os.utime(homes / "ada" / "a" / "my work.ipynb", (old, old))
    (homes / "bob").mkdir()
    (homes / "bob" / LAB).write_text('{"cells": [], "metadata": {}}')  # named like the lab, no marks: the fallback
    (homes / "bob" / "x").mkdir()
    (homes / "bob" / "x" / "scratch.ipynb").write_text('{"cells": []}')  # neither: not a candidate
    found = _collect(homes, out, labs=["02"])
    assert whose(out / "ada" / LAB) == "ada" and "the only one with work" in found["ada"].taken["02"]
    assert found["ada"].left == [f"{homes / 'ada' / LAB} (Lab 02's student view, untouched)"]
    assert "named like the lab, without a student view's marks" in found["bob"].taken["02"]
    (homes / "bob" / "y").mkdir()
    (homes / "bob" / "y" / "02_recompute (2).ipynb").write_text(VIEW)
    found = _collect(homes, tmp_path / "again", labs=["02"])
    assert (tmp_path / "again" / "bob" / LAB).read_text() == VIEW and "the only student view" in found["bob"].taken["02"]


def test_a_notebook_of_another_lab_under_this_labs_name_counts_for_its_own_lab(tmp_path):
    homes, out = tmp_path / "home", tmp_path / "returned"
    (homes / "ada").mkdir(parents=True)
    (homes / "ada" / LAB).write_text((ROOT / "notebooks" / "03_sqrt_n.ipynb").read_text())
    found = _collect(homes, out, labs=["02", "03"])
    assert [p.name for p in found["ada"].written] == ["03_sqrt_n.ipynb"]
    assert found["ada"].nothing["02"].startswith("no notebook of Lab 02 found below")


# ---------------------------------------------------------------- links, handles, a large class (bars/collect-links)
def test_a_chain_of_a_thousand_links_and_a_loop_are_reported_by_name_and_the_classmates_collected(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    chain = homes / "grace" / "chain"
    chain.mkdir()
    for i in range(1000):
        (chain / f"l{i}").symlink_to(f"l{i + 1}" if i < 999 else str(tmp_path / "kit" / "solutions" / LAB))
    (homes / "grace" / "loop-a.ipynb").symlink_to("loop-b.ipynb")
    (homes / "grace" / "loop-b.ipynb").symlink_to("loop-a.ipynb")
    done = _cli(f"{homes}/*", "--out", str(out), "--labs", "02")
    stdout = done.stdout.decode()
    assert done.returncode == 0 and "Traceback" not in done.stderr.decode(), done.stderr.decode()[-2000:]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.ipynb")) == ["ada/" + LAB, "grace/" + LAB]
    record = json.loads((out / collect.CLASS_FILE).read_text())["students"]["grace"]["refused"]
    chained = [r for r in record if f"a chain of more than {collect.MOST_LINKS} links, or a loop" in r]
    assert {r.split(":")[0] for r in chained} >= {str(chain / "l0"), str(homes / "grace" / "loop-a.ipynb")}
    assert {r.split(":")[0] for r in chained} == {str(chain / f"l{i}") for i in range(960)} | {
        str(homes / "grace" / f"loop-{x}.ipynb") for x in "ab"}  # each link more than 40 from the end of the chain
    assert sum("a link out of the home" in r for r in record) == 40  # the last 40 lead out of it, within the bound
    grace = next(line for line in stdout.splitlines() if line.startswith("labkit collect: grace"))
    assert str(chain / "l0") in grace and "988 more links or folders refused (all in --out's .labkit-class.json)" \
        in grace and f"{homes / 'grace' / 'loop-a.ipynb'}: a chain of more than" in grace  # a notebook's: shown


@pytest.mark.parametrize("layout", [
    {"a": "b", "b": "c", "c": "/etc"}, {"a": "b/../c", "b": ".", "c": "x"}, {"a": "./sub/../a2", "a2": "sub"},
    {"a": "/", "b": "a/tmp"}, {"a": "nowhere/../.."}])
def test_where_a_link_leads_is_worked_out_as_the_kernel_would(tmp_path, layout):
    (tmp_path / "sub").mkdir()
    for name, target in layout.items():
        (tmp_path / name).symlink_to(target)
    for name in layout:
        assert collect._resolve(tmp_path / name) == Path(os.path.realpath(tmp_path / name)), name


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_collect_closes_every_folder_and_file_it_opens(tmp_path):
    """9 notebooks two folders deep in each of three homes (and the refusals' paths): not one handle left open."""
    homes, out = _homes(tmp_path), tmp_path / "returned"
    for name in ("ada", "grace", "mallory"):
        for i in range(9):
            deep = homes / name / f"week{i}" / "lab"
            deep.mkdir(parents=True)
            (deep / f"02_recompute-Copy{i}.ipynb").write_text(worked(name))
    before = _fds()
    _collect(homes, out, labs=["02"])
    assert _fds() == before


def test_a_class_of_600_homes_is_collected_whole_within_a_small_handle_limit(tmp_path):
    """600 homes, each a notebook two folders down: with 64 handles a process (a leak of one a home would run out),
    every student collected and no handle left open."""
    homes, out = tmp_path / "home", tmp_path / "returned"
    for i in range(600):
        (homes / f"s{i:03d}" / HANDOUT).mkdir(parents=True)
        (homes / f"s{i:03d}" / HANDOUT / LAB).write_text(VIEW)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = _fds()
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(before) + 32, hard))
    try:
        found = collect.collect([f"{homes}/*"], out, labs=["02"], own=[])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert _fds() == before
    assert len(found.homes) == 600 and all(h.written and not h.refused for h in found.homes)
    assert len(list(out.glob(f"*/{LAB}"))) == 600


# ---------------------------------------------------------------- hostile homes, kept hostile
def test_links_to_folders_and_homes_that_are_links_are_not_followed(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (homes / "grace" / "classmate").symlink_to(homes / "ada" / "labkit-handout")  # a folder out of grace's home
    (homes / "grace" / "here").symlink_to(homes / "grace" / "labkit-handout")  # a link inside: skipped, not refused
    (homes / "bob").symlink_to(homes / "ada")  # a home that is itself a link
    records = _collect(homes, out, labs=["02"])
    assert whose(out / "grace" / LAB) == "grace"
    assert [r.split(":")[0] for r in records["grace"].refused] == [str(homes / "grace" / "classmate")]
    assert records["bob"].written == [] and "itself a link" in records["bob"].refused[0]
    assert "itself a link" in records["bob"].nothing["02"] and not (out / "bob").exists()


def test_a_home_that_is_a_link_is_left_out_as_any_home_is_and_named_as_its_student(tmp_path):
    """A linked home is never followed, yet --exclude, --roster, --strip and your own home hold for it as for a
    folder (a linked TA's home was a refused student row; with --strip and --roster, a linked jupyter-ada was a row
    of its own beside a missing ada)."""
    homes, out = _homes(tmp_path), tmp_path / "returned"
    elsewhere = tmp_path / "srv"
    for name in ("jupyter-ada", "jupyter-ta", "jupyter-zed", "jupyter-me"):
        (elsewhere / name).mkdir(parents=True)
        (homes / name).symlink_to(elsewhere / name)
    found = collect.collect([f"{homes}/jupyter-*"], out, labs=["02"], strip="jupyter-", exclude=["ta"],
                            roster=["ada", "bea"], own=[elsewhere / "jupyter-me"])
    rows = {h.student: h for h in found.homes}
    assert sorted(rows) == ["ada", "bea"], sorted(rows)  # the linked ada once, by her name; bea on the roster alone
    assert "itself a link" in rows["ada"].refused[0] and rows["ada"].path == homes / "jupyter-ada"
    assert rows["bea"].path is None
    said = "\n".join(found.left_out)
    assert "jupyter-ta: --exclude" in said and "'zed' is not on --roster" in said and "your own home" in said, said


def test_a_fifo_or_an_oversized_file_is_refused_unread(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (homes / "ada" / HANDOUT / LAB).unlink()
    os.mkfifo(homes / "ada" / HANDOUT / LAB)  # opening it for reading would hang
    with open(homes / "grace" / HANDOUT / LAB, "wb") as f:
        f.truncate(collect.MOST_BYTES + 1)
    records = _collect(homes, out, labs=["02"])
    assert "not a regular file" in records["ada"].refused[0] and "not a regular file" in records["ada"].nothing["02"]
    assert "over the limit" in records["grace"].refused[0]
    assert not list(out.rglob(LAB))


def test_a_prefix_is_stripped_and_two_homes_of_one_name_are_refused_before_anything_is_written(tmp_path):
    homes, out = tmp_path / "home", tmp_path / "returned"
    for name in ("ada", "jupyter-ada", "jupyter-grace"):  # ada sorts first: the old code wrote her before jupyter-ada
        (homes / name).mkdir(parents=True)
        (homes / name / LAB).write_text(worked(name))
    with pytest.raises(collect.CollectError, match="both student 'ada'"):
        collect.collect([f"{homes}/*"], out, strip="jupyter-", own=[])
    assert not out.exists()
    (homes / "ada" / LAB).unlink()
    (homes / "ada").rmdir()
    assert [h.student for h in collect.collect([f"{homes}/*"], out, strip="jupyter-", own=[]).homes] == ["ada", "grace"]


def test_names_not_utf8_or_holding_control_characters_are_escaped_in_the_report(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    secret = tmp_path / "kit" / "solutions" / LAB
    forged = "x\nlabkit collect: eve (home of eve): 02_recompute.ipynb\x1b[2K"  # would print as a report line
    (homes / "ada" / forged).mkdir()
    (homes / "ada" / forged / LAB).symlink_to(secret)
    undecodable = os.fsencode(homes / "grace") + b"/\xff\xfe"  # printed raw, it crashed the report
    os.mkdir(undecodable)
    os.symlink(os.fsencode(secret), undecodable + b"/" + LAB.encode())
    done = _cli(f"{homes}/*", "--out", str(out), "--labs", "02")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    lines = done.stdout.decode("utf-8").splitlines()
    assert len(lines) == 4 and not any(line.startswith("labkit collect: eve") for line in lines), lines
    ada = next(line for line in lines if line.startswith("labkit collect: ada"))
    assert "x\\nlabkit collect: eve" in ada and "\\x1b[2K" in ada and "a link out of the home" in ada
    grace = next(line for line in lines if line.startswith("labkit collect: grace"))
    assert "\\xff\\xfe" in grace and "a link out of the home" in grace


def test_a_home_whose_name_is_not_text_is_reported_and_the_others_collected(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    os.mkdir(os.fsencode(homes) + b"/bad\xffname")
    records = _collect(homes, out, labs=["02"])
    bad = records["bad\\xffname"]
    assert bad.written == [] and "not a student's name" in bad.refused[0] and "\\xff" in bad.line()
    assert sorted(p.name for p in out.iterdir()) == [collect.CLASS_FILE, "ada", "grace"]


def test_each_notebook_is_opened_once_and_only_the_copy_taken_written(tmp_path, monkeypatch):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    old = time.time() - 3600
    for folder in ("old", "older"):
        (homes / "ada" / folder).mkdir()
        (homes / "ada" / folder / LAB).write_text(worked(folder))
        os.utime(homes / "ada" / folder / LAB, (old, old))
        old -= 3600
    opened, real_open = [], os.open

    def spy(path, flags, *args, **kwargs):
        if os.fsdecode(path).endswith(LAB) and not os.fsdecode(path).startswith(str(out)):
            opened.append(path)  # a notebook read (the copies written to `out` are not counted)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    records = _collect(homes, out, labs=["02"])
    monkeypatch.undo()
    assert whose(out / "ada" / LAB) == "ada" and len(records["ada"].left) == 2
    assert len(opened) == 4, opened  # ada's three, grace's one: each once, never again to copy it


def test_a_hard_link_is_reported_and_not_collected(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    ada = homes / "ada" / HANDOUT / LAB
    ada.unlink()
    os.link(homes / "grace" / HANDOUT / LAB, ada)  # grace's file, under ada's name too
    records = _collect(homes, out, labs=["02"])
    for name in ("ada", "grace"):
        assert records[name].written == [], name
        assert len(records[name].refused) == 1 and "2 hard links" in records[name].refused[0], records[name]
    assert not list(out.rglob(LAB))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_a_file_owned_by_someone_else_is_reported_and_not_collected(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    os.chown(homes / "ada" / HANDOUT / LAB, 4242, -1)
    os.chown(homes / "ada" / HANDOUT / "00_start_here.ipynb", 4242, -1)
    records = _collect(homes, out, labs=["02"])
    assert records["ada"].written == [] and "owned by uid 4242" in records["ada"].refused[0], records["ada"]
    assert (out / "grace" / LAB).exists() and not (out / "ada").exists()


def test_a_folder_that_cannot_be_read_is_reported(tmp_path, monkeypatch):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (homes / "ada" / "private").mkdir()
    real_open = os.open

    def unreadable(path, flags, *args, **kwargs):  # as root, chmod 000 would not stop the walk: refuse it here
        if os.fsdecode(path) in ("private", str(homes / "ada" / "private")):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", unreadable)
    records = _collect(homes, out, labs=["02"])
    monkeypatch.undo()
    assert records["ada"].refused == [f"{homes / 'ada' / 'private'}: a folder that cannot be read (Permission "
                                      "denied), not searched"]
    assert (out / "ada" / LAB).exists()


def test_folders_nested_too_deep_and_notebooks_past_the_bound_are_reported(tmp_path, monkeypatch):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    deep = homes / "grace" / Path(*["d"] * (collect.MOST_DEPTH + 1))
    deep.mkdir(parents=True)
    (deep / LAB).write_text(worked("deep grace"))
    monkeypatch.setattr(collect, "MOST_NOTEBOOKS", 2)
    (homes / "ada" / "zz").mkdir()
    (homes / "ada" / "zz" / "late.ipynb").write_text(worked("late ada"))
    records = _collect(homes, out, labs=["02"])
    assert len(records["grace"].refused) == 1 and "levels below the home" in records["grace"].refused[0]
    assert whose(out / "grace" / LAB) == "grace"
    assert records["ada"].refused == [f"{homes / 'ada'}: 1 notebooks past the first 2 (in order of path), not "
                                      "examined"]


def test_an_out_folder_that_is_not_empty_is_refused_and_left_alone(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (out / "ghost").mkdir(parents=True)
    (out / "ghost" / LAB).write_text('"an earlier run"')
    with pytest.raises(collect.CollectError, match="not empty.*new folder"):
        collect.collect([f"{homes}/*"], out, own=[])
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["ghost", f"ghost/{LAB}"]
    out.with_name("file").write_text("")
    with pytest.raises(collect.CollectError, match="not a folder"):
        collect.collect([f"{homes}/*"], out.with_name("file"), own=[])
    (tmp_path / "empty").mkdir()
    assert collect.collect([f"{homes}/*"], tmp_path / "empty", labs=["02"], own=[]).homes  # an empty folder is taken


def test_copies_are_private_and_out_inside_a_students_home_is_refused(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    collect.collect([f"{homes}/*"], out, labs=["02"], own=[])
    assert stat.S_IMODE((out / "ada" / LAB).stat().st_mode) == 0o600
    assert stat.S_IMODE((out / collect.CLASS_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ada").stat().st_mode) == 0o700
    inside = homes / "grace" / "returned"
    with pytest.raises(collect.CollectError, match="inside the home"):
        collect.collect([f"{homes}/*"], inside, own=[])
    assert not inside.exists()


# ---------------------------------------------------------------- the class, as grade reads it
def test_grade_reads_the_class_and_gives_every_student_without_a_notebook_a_missing_row_with_why(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (homes / "empty").mkdir()
    (homes / "carol" / "labkit" / "solutions").mkdir(parents=True)
    (homes / "carol" / "labkit" / "solutions" / LAB).write_text(SOLUTION)
    roster = ["ada", "carol", "empty", "grace", "mallory", "zoe"]
    collect.collect([f"{homes}/*"], out, labs=["02"], roster=roster, own=[])
    stems = {"02_recompute", "03_sqrt_n"}
    for given in ([out], sorted(out.glob(f"*/{LAB}"))):  # the folder, or the shell's returned/*/02_recompute.ipynb
        recorded = files.read_class(given, stems)
        returned = files.discover(given, stems)
        missing = files.absent(recorded, returned, {"02": LAB, "03": "03_sqrt_n.ipynb"}, stems)
        assert sorted(r.student for r in missing if r.path.name == LAB) == ["carol", "empty", "mallory", "zoe"]
        assert sorted(r.student for r in missing if r.path.name != LAB) == roster
        why = {r.student: r.refused for r in missing if r.path.name == LAB}
        assert why["carol"].startswith("missing: no notebook of Lab 02 taken: ") and "solution" in why["carol"]
        assert why["mallory"].startswith("missing: no notebook of Lab 02 taken: ") and "link out" in why["mallory"]
        assert why["empty"] == f"missing: no notebook of Lab 02 found below {homes / 'empty'}"
        assert "is on --roster, and no home given is theirs" in why["zoe"]
        assert len([r for r in files.absent(recorded, returned, {"03": "03_sqrt_n.ipynb"}, stems)
                    if "Lab 03 was not collected (collect --labs 02)" in r.refused]) == len(roster)
    (out / "ada" / LAB).unlink()
    gone = files.absent(files.read_class([out], stems), files.discover([out], stems), {"02": LAB}, stems)
    assert "collected (" in next(r.refused for r in gone if r.student == "ada") and f"not in {out} now" in gone[0].refused
    (out / collect.CLASS_FILE).chmod(0o600)
    (out / collect.CLASS_FILE).write_text('{"students": []}')
    with pytest.raises(ValueError, match="not the class labkit collect writes"):
        files.read_class([out], stems)


def test_the_summary_counts_the_students_with_nothing_apart_and_their_totals_are_0():
    rows = [report.Row("ada", "02", "2.1", "passed", ""), report.Row("ada", "02", "2.2", "failed", "x"),
            report.Row("bob", "02", "2.1", "missing", "missing: no notebook of Lab 02 found below /home/bob"),
            report.Row("bob", "02", "2.2", "missing", "missing: no notebook of Lab 02 found below /home/bob"),
            report.Row("cy", "02", "2.1", "missing", "missing: another lab's"), report.Row("cy", "02", "2.2", "error", "")]
    lines = report.summary(rows).splitlines()
    assert lines[0] == "Lab 02: 2 submissions, 1 student with nothing to grade (missing)"
    assert lines[-3:] == ["  ada  1 / 2", "  bob  0 / 2", "  cy   0 / 2"]
    assert report.summary(rows[:2]).splitlines()[0] == "Lab 02: 1 submissions"


def test_grade_refuses_a_class_folder_that_does_not_exist_or_holds_nothing_naming_it(tmp_path):
    with pytest.raises(grader.GradeError, match=f"{tmp_path / 'returnd'}: no such file or folder"):
        grader._class([tmp_path / "returnd"], ["02"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(grader.GradeError, match="nothing to grade in .*empty: no notebook, and no class"):
        grader._class([tmp_path / "empty"], ["02"])
    done = subprocess.run([sys.executable, "-m", "labkit", "grade", str(tmp_path / "returnd"), "--labs", "02",
                           "--out", str(tmp_path / "grades.csv")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and f"{tmp_path / 'returnd'}: no such file or folder" in done.stderr
    assert not (tmp_path / "grades.csv").exists()


def test_no_box_covers_tmp_or_a_folder_above_it():
    assert not grader._coverable(Path("/tmp")) and not grader._coverable(Path("/"))
    assert grader._coverable(Path("/tmp/returned")) and grader._coverable(ROOT)


@pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))
def test_a_class_under_tmp_graded_in_the_sandbox_every_student_a_row_the_missing_ones_0(tmp_path):
    """Collected into /tmp, graded in the sandbox with the gradebook right in /tmp (a cover over /tmp made every box
    fail, `bwrap: Can't mkdir /tmp/job.json`, blamed on an editable install): the finished lab 00 passes, the
    student with nothing is a missing row that totals 0."""
    homes, out = tmp_path / "home", tmp_path / "returned"
    (homes / "ada").mkdir(parents=True)
    (homes / "ada" / "00_start_here-Copy1.ipynb").write_text(json.dumps(_finished("00")))
    (homes / "bob").mkdir()
    collect.collect([f"{homes}/*"], out, labs=["00"], own=[])
    book = Path(f"/tmp/labkit-test-collect-{os.getpid()}.csv")
    try:
        done = subprocess.run([sys.executable, "-m", "labkit", "grade", str(out), "--labs", "00", "--out", str(book),
                               "--jobs", "1"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        with book.open(newline="") as f:
            rows = {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}
        with book.with_name(book.stem + "_students.csv").open(newline="") as f:
            totals = {r["student"]: r["total"] for r in csv.DictReader(f)}
    finally:
        for path in (book, book.with_suffix(".json"), book.with_name(book.stem + "_students.csv")):
            path.unlink(missing_ok=True)
    assert rows[("ada", "0.1")]["status"] == "passed", rows
    assert rows[("bob", "0.1")]["status"] == "missing" and "no notebook of Lab 00 found below" in rows[("bob", "0.1")][
        "message"]
    assert totals == {"ada": "1", "bob": "0"}
    assert "1 submissions, 1 student with nothing to grade (missing)" in done.stdout


def _finished(lab: str) -> dict:
    """Lab `lab`'s student view with every answer of the solution, as a student who finished it saves it."""
    from labkit.course.grade import bench

    nb = bench.answered(lab, {"0.1", "1.1", "1.2", "1.3", "1.4", "1.5", "2.1", "2.2", "2.3", "2.4", "2.5"}, ROOT)
    return json.loads(json.dumps(nb))


# ---------------------------------------------------------------- the docs, as written (bars/hub-gradebook, off the hub)
README = (ROOT / "README.md").read_text()
GUIDE = (ROOT / "docs" / "instructors.md").read_text()


def door(text: str, start: str) -> list[str]:
    """The commands of the first sh block after `start`, comments dropped."""
    block = re.search(r"```sh\n(.*?)```", text[text.index(start):], re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_instructor_door_is_the_guides_and_runs_python3_after_either_install():
    """The README's instructor door and the guide's first block are one list of commands: `make hub`, then the same
    `python3 -m labkit ...` whatever made the kit (make hub's python3, or .venv's once activated), with an --out in
    the instructor's own home, which collect accepts."""
    commands = door(README, "**An instructor**")
    assert commands == door(GUIDE, "# The instructor's guide")
    assert commands[0] == "make hub" and all(c.startswith("python3 -m labkit ") for c in commands[1:]), commands
    assert "collect /home/* --out ~/returned" in commands[2] and "grade ~/returned" in commands[3]
    assert ". .venv/bin/activate" in README[README.index("**An instructor**"):] and "make doctor" in README
    assert ".venv/bin/python" not in README[:README.index("## Time per lab")]


def test_what_the_instructors_commands_write_in_a_clone_is_ignored_by_git():
    paths = ["handout/README.md", "returned/ada/02_recompute.ipynb", f"returned/{collect.CLASS_FILE}", "grades.csv",
             "grades.json", "grades_students.csv", "leaderboard.csv", "leaderboard.html"]
    done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", *paths], capture_output=True, text=True)
    assert sorted(done.stdout.split()) == sorted(paths)


@pytest.mark.long  # a class of five graded in the sandbox: a minute or two
@pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))
def test_the_readme_door_run_as_written_in_an_activated_venv_gives_every_student_a_row(tmp_path):
    """The README's instructor commands, word for word but /home (here a folder of test homes), run by sh from the
    instructor's clone with .venv activated (after `make lab` or `make doctor`): every student a row, no row for
    the instructor, the clone not credited, the finished lab 5/5, the duplicate graded."""
    from helpers import classroom

    instructor = classroom.make_homes(tmp_path / "home")
    venv = ROOT / ".venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SUDO_USER")}
    env.update(HOME=str(instructor), VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    said = []
    for command in door(README, "**An instructor**")[1:]:
        done = subprocess.run(["/bin/sh", "-c", command.replace("/home/*", f"{tmp_path / 'home'}/*")],
                              cwd=instructor / "labkit", env=env, capture_output=True, text=True, timeout=900)
        said.append(done.stdout + done.stderr)
        assert done.returncode == 0, f"{command}:\n{said[-1][-3000:]}"
    assert (instructor / "labkit" / "handout" / "notebooks" / LAB).is_file()
    assert classroom.problems(instructor / "labkit" / "grades.csv", said[1]) == []


def test_a_box_imports_the_kit_and_the_user_site_the_grader_imports_from(monkeypatch, tmp_path):
    """make hub installs the kit and its dependencies into a user site (--user), under a HOME no box reads: the box
    is told the kit's folder and that site (before, every box after make hub said "No module named 'labkit'")."""
    package = tmp_path / "labkit" / "labkit"
    monkeypatch.setattr(grader.site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(grader.site, "getusersitepackages", lambda: str(tmp_path / ".local" / "site"))
    monkeypatch.setattr(grader.site, "getuserbase", lambda: str(tmp_path / ".local"))
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path / ".local" / "site")])
    assert grader._imports(package) == {"PYTHONPATH": str(tmp_path / "labkit"), "PYTHONUSERBASE": str(tmp_path / ".local")}
    monkeypatch.setattr(grader.site, "ENABLE_USER_SITE", False)  # a virtual environment of its own reads none
    assert grader._imports(package) == {"PYTHONPATH": str(tmp_path / "labkit")}


@pytest.mark.slow  # three grading runs without a box, none of them running a notebook
def test_students_with_nothing_fall_in_their_part_and_every_part_names_the_whole_class(tmp_path):
    """--shard K/N: a missing row is its student's part's, as a graded one is, and each part's roster holds every
    student of the class, the missing ones too, so that merge finds each in one part."""
    homes, out = tmp_path / "home", tmp_path / "returned"
    for name in ("ann", "ben", "cat", "dan", "eve", "fox"):
        (homes / name).mkdir(parents=True)
    collect.collect([f"{homes}/*"], out, labs=["02"], own=[])
    run = Options((out,), ("02",), Limits(seed=1), sandbox=False, progress=False, root=ROOT)
    whole = grader.run(run).rows
    parts, rosters, students = [], [], []
    for k in (0, 1):
        book = grader.run(dataclasses.replace(run, shard=(k, 2)))
        part = book.rows
        rosters.append(book.roster)
        parts += part
        students.append({r.student for r in part})
    assert all(students) and not students[0] & students[1], students  # two parts, each of its own students
    assert sorted((r.student, r.exercise, r.status) for r in parts) == sorted(
        (r.student, r.exercise, r.status) for r in whole)
    assert {r.status for r in whole} == {"missing"} and len({r.student for r in whole}) == 6
    assert all(sorted(set(r)) == ["ann", "ben", "cat", "dan", "eve", "fox"] for r in rosters)
