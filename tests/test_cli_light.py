"""A command line that starts anywhere (issue 53, item 5): on a Python without torch or Jupyter, `python -m labkit
--help` works and `python -m labkit doctor` names what is missing and the one command that installs it, exit 1, no
traceback; `import labkit` imports no torch until a lab's name is used."""
from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    """A Python of its own, with nothing installed (no torch, no Jupyter, no pip): the kit on its PYTHONPATH."""
    folder = tmp_path_factory.mktemp("bare")
    try:
        venv.EnvBuilder(with_pip=False, system_site_packages=False).create(folder / "venv")
    except Exception as e:  # noqa: BLE001  (a Python built without venv support: nothing to test here)
        pytest.skip(f"cannot make a virtual environment here: {e}")
    python = folder / "venv" / "bin" / "python"
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    assert probe.returncode != 0, "the bare venv imports torch: it is not bare"
    return python


def run_bare(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LABKIT_", "VIRTUAL_ENV"))}
    return subprocess.run([python, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env=dict(env, PYTHONPATH=str(ROOT)))


def test_help_works_on_a_python_without_torch(bare, tmp_path):
    done = run_bare(bare, "-m", "labkit", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m labkit" in done.stdout and "doctor" in done.stdout and done.stderr == ""
    sub = run_bare(bare, "-m", "labkit", "grade", "--help", cwd=tmp_path)
    assert sub.returncode == 0 and "--shard" in sub.stdout, sub.stderr


def test_doctor_on_a_python_without_torch_names_what_is_missing_and_one_command(bare, tmp_path):
    done = run_bare(bare, "-m", "labkit", "doctor", cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == "labkit doctor: problems found"
    packages = next(line for line in lines if line.startswith("  FAIL packages: missing: "))
    for name in ("torch>=", "matplotlib>=", "jupyterlab>=", "ipykernel>=", "nbclient>="):
        assert name in packages, packages
    fixes = [line for line in lines if line.strip().startswith("fix:")]
    assert fixes == [f"       fix: cd {ROOT} && make lab   (a .venv there with the tested versions of all of them, "
                     "then JupyterLab in it: run the labs, and this doctor, from that .venv)"], lines
    assert "  FAIL torch: torch does not import (fix: the packages command above)" in lines


def test_a_lab_s_name_on_a_python_without_torch_says_what_to_run(bare, tmp_path):
    code = "import labkit as lk\ntry:\n    lk.sizes\nexcept ImportError as e:\n    print(e)"
    done = run_bare(bare, "-c", code, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("labkit needs PyTorch, which does not import here") and \
        "python -m labkit doctor" in done.stdout


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return set(out.split())


def test_import_labkit_and_help_import_no_torch_until_a_lab_needs_it():
    assert "torch" not in _modules_after("import labkit")
    assert "torch" not in _modules_after("import labkit as lk\nlk.doctor")
    helped = _modules_after("import runpy, sys\nsys.argv = ['labkit', '--help']\ntry:\n"
                            "    runpy.run_module('labkit', run_name='__main__')\nexcept SystemExit:\n    pass")
    assert "torch" not in helped and "argparse" in helped
    assert {"torch", "labkit.models", "labkit.checks"} <= _modules_after("import labkit as lk\nlk.sizes")


def test_the_surface_names_each_resolve_and_dir_lists_them():
    import labkit as lk

    assert set(lk.SURFACE) | set(lk.ALONE) <= set(dir(lk)) and set(lk.__all__) == set(lk.SURFACE) | set(lk.ALONE)
    for name in lk.__all__:
        assert getattr(lk, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'planning'"):
        lk.planning


def test_the_kit_s_variables_are_read_through_labkit_env_variables(monkeypatch, tmp_path):
    from labkit.checks.base import interactive
    from labkit.env import variables
    from labkit.labs import places

    monkeypatch.setenv(variables.NOTEBOOKS, str(tmp_path))
    assert places()[0] == tmp_path
    monkeypatch.delenv(variables.NOTEBOOKS)
    assert tmp_path not in places() and places()[0] == Path.cwd()
    monkeypatch.setenv(variables.CHECKS, "show")
    assert interactive() is True
    monkeypatch.setenv(variables.CHECKS, "raise")
    assert interactive() is False
    monkeypatch.setenv(variables.CHECKS, "loud")  # not a mode: the guess (no frontend here)
    assert variables.checks_mode() == "" and interactive() is False
    with pytest.raises(ValueError, match="'LABKIT_OTHER' is not one of the kit's variables"):
        variables.read("LABKIT_OTHER")
    child = variables.for_child({"PATH": "/bin", variables.BOX_OF: "pid:[1]"}, profile="tiny")
    assert child == {"PATH": "/bin", variables.PROFILE: "tiny"}
    assert variables.for_child({}, box_of="pid:[2]") == {variables.BOX_OF: "pid:[2]"}


def _kit_variables_outside_env() -> list[str]:
    """Each place in labkit/ outside labkit/env/ that names a LABKIT_* variable as a key or keyword (a read or a
    set); prose that mentions one ($LABKIT_GPU_MEMORY in a help text) is no read."""
    import ast
    import re

    name = re.compile(r"LABKIT_[A-Z0-9_]+")
    found = []
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("labkit", "env"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and name.fullmatch(node.value):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
            elif isinstance(node, ast.keyword) and node.arg and name.fullmatch(node.arg):
                found.append(f"{rel}:{node.lineno}: {node.arg}=")
    return found


def test_labkit_variables_are_read_and_set_in_labkit_env_only():
    assert _kit_variables_outside_env() == []


def test_the_gpu_check_is_a_maintainers_tool_outside_the_package_the_command_still_runs():
    assert not (ROOT / "labkit" / "course" / "gpucheck.py").exists() and (ROOT / "tools" / "gpucheck.py").is_file()
    done = subprocess.run([sys.executable, "-m", "labkit", "gpu-check", "--list"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("meter ") and "lab07" in done.stdout, done.stderr


def test_no_command_line_function_is_over_forty_lines():
    """The command line parses and calls (labkit/cli/, one module per group of commands): what it runs lives
    elsewhere, so no function of it needs more than 40 lines."""
    import ast

    long = []
    for path in sorted([*(ROOT / "labkit" / "cli").glob("*.py"), ROOT / "labkit" / "__main__.py"]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 40:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}")
    assert long == []


def test_grade_merge_is_a_command_of_its_own_with_its_own_help():
    done = subprocess.run([sys.executable, "-m", "labkit", "grade", "merge", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m labkit grade merge"), done.stderr
    assert "--labs" not in done.stdout and "--unsigned" in done.stdout
    typo = subprocess.run([sys.executable, "-m", "labkit", "grade", "merge", "p.csv", "--outt", "x"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert typo.returncode == 2 and "unrecognized arguments: --outt x" in typo.stderr  # not grading's: argparse's
    late = subprocess.run([sys.executable, "-m", "labkit", "grade", "--labs", "02", "merge", "p.json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)  # merge after an option: no part
    assert late.returncode == 2 and late.stderr.startswith("labkit grade: 'merge' is no submission here; to join "
                                                           "parts, merge comes right after grade"), late.stderr
