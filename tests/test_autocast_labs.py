"""Every lab's solution, run whole on the gpu profile's bfloat16 path forced onto the CPU: the `tiny` sizes with
LABKIT_AUTOCAST=bfloat16, so that the time labs' models (02, 04-07) run their forwards under bfloat16 autocast as
on a GPU, and every check, comparison and bitwise claim of the lab holds there too (a GPU run is the same code
on another device: `python -m labkit gpu-check`).

Marker `long`: eight notebooks run whole take minutes, so `make long-test` (CI's second step) runs this file.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

from labkit.course.catalog import LABS
from labkit.course.notebook import run_once_more_on_timeout

pytestmark = [pytest.mark.long, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.number)
def test_a_lab_runs_to_its_end_under_bfloat16_autocast(lab, monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "tiny")
    monkeypatch.setenv("LABKIT_AUTOCAST", "bfloat16")
    path = lab.solution(ROOT)
    try:
        nb = run_once_more_on_timeout(lambda: nbformat.read(path, as_version=4), path.parent, 600, f"lab {lab.number}")
    except CellExecutionError as e:
        pytest.fail(f"lab {lab.number} under LABKIT_AUTOCAST=bfloat16: {str(e)[-2000:]}")
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    if lab.number in ("02", "04", "07"):  # these labs print their model's dtype: the autocast is said
        assert "under torch.bfloat16 autocast" in outputs, f"lab {lab.number} never says it ran under autocast"
