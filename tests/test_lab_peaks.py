"""Each lab's predicted peak (labkit.env.sizing.lab_peaks, what the gpu profile's batch is fitted to) against the
lab's solution run on the CPU at the cpu sizes with one MemoryMeter over the whole notebook (tools/lab_peaks.py):
never below it, and at most half again above it, so that a term of the prediction lost or doubled is caught
without a GPU (`labkit gpu-check` holds the same against the allocator on one).

Marker `long`: seven notebooks run whole take minutes, so `make long-test` (CI's second step) runs this file.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from labkit.course.catalog import LABS

pytestmark = [pytest.mark.long, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lab_peaks", ROOT / "tools" / "lab_peaks.py")
lab_peaks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_peaks)


@pytest.mark.parametrize("lab", [lab for lab in LABS if lab.number != "00"], ids=lambda lab: lab.number)
def test_a_labs_predicted_peak_bounds_its_measured_peak_within_half_again(lab):
    found = lab_peaks.peaks(lab.solution(ROOT), profile="cpu")
    measured, predicted = max(p for p, _ in found["rows"]), found["predicted"][lab.number]
    assert measured <= predicted <= 1.5 * measured, (
        f"lab {lab.number}: measured {measured:,} B, predicted {predicted:,} B ({measured / predicted:.0%})")
