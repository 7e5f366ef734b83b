"""`labkit release`: the bundle an instructor hands out holds no answer still due, and its notebooks run."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from labkit.course import release
from labkit.course.catalog import LABS as CATALOG

ROOT = Path(__file__).resolve().parent.parent
LABS = release.labs(ROOT)


@pytest.mark.parametrize("text, words", [("01,03", "skips lab 02"), ("9", "unknown lab 09"), ("", "no lab named"),
                                         ("x", "unknown lab x")])
def test_bad_lab_lists_are_refused_naming_the_value(text, words):
    with pytest.raises(release.ReleaseError, match=words):
        release.parse_labs(text, LABS)


def test_lab_lists_are_read_in_order():
    assert release.parse_labs("3,2", LABS) == ["02", "03"]
    assert release.parse_labs(None, LABS) == list(LABS)


def test_a_later_lab_alone_ships_the_earlier_answers_but_not_its_own(tmp_path):
    release.write(ROOT, tmp_path / "b", ["03"])
    shipped = {p.name for p in (tmp_path / "b" / "labkit" / "reference").glob("*.py")}
    assert {"activation_memory.py", "recompute.py"} <= shipped
    assert not shipped & {"sqrt_n.py", "selective.py", "roofline.py", "start_here.py"}  # lab 00 carried, its answer too
    assert sorted(p.name for p in (tmp_path / "b" / "notebooks").iterdir()) == ["00_start_here.ipynb", "03_sqrt_n.ipynb"]
    assert (tmp_path / "b" / "Makefile").read_text() == (ROOT / "tools" / "kit.mk").read_text()
    readme = (tmp_path / "b" / "README.md").read_text()
    assert "What to hand in" in readme and "`yourname/03_sqrt_n.ipynb`" in readme
    for name in ("pyproject.toml", "environment.yml", "constraints.txt"):  # a bundle installs the tested versions
        assert (tmp_path / "b" / name).read_text() == (ROOT / name).read_text()
    with pytest.raises(release.ReleaseError, match="not an empty folder"):
        release.write(ROOT, tmp_path / "b", ["03"])


def test_every_bundle_carries_lab_00_and_says_so(tmp_path):
    """Lab 00 (the doctor, the profiles, how a checker answers) is what every later lab assumes a student ran."""
    done = subprocess.run([sys.executable, "-m", "labkit", "release", str(tmp_path / "b"), "--labs", "01,02"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "b" / "notebooks").iterdir()) == [
        "00_start_here.ipynb", "01_activation_memory.ipynb", "02_recompute.ipynb"]
    assert "lab 00 (00_start_here" in done.stdout and "start_here.py" in done.stdout
    readme = (tmp_path / "b" / "README.md").read_text()
    assert "`yourname/01_activation_memory.ipynb`" in readme and "00_start_here.ipynb" in readme
    release.write(ROOT, tmp_path / "c", ["00", "01"])  # released with the others: carried once
    assert sorted(p.name for p in (tmp_path / "c" / "notebooks").iterdir()) == [
        "00_start_here.ipynb", "01_activation_memory.ipynb"]
    assert release.withheld(ROOT, ["02"]) == release.withheld(ROOT, ["02"], bundle=False)  # the grader's is unchanged
    assert "start_here.py" not in release.withheld(ROOT, ["02"])


def test_a_bundle_ships_no_compiled_answers(tmp_path):
    """Python caches what it imports as __pycache__/*.pyc: an answer due, compiled in the kit, must not ship."""
    cache = ROOT / "labkit" / "reference" / "__pycache__"
    made = not cache.exists()
    cache.mkdir(exist_ok=True)
    planted = cache / "sqrt_n.cpython-311.planted.pyc"
    planted.write_bytes(b"compiled answers")
    try:
        release.write(ROOT, tmp_path / "b", ["03"])
    finally:
        planted.unlink()
        if made:
            cache.rmdir()
    shipped = [p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*")]
    assert not [p for p in shipped if p.suffix == ".pyc" or "__pycache__" in p.parts], shipped[:5]


def test_student_notebooks_name_no_reference_file():
    for path in [lab.student(ROOT) for lab in CATALOG]:
        text = path.read_text()
        assert "labkit/reference" not in text and "labkit.reference" not in text, path.name


@pytest.mark.slow
def test_in_a_fresh_venv_the_bundle_hides_the_answers_and_its_notebooks_run(tmp_path):
    bundle, venv = tmp_path / "bundle", tmp_path / "venv"
    done = subprocess.run([sys.executable, "-m", "labkit", "release", str(bundle), "--labs", "01,02"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # the kit's dependencies (torch and the rest) from this environment, but not its editable labkit
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "kit-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(bundle)], check=True, capture_output=True)
    env = dict(os.environ, LABKIT_PROFILE="tiny", LABKIT_CHECKS="show")
    probe = ("import labkit, importlib\n"
             "print(labkit.__file__)\n"
             "for m in ('recompute', 'activation_memory', 'sqrt_n'):\n"
             "    try:\n        importlib.import_module('labkit.reference.' + m); print(m, 'imported')\n"
             "    except ModuleNotFoundError:\n        print(m, 'absent')\n")
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                         check=True).stdout
    assert str(venv) in out.splitlines()[0], "the bundle's labkit, not the repository's"
    assert "recompute absent" in out and "activation_memory absent" in out and "sqrt_n absent" in out
    runner = ROOT / "tests" / "helpers" / "run_all.py"
    for notebook in sorted((bundle / "notebooks").glob("*.ipynb")):
        done = subprocess.run([str(python), str(runner), str(notebook)], capture_output=True, text=True, env=env,
                              timeout=600)
        assert done.returncode == 0, f"{notebook.name}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
