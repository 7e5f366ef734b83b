"""pyproject.toml and environment.yml describe the same dependencies; the install rules (tools/kit.mk) pin torch."""
from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _normal(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower().replace("_", "-")


def test_environment_yml_lists_exactly_the_pyproject_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_normal(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    pip = {_normal(line.strip()[2:]) for line in lines[start + 1:] if line.strip().startswith("- ")}
    pip.discard("-e.")
    pip.discard("-cconstraints.txt")
    assert pip == declared, f"only in environment.yml: {sorted(pip - declared)}; only in pyproject: {sorted(declared - pip)}"


def test_makefile_installs_a_pinned_torch_before_the_kit():
    makefile = (ROOT / "tools" / "kit.mk").read_text()  # the Makefile includes it; a student bundle ships it
    assert re.search(r"^TORCH_SPEC \?= torch==\d+\.\d+\.\d+$", makefile, re.M)
    assert makefile.index('"$(TORCH_SPEC)"') < makefile.index('-e ".$(EXTRAS)"')
    assert "--system-site-packages" in makefile  # an existing torch (GPU hub image) is reused


def test_ci_runs_make_test_then_the_long_tests_and_nothing_else():
    commands = [l for l in (ROOT / ".ci" / "run").read_text().splitlines() if l and not l.startswith("#")]
    assert commands[-2:] == ["make test", "make long-test"]


def test_installs_take_the_locked_versions_and_the_lock_leaves_torch_to_its_pin():
    makefile = (ROOT / "tools" / "kit.mk").read_text()
    assert "LOCK   ?= constraints.txt" in makefile and '-c "$(LOCK)"' in makefile
    assert "      - -c constraints.txt" in (ROOT / "environment.yml").read_text().splitlines()
    pins = [l for l in (ROOT / "constraints.txt").read_text().splitlines() if l and not l.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^=\s]+", l) for l in pins), "one name==version a line"
    names = {_normal(l.split("==")[0]) for l in pins}
    assert not names & {"torch", "triton", "labkit"} and not any(n.startswith("nvidia-") for n in names)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~ ]", _normal(r))[0] for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    assert declared - {"torch"} <= names, f"not locked: {sorted(declared - {'torch'} - names)}"


def test_make_lab_serves_jupyterlab_without_its_news_pop_up(tmp_path):
    """The browser tests' settings turn the "get notified about Jupyter news?" toast off; make lab writes the same
    into the venv's overrides.json before it serves, keeping a setting already there."""
    import json
    import subprocess
    import sys

    makefile = (ROOT / "tools" / "kit.mk").read_text()
    code = next(l for l in makefile.splitlines() if l.startswith("export NO_NEWS := ")).split(":= ", 1)[1]
    lab = makefile.split("\nlab:")[1].split("\n\n")[0]
    assert lab.index('$(PY) -c "$$NO_NEWS"') < lab.index("-m jupyter lab")
    overrides = tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    overrides.parent.mkdir(parents=True)
    overrides.write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"}}))
    for _ in range(2):  # twice: the second run changes nothing
        subprocess.run([sys.executable, "-c", f"import sys; sys.prefix = {str(tmp_path)!r}\n{code}"], check=True)
    assert json.loads(overrides.read_text()) == {
        "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"}}


def test_a_student_bundle_installs_the_notebooks_tools_and_the_repository_its_developer_tools_too(tmp_path):
    """`make -n` prints the install rule's commands with EXTRAS expanded: `.[dev]` where the kit's tests are
    (this repository), plain `.` in a folder without them (a student bundle ships kit.mk as its Makefile)."""
    import shutil
    import subprocess

    def install_line(folder: Path) -> str:
        out = subprocess.run(["make", "-n", "-B", "-f", str(ROOT / "tools" / "kit.mk"), "-C", str(folder), ".venv/.installed"],
                             capture_output=True, text=True, check=True).stdout
        return next(l for l in out.splitlines() if "pip install --progress-bar on -e" in l)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(ROOT / "pyproject.toml", bundle)
    assert '-e ".[dev]"' in install_line(ROOT)
    assert '-e "."' in install_line(bundle) and "[dev]" not in install_line(bundle)


def test_the_install_rule_reads_its_torch_floor_from_the_tested_range():
    from labkit.env import doctor
    floor = re.search(r"^TORCH_FLOOR := (\d+)\.(\d+)$", (ROOT / "tools" / "kit.mk").read_text(), re.M)
    assert floor and (int(floor[1]), int(floor[2])) == doctor.MIN_TORCH


def _python_with_torch(folder: Path, version: str) -> None:
    """`folder`/.venv/bin/python: this Python, importing a torch module that only says it is `version`."""
    import sys
    fake = folder / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    python = folder / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    # pip is never run for real: the fake says what it was asked and stops the rule
    python.write_text(f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then echo "FAKE PIP: $*"; exit 3; fi\n'
                      f'PYTHONPATH={fake} exec {sys.executable} "$@"\n')
    python.chmod(0o755)


@pytest.mark.parametrize("version, fits", [("2.8.0+cu121", False), ("2.12.1", False), ("2.13.0a0+git1234", False),
                                           ("2.13.0", True),
                                           ("2.13.0+cu128", True), ("2.14.0a0+git1234", True), ("3.0.0", True)])
def test_a_torch_older_than_the_floor_is_told_apart(tmp_path, version, fits):
    import subprocess
    _python_with_torch(tmp_path, version)
    makefile = (ROOT / "tools" / "kit.mk").read_text()
    code = next(l for l in makefile.splitlines() if l.startswith("export TORCH_FITS := ")).split(":= ", 1)[1]
    run = subprocess.run([str(tmp_path / ".venv" / "bin" / "python"), "-c", code, "2.13"], capture_output=True, text=True)
    assert (run.returncode == 0) == fits and run.stdout.strip() == version


def _make_install(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """The install rule run in `folder`, none of the calling make's settings inherited (a `make test TORCH_UPGRADE=1`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL") and not k.startswith("TORCH_")}
    return subprocess.run(["make", "-f", str(ROOT / "tools" / "kit.mk"), "-C", str(folder), ".venv/.installed", *args],
                          capture_output=True, text=True, env=env)


def test_a_hub_s_older_torch_stops_the_install_instead_of_being_replaced(tmp_path):
    """A venv whose Python already imports torch 2.8 (a GPU hub image's): the rule stops before pip, saying why and
    how to go on; nothing is installed. With TORCH_UPGRADE=1 it installs the pinned torch over it, as step 1."""
    import shutil
    _python_with_torch(tmp_path, "2.8.0+cu121")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    run = _make_install(tmp_path)
    assert run.returncode != 0 and "FAKE PIP" not in run.stdout
    assert "torch 2.8.0+cu121 is older than 2.11" in run.stdout and "TORCH_UPGRADE=1" in run.stdout
    assert not (tmp_path / ".venv" / ".installed").exists()
    run = _make_install(tmp_path, "TORCH_UPGRADE=1", "TORCH_PIP_ARGS=--index-url=file:///nowhere")
    assert "FAKE PIP: -m pip install --progress-bar on --index-url=file:///nowhere torch==" in run.stdout, run.stdout
    assert not (tmp_path / ".venv" / ".installed").exists()
