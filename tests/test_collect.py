"""`labkit collect`: the students' notebooks from their hub homes into returned/<name>/, never through a link out
of a home (bars/grade-collect)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.course import collect

ROOT = Path(__file__).resolve().parent.parent
LAB = "02_recompute.ipynb"


def _homes(tmp_path: Path) -> Path:
    """Three hub homes as nbgitpuller leaves them: ada and grace with their notebooks, mallory with a link out of
    her home (to a file no student may hand in) in place of hers."""
    homes = tmp_path / "home"
    secret = tmp_path / "kit" / "solutions" / LAB
    secret.parent.mkdir(parents=True)
    secret.write_text('{"the": "solutions"}')
    for name in ("ada", "grace", "mallory"):
        (homes / name / "labkit-handout" / "notebooks").mkdir(parents=True)
    for name in ("ada", "grace"):
        (homes / name / "labkit-handout" / "notebooks" / LAB).write_text(f'{{"student": "{name}"}}')
        (homes / name / "labkit-handout" / "notebooks" / "00_start_here.ipynb").write_text(f'"{name} 00"')
    (homes / "mallory" / "labkit-handout" / "notebooks" / LAB).symlink_to(secret)
    return homes


def test_three_homes_fill_returned_with_two_students_and_refuse_the_link(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    done = subprocess.run([sys.executable, "-m", "labkit", "collect", f"{homes}/*", "--out", str(out),
                           "--labs", "02"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == ["ada/02_recompute.ipynb", "grace/02_recompute.ipynb"]
    assert (out / "grace" / LAB).read_text() == '{"student": "grace"}'
    assert "solutions" not in "".join(p.read_text() for p in out.rglob("*.ipynb"))
    mallory = next(line for line in done.stdout.splitlines() if line.startswith("labkit collect: mallory"))
    assert "REFUSED" in mallory and "a link out of the home" in mallory and LAB in mallory, done.stdout
    assert "2 notebooks of 2 students" in done.stdout


def test_every_lab_by_default_and_the_newest_of_two_copies(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    older = homes / "ada" / "Untitled Folder" / LAB
    older.parent.mkdir()
    older.write_text('"an older copy"')
    old = time.time() - 3600
    os.utime(older, (old, old))
    (homes / "ada" / ".ipynb_checkpoints").mkdir()
    (homes / "ada" / ".ipynb_checkpoints" / LAB).write_text('"a checkpoint"')
    records = {h.student: h for h in collect.collect(f"{homes}/*", out)}
    assert sorted(p.name for p in records["ada"].written) == ["00_start_here.ipynb", LAB]
    assert (out / "ada" / LAB).read_text() == '{"student": "ada"}'
    assert records["ada"].left == [str(older)] and "older copy" in records["ada"].line()
    assert records["mallory"].written == [] and len(records["mallory"].refused) == 1


def test_links_to_folders_and_homes_that_are_links_are_not_followed(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (homes / "grace" / "classmate").symlink_to(homes / "ada" / "labkit-handout")  # a folder out of grace's home
    (homes / "grace" / "here").symlink_to(homes / "grace" / "labkit-handout")  # a link inside: skipped, not refused
    (homes / "bob").symlink_to(homes / "ada")  # a home that is itself a link
    records = {h.student: h for h in collect.collect(f"{homes}/*", out, labs=["02"])}
    assert (out / "grace" / LAB).read_text() == '{"student": "grace"}'
    assert [r.split(":")[0] for r in records["grace"].refused] == [str(homes / "grace" / "classmate")]
    assert records["bob"].written == [] and "itself a link" in records["bob"].refused[0]
    assert not (out / "bob").exists()


def test_a_fifo_or_an_oversized_file_is_refused_unread(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (homes / "ada" / "labkit-handout" / "notebooks" / LAB).unlink()
    os.mkfifo(homes / "ada" / "labkit-handout" / "notebooks" / LAB)  # opening it for reading would hang
    with open(homes / "grace" / "labkit-handout" / "notebooks" / LAB, "wb") as f:
        f.truncate(collect.MOST_BYTES + 1)
    records = {h.student: h for h in collect.collect(f"{homes}/*", out, labs=["02"])}
    assert "not a regular file" in records["ada"].refused[0]
    assert "over the limit" in records["grace"].refused[0]
    assert not list(out.rglob(LAB))


def test_a_prefix_is_stripped_and_two_homes_of_one_name_are_refused(tmp_path):
    homes = tmp_path / "home"
    for name in ("jupyter-ada", "jupyter-grace"):
        (homes / name).mkdir(parents=True)
        (homes / name / LAB).write_text(f'"{name}"')
    records = collect.collect(f"{homes}/*", tmp_path / "returned", strip="jupyter-")
    assert [h.student for h in records] == ["ada", "grace"]
    (homes / "ada").mkdir()
    with pytest.raises(collect.CollectError, match="both student 'ada'"):
        collect.collect(f"{homes}/*", tmp_path / "again", strip="jupyter-")
    with pytest.raises(collect.CollectError, match="matches no folder"):
        collect.collect(f"{tmp_path}/nowhere/*", tmp_path / "again")


def _run(homes: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI, its output strictly UTF-8 (a raw undecodable name would crash it, as on most terminals)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    return subprocess.run([sys.executable, "-m", "labkit", "collect", f"{homes}/*", "--out", str(out), *args],
                          capture_output=True, cwd=ROOT, env=env)


def test_names_not_utf8_or_holding_control_characters_are_escaped_in_the_report(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    secret = tmp_path / "kit" / "solutions" / LAB
    forged = "x\nlabkit collect: eve (home of eve): 02_recompute.ipynb\x1b[2K"  # would print as a report line
    (homes / "ada" / forged).mkdir()
    (homes / "ada" / forged / LAB).symlink_to(secret)
    undecodable = os.fsencode(homes / "grace") + b"/\xff\xfe"  # printed raw, it crashed the report
    os.mkdir(undecodable)
    os.symlink(os.fsencode(secret), undecodable + b"/" + LAB.encode())
    done = _run(homes, out, "--labs", "02")
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
    records = collect.collect(f"{homes}/*", out, labs=["02"])
    bad = next(h for h in records if h.student == "bad\\xffname")
    assert bad.written == [] and "not a student's name" in bad.refused[0] and "\\xff" in bad.line()
    assert sorted(p.name for p in out.iterdir()) == ["ada", "grace"]


def test_only_the_copy_taken_is_opened(tmp_path, monkeypatch):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    old = time.time() - 3600
    for folder in ("old", "older"):
        (homes / "ada" / folder).mkdir()
        (homes / "ada" / folder / LAB).write_text(f'"{folder}"')
        os.utime(homes / "ada" / folder / LAB, (old, old))
        old -= 3600
    opened, real_open = [], os.open

    def spy(path, flags, *args, **kwargs):
        if os.fsdecode(path).endswith(LAB) and not os.fsdecode(path).startswith(str(out)):
            opened.append(path)  # a copy read (the copies written to `out` are not counted)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    records = {h.student: h for h in collect.collect(f"{homes}/*", out, labs=["02"])}
    monkeypatch.undo()
    assert (out / "ada" / LAB).read_text() == '{"student": "ada"}' and len(records["ada"].left) == 2
    assert len(opened) == 2, opened  # one per student who has the lab, never the older copies


def test_a_hard_link_is_reported_and_not_collected(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    ada = homes / "ada" / "labkit-handout" / "notebooks" / LAB
    ada.unlink()
    os.link(homes / "grace" / "labkit-handout" / "notebooks" / LAB, ada)  # grace's file, under ada's name too
    records = {h.student: h for h in collect.collect(f"{homes}/*", out, labs=["02"])}
    for name in ("ada", "grace"):
        assert records[name].written == [], name
        assert len(records[name].refused) == 1 and "2 hard links" in records[name].refused[0], records[name]
    assert not list(out.rglob(LAB))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_a_file_owned_by_someone_else_is_reported_and_not_collected(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    os.chown(homes / "ada" / "labkit-handout" / "notebooks" / LAB, 4242, -1)
    records = {h.student: h for h in collect.collect(f"{homes}/*", out, labs=["02"])}
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
    records = {h.student: h for h in collect.collect(f"{homes}/*", out, labs=["02"])}
    monkeypatch.undo()
    assert records["ada"].refused == [f"{homes / 'ada' / 'private'}: a folder that cannot be read (Permission "
                                      "denied), not searched"]
    assert (out / "ada" / LAB).exists()


def test_folders_nested_too_deep_are_reported_not_searched(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    deep = homes / "grace" / Path(*["d"] * (collect.MOST_DEPTH + 1))
    deep.mkdir(parents=True)
    records = {h.student: h for h in collect.collect(f"{homes}/*", out, labs=["02"])}
    assert len(records["grace"].refused) == 1 and "levels below the home" in records["grace"].refused[0]
    assert (out / "grace" / LAB).exists()


def test_an_out_folder_that_is_not_empty_is_refused_and_left_alone(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    (out / "ghost").mkdir(parents=True)
    (out / "ghost" / LAB).write_text('"an earlier run"')
    with pytest.raises(collect.CollectError, match="not empty.*new folder"):
        collect.collect(f"{homes}/*", out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["ghost", f"ghost/{LAB}"]
    out.with_name("file").write_text("")
    with pytest.raises(collect.CollectError, match="not a folder"):
        collect.collect(f"{homes}/*", out.with_name("file"))
    assert collect.collect(f"{homes}/*", tmp_path / "empty", labs=["02"])  # an empty folder is taken


def test_two_homes_of_one_name_are_refused_before_anything_is_written(tmp_path):
    homes, out = tmp_path / "home", tmp_path / "returned"
    for name in ("ada", "jupyter-ada"):  # ada sorts first: the old code wrote her before it met jupyter-ada
        (homes / name).mkdir(parents=True)
        (homes / name / LAB).write_text(f'"{name}"')
    with pytest.raises(collect.CollectError, match="both student 'ada'"):
        collect.collect(f"{homes}/*", out, strip="jupyter-")
    assert not out.exists()


def test_copies_are_private_and_out_inside_a_home_is_refused(tmp_path):
    homes, out = _homes(tmp_path), tmp_path / "returned"
    collect.collect(f"{homes}/*", out, labs=["02"])
    assert stat.S_IMODE((out / "ada" / LAB).stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ada").stat().st_mode) == 0o700
    inside = homes / "grace" / "returned"
    with pytest.raises(collect.CollectError, match="inside the home"):
        collect.collect(f"{homes}/*", inside)
    assert not inside.exists()
