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
    assert pip == declared, f"only in environment.yml: {sorted(pip - declared)}; only in pyproject: {sorted(declared - pip)}"


def test_makefile_installs_a_pinned_torch_before_the_kit():
    makefile = (ROOT / "tools" / "kit.mk").read_text()  # the Makefile includes it; a student bundle ships it
    assert re.search(r"^TORCH_SPEC \?= torch==\d+\.\d+\.\d+$", makefile, re.M)
    assert makefile.index('"$(TORCH_SPEC)"') < makefile.index('-e ".[dev]"')
    assert "--system-site-packages" in makefile  # an existing torch (GPU hub image) is reused


def test_ci_runs_make_test_and_nothing_else():
    commands = [l for l in (ROOT / ".ci" / "run").read_text().splitlines() if l and not l.startswith("#")]
    assert commands[-1] == "make test"
