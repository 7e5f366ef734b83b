"""The README's hub door, run for real (bars/front-door): in a fresh copy of the kit, in a hub image's Python that
has torch and Jupyter but not the kit, with JupyterHub's variables set, the README's hub commands leave the kit
importable in that Python, its torch untouched, and `make lab` starts no server of its own."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers.hubenv import HUB_VARIABLES, fresh_copy, image_python, readme_hub_commands, run_hub_path

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _where(python: Path, home: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, cwd=home,
                          env=dict(env, HOME=str(home), **HUB_VARIABLES)).stdout.strip()


def _servers_in(folder: Path) -> list[int]:
    """Pids of Jupyter servers whose working folder is `folder`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if "jupyter" in cmd and Path(cwd).is_relative_to(folder):
            found.append(int(entry.name))
    return found


def test_the_readme_names_the_hub_commands():
    commands = readme_hub_commands()
    assert commands and any(c.startswith("make hub") for c in commands), commands


def test_the_hub_path_in_a_fresh_copy_leaves_the_kit_importable_and_starts_no_server(tmp_path):
    clone, home = fresh_copy(tmp_path / "labkit"), tmp_path / "home" / "ada"
    python = image_python(tmp_path / "image")
    home.mkdir(parents=True)
    torch_before = _where(python, home, "import torch; print(torch.__version__, torch.__file__)")
    assert subprocess.run([str(python), "-c", "import labkit"], cwd=home, capture_output=True).returncode != 0

    done = run_hub_path(clone, python, home)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "torch" not in " ".join(line for line in done.stdout.splitlines() if line.startswith("Collecting"))
    found = _where(python, home, "import labkit, torch; print(labkit.__file__); print(torch.__version__, torch.__file__)")
    kit, torch_after = found.splitlines()
    assert Path(kit) == clone / "labkit" / "__init__.py"
    assert torch_after == torch_before, "the image's torch was replaced"
    assert (home / ".local").is_dir(), "a hub image's Python reads the user site: the kit goes to the home"

    # make lab, on a hub, installs as make hub does and returns: no second JupyterLab, which a browser cannot reach
    lab = run_hub_path(clone, python, home, commands=["make lab"], timeout=300)
    assert lab.returncode == 0, lab.stdout[-2000:] + lab.stderr[-2000:]
    assert "starts no JupyterLab" in lab.stdout and "jupyter lab" not in lab.stdout
    assert _servers_in(clone) == []


def test_make_lab_serves_only_where_no_hub_is_said(tmp_path):
    """The same make lab, JupyterHub's variables unset, plans its own server (the laptop's door)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_") and k not in ("MAKEFLAGS", "MAKELEVEL")}
    plan = subprocess.run(["make", "-n", "lab"],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    assert "-m jupyter lab" in plan.stdout, plan.stdout + plan.stderr
    for name in HUB_VARIABLES:
        if name == "JUPYTERHUB_USER":
            continue
        hub = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True,
                             env=dict(env, **{name: HUB_VARIABLES[name]}))
        assert "-m jupyter lab" not in hub.stdout and "pip install" in hub.stdout, name
