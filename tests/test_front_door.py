"""The README's first screen (bars/front-door): three doors, each with its commands, its time and its page; a time
per lab on a GPU (gpu-check's record) and on a CPU; the instructors' and maintainers' material on pages of their
own under docs/."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = README[:README.index("## Time per lab")]


def test_three_doors_each_with_commands_a_time_and_its_page():
    for door, page, command in (("**On a JupyterHub**", "docs/hub.md", "make hub"),
                                ("**On a laptop**", "docs/laptop.md", "make lab"),
                                ("**An instructor**", "docs/instructors.md", "labkit release")):
        text = FIRST_SCREEN[FIRST_SCREEN.index(door):]
        text = text[:text.index("```", text.index("```sh") + 5)]
        assert f"]({page})" in text and (ROOT / page).is_file(), door
        assert command in text and re.search(r"\d+ (s|min)\b", text), f"{door}: its command and its time"
    assert len(FIRST_SCREEN.splitlines()) <= 45, "the three doors fit a screen"
    assert re.search(r"\d+(\.\d+)? MB", FIRST_SCREEN), "download sizes"


def test_a_time_for_each_lab_on_a_gpu_from_the_record_and_on_a_cpu():
    table = README[README.index("## Time per lab"):].split("\n\n")[2]
    record_name = re.search(r"docs/gpu/[\w.-]+\.json", README[README.index("## Time per lab"):]).group(0)
    rows = json.loads((ROOT / record_name).read_text())["rows"]
    seconds = {r["key"]: r["figures"]["run_all_seconds"] for r in rows if "run_all_seconds" in (r.get("figures") or {})}
    gpu = next(line for line in table.splitlines() if line.startswith("| GPU"))
    cpu = next(line for line in table.splitlines() if line.startswith("| CPU"))
    assert [int(x) for x in re.findall(r"(\d+) s", gpu)] == [round(seconds[f"lab{n:02d}"]) for n in range(8)]
    assert len(re.findall(r"\d+ s", cpu)) == 8


def test_the_readme_is_for_students_and_the_rest_has_its_own_pages():
    for moved in ("## Commands", "## Layout", "make long-test", "tools/mutants.py", "bench plan --json"):
        assert moved not in README, moved
    guide = (ROOT / "docs" / "instructors.md").read_text()
    for heading in ("## For instructors", "## Where to grade", "## On a JupyterHub: hand out, collect, grade"):
        assert heading in guide
    assert "labkit collect" in guide and "git-pull?repo=" in guide and "solutions must not be there" in guide
    maintainers = (ROOT / "docs" / "maintainers.md").read_text()
    for kept in ("## Commands", "## Layout", "make long-test", "tools/mutants.py", "gpu-check"):
        assert kept in maintainers, kept
    assert "docs/instructors.md" in README and "docs/maintainers.md" in README


def test_the_hub_page_without_make_runs_make_hubs_two_steps():
    """The page's lines for an image without make are the two commands of make hub's recipe (tools/kit.mk),
    with --user, so the dependencies come from pyproject.toml through labkit/env/hubdeps.py in both."""
    hub = (ROOT / "docs" / "hub.md").read_text()
    block = hub[hub.index("Without `make`"):].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    recipe = (ROOT / "tools" / "kit.mk").read_text().split("\nhub:", 1)[1].split("\n\n", 1)[0]
    assert lines == ["python3 -m pip install --user --no-deps -e .", "python3 labkit/env/hubdeps.py --user"]
    assert "-m pip install $(HUB_PIP_ARGS) --no-deps -e ." in recipe and "labkit/env/hubdeps.py $(HUB_PIP_ARGS)" in recipe
    assert "--no-deps -e ." in hub
