"""pyproject.toml and environment.yml describe the same dependencies; the install rules (tools/kit.mk) pin torch."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

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
