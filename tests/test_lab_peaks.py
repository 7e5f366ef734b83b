"""Each lab's predicted peak (labkit.env.sizing.lab_peaks, what the gpu profile's batch is fitted to) against the
lab's solution run on the CPU at the cpu sizes with one MemoryMeter over the whole notebook (tools/lab_peaks.py):
never below it, and at most half again above it, so that a term of the prediction lost or doubled is caught
without a GPU (`labkit gpu-check` holds the same against the allocator on one). Where a lab's parts
(labkit.env.sizing.lab_branches) run in cells of their own, each part is held so against its own cells' peak,
so that a part below another's figure is checked too.

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


# each part's cells, by how their source starts (after the NBVAL marker; tools/lab_peaks.py keeps 70 characters),
# and how far above their peak its prediction may be: half again, or closer where the part's tensors do not
# depend on a timing (a plan chosen by measured seconds), so that a term too many is caught too. Lab 06's advisor
# runs on the deep stack and the wide MLP in one cell, so only its larger part is held, by the lab's peak.
PART_CELLS = {
    "01": {"chain forward": (("deep = lk.MLPChain(",), 1.25),  # cpu: 184.6 MB predicted, 157.2 measured
           "Adam step": (("def one_step_meter(",), 1.06)},  # 36.4 against 34.9
    "05": {"ceilings": (("from labkit.instruments.timing import timing_met",), 1.01),  # exact: the buffers' own sizes
           "long stack": (("model, x = lk.bench.long_stack(size)", "from labkit.labs.recompute import checkpoint_h"),
                          1.5)},
    "07": {"plans' comparison": (("c = lk.bench.plan.capstone(size", 'plans = {"planner": plan_for('), 1.5),
           "batch search": (("batches = lk.bench.plan.batch_rows(",), 1.5),
           "vocabulary": (("import dataclasses\n\nfrom labkit.bench.logits", "from labkit.bench.logits import race"),
                          1.5)},
}


def _part_peak(rows, starts) -> int:
    sources = [(peak, source.removeprefix("# NBVAL_IGNORE_OUTPUT\n")) for peak, source in rows]
    found = [peak for peak, source in sources if source.startswith(starts)]
    assert len(found) == len(starts), f"cells starting {starts} not found once each in {[s for _, s in sources]}"
    return max(found)


def test_every_part_named_is_a_part_of_its_lab():
    from labkit.env.profile import sizes
    from labkit.env.sizing import lab_branches

    parts = lab_branches(sizes("cpu"))
    assert all(set(named) == set(parts[lab]) for lab, named in PART_CELLS.items())


@pytest.mark.parametrize("lab", [lab for lab in LABS if lab.number != "00"], ids=lambda lab: lab.number)
def test_a_labs_predicted_peak_bounds_its_measured_peak_within_half_again(lab):
    found = lab_peaks.peaks(lab.solution(ROOT), profile="cpu")
    measured, predicted = max(p for p, _ in found["rows"]), found["predicted"][lab.number]
    assert measured <= predicted <= 1.5 * measured, (
        f"lab {lab.number}: measured {measured:,} B, predicted {predicted:,} B ({measured / predicted:.0%})")
    for part, (starts, most) in PART_CELLS.get(lab.number, {}).items():
        measured, predicted = _part_peak(found["rows"], starts), found["parts"][lab.number][part]
        assert measured <= predicted <= most * measured, (
            f"lab {lab.number}, {part}: measured {measured:,} B, predicted {predicted:,} B ({measured / predicted:.0%})")
