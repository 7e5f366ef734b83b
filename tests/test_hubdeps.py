"""`make hub`'s second step (labkit/env/hubdeps.py): the kit's dependencies installed into a hub image's Python
without changing anything the image has: what is present stays (an older one named, never upgraded into the
home, where it would shadow the image's own under the hub's server), what is missing is installed with every
present distribution pinned, JupyterLab (the hub's server) never."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pip._vendor.packaging.requirements import Requirement

from helpers.hubenv import image_python
from labkit.env import hubdeps

ROOT = Path(__file__).resolve().parent.parent


def test_the_kits_dependencies_are_pyprojects_but_torch():
    names = [r.name for r in hubdeps.requirements()]
    assert "torch" not in names and {"numpy", "jupyterlab", "pulp", "pwlf"} <= set(names)


def test_present_kept_older_named_missing_installed_the_server_never():
    wanted = [Requirement(r) for r in ("numpy>=1.26", "jupyterlab>=4.0", "pulp>=3.3", "ipykernel>=6.29", "tqdm>=4.66")]
    have = {"numpy": "1.24.4", "ipykernel": "6.29.5", "tqdm": "4.67.1"}
    todo = hubdeps.plan(wanted, have)
    assert todo["install"] == ["pulp>=3.3"]
    assert todo["server"] == ["jupyterlab"]
    assert todo["kept"] == ["ipykernel", "tqdm"]
    assert todo["older"] == ["numpy 1.24.4 (the kit asks >=1.26)"]


def test_every_present_distribution_is_pinned_and_an_unreadable_version_left_out():
    pins = hubdeps.constraints({"numpy": "1.26.4", "torch": "2.11.0+cu130", "odd": "not a version"})
    assert pins.splitlines() == ["numpy==1.26.4", "torch==2.11.0+cu130"]


@pytest.mark.slow
def test_in_an_image_that_lacks_one_dependency_only_it_is_installed_and_nothing_else_changes(tmp_path):
    """A hub image's Python without tqdm: hubdeps installs tqdm into the user site (pip finds it in this venv's
    wheel cache or the registry) and leaves every other distribution as it was."""
    python = image_python(tmp_path / "image")
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    for entry in purelib.iterdir():
        if entry.name.startswith("tqdm"):
            entry.unlink()
    listed = "import importlib.metadata as m; print(sorted((d.metadata['Name'], d.version) for d in m.distributions()))"
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": f"{python.parent}:/usr/bin:/bin"}
    before = subprocess.run([str(python), "-c", listed], capture_output=True, text=True, env=env, check=True).stdout
    done = subprocess.run([str(python), str(ROOT / "labkit" / "env" / "hubdeps.py"), "--user"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "installing what the image lacks: tqdm>=" in done.stdout
    after = subprocess.run([str(python), "-c", listed], capture_output=True, text=True, env=env, check=True).stdout
    added = set(eval(after)) - set(eval(before))  # noqa: S307 - our own repr of (name, version) pairs
    assert {name for name, _ in added} == {"tqdm"} and not set(eval(before)) - set(eval(after))
    assert list((home / ".local").rglob("tqdm/__init__.py")), "installed into the student's home"


def test_a_broken_distribution_without_a_version_or_name_is_left_out(tmp_path, monkeypatch):
    """A dist-info whose METADATA has a Name but no Version (or nothing) is not a package pip could pin or
    compare: left out, rather than crashing the install."""
    for folder, text in (("broken-0.dist-info", "Name: broken\n"), ("empty-0.dist-info", "")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "METADATA").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    have = hubdeps.installed()
    assert "broken" not in have and "" not in have and "numpy" in have
    assert "broken" not in hubdeps.constraints(have)


def test_a_version_pip_cannot_read_is_named_as_older_never_kept_or_replaced():
    todo = hubdeps.plan([Requirement("numpy>=1.26")], {"numpy": "not a version"})
    assert todo == {"install": [], "older": ["numpy not a version (the kit asks >=1.26)"], "server": [], "kept": []}


def _pip_says(monkeypatch, code: int) -> list[list[str]]:
    """hubdeps with nothing installed and pip replaced by one that exits `code`: the commands it was given."""
    calls = []
    monkeypatch.setattr(hubdeps, "installed", lambda: {"numpy": "2.0.0"})
    monkeypatch.setattr(hubdeps.subprocess, "run", lambda argv, **kw: calls.append(argv)
                        or subprocess.CompletedProcess(argv, code))
    return calls


def test_a_pip_that_fails_is_reported_with_its_status_and_what_was_asked(monkeypatch, capsys):
    calls = _pip_says(monkeypatch, 3)
    assert hubdeps.main(["--user"]) == 3
    out = capsys.readouterr().out
    failed = next(line for line in out.splitlines() if line.startswith("labkit: pip could not install "))
    assert "pulp>=3.3" in failed and "numpy" not in failed and "ask the hub's admin" in failed
    (argv,) = calls
    assert argv[:4] == [sys.executable, "-m", "pip", "install"] and argv[4] == "--user" and argv[5] == "-c"
    assert "numpy>=1.26" not in argv and any(a.startswith("pulp") for a in argv)  # what is there is not asked


def test_a_pip_that_succeeds_installs_only_what_is_missing(monkeypatch, capsys):
    calls = _pip_says(monkeypatch, 0)
    assert hubdeps.main([]) == 0
    out = capsys.readouterr().out
    assert "could not install" not in out and "installing what the image lacks: " in out and len(calls) == 1
    assert hubdeps.main(["--dry-run"]) == 0 and len(calls) == 1  # a dry run runs no pip
    assert "would install what the image lacks" in capsys.readouterr().out


def test_the_install_line_comes_before_pip_s_own_output_on_a_pipe(tmp_path):
    """On a pipe (make's log) Python holds its output back: the line naming what is installed is flushed before
    pip starts, so it is not printed after everything pip wrote."""
    code = ("import os, subprocess, sys\nfrom labkit.env import hubdeps\nhubdeps.installed = lambda: {}\n"
            "def pip(argv, **kw):\n    os.write(1, b'PIP SAYS\\n')\n    return subprocess.CompletedProcess(argv, 0)\n"
            "hubdeps.subprocess.run = pip\nsys.exit(hubdeps.main([]))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as under make
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    installing = next(i for i, line in enumerate(lines) if line.startswith("labkit: installing what the image lacks"))
    assert installing < lines.index("PIP SAYS"), lines
