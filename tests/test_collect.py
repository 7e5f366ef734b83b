"""`labkit collect`: the students' notebooks from their hub homes into returned/<name>/, never through a link out
of a home (bars/grade-collect)."""
from __future__ import annotations

import os
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
