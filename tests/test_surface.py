"""The `lk` surface: every `lk.*` name the labs used before the package was cut by role (f5ab794) still resolves,
except the few the layout retired on purpose, each with the name that replaces it, or the reason it is gone."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import nbformat
import pytest

import labkit as lk
from labkit.course.catalog import LABS

ROOT = Path(__file__).resolve().parent.parent

# the lk.* names the solutions of f5ab794 used, in code and in prose
BEFORE = """ConvNet GPT GPTBlock GPTConfig GPTStack MLPChain MLPConfig advice.advise bench.activation_peak bench.hetero_chain
bench.lab02.step_meters bench.lab04.Policy bench.lab04._wrapped bench.lab04.compiled_runner bench.lab04.grads
bench.lab04.head_to_head bench.lab04.kept_after_forward bench.lab04.saved_after_forward bench.lab04.standard_policies
bench.lab04.step bench.lab05.op_rows bench.lab05.worst_ratio bench.lab06.costs bench.lab06.rng_config
bench.lab06.train_losses bench.long_config bench.long_stack bench.mlp_chain bench.policy_rows
bench.recompute_comparison bench.segment_constants bench.segments_sweep bench.step_time_ratio benchmark compare doctor
gpt_input harness.compare_step korthikanti_bytes korthikanti_terms layer_chain measure_peak mlp_input next_token_loss
ops.trace parameter_bytes plots.crossover plots.largest_batches plots.loss_curves plots.measured_vs_predicted
plots.pareto plots.roofline plots.saved_by_op plots.schedule_diagram plots.segments_figure plots.timeline
plots.timelines plots.u_curves roofline.ELEMENTWISE_FLOPS roofline.GPU_SPECS roofline.flops roofline.measure_ceilings
roofline.measure_host_bandwidth roofline.moves_data roofline.offload_seconds saved_tensors sizes
widgets.segments_explorer""".split()
RETIRED = {  # name -> its replacement, or why it is gone (an exercise's answer is not library code)
    "planning.applied": "planners.applied", "planning.peak_of": "plans.peak_of",
    "planning.profile_model": "planners.profile_model", "planning.seconds_of": "plans.seconds_of",
    "harness.difference": "Exercise 6.1's answer: the harness takes it as compare_step(..., difference=...)",
    "roofline.spec_predictions": "Exercise 5.1's roofline time at a spec sheet: lab 05 prices by the student's own",
    **{f"bench.lab07.{name}": f"bench.plan.{name}"  # bench/ modules named as their benchmarks (issue 53)
       for name in ("at_batch", "batch_rows", "budget_between", "capstone", "rows", "train_losses")},
}


def _resolve(dotted: str):
    return functools.reduce(getattr, dotted.split("."), lk)


@pytest.mark.parametrize("name", BEFORE)
def test_every_name_the_labs_used_still_resolves(name):
    _resolve(name)


@pytest.mark.parametrize("name, instead", RETIRED.items())
def test_a_retired_name_is_gone_and_its_replacement_resolves(name, instead):
    with pytest.raises(AttributeError):
        _resolve(name)
    if " " not in instead:
        _resolve(instead)


def test_every_name_the_solutions_use_now_resolves():
    used = set()
    for lab in LABS:
        for cell in nbformat.read(lab.solution(ROOT), as_version=4).cells:
            used |= {n.rstrip(".") for n in re.findall(r"\blk\.([A-Za-z_][\w.]*)", cell.source)}
    unresolved = []
    for name in sorted(used):
        try:
            _resolve(name)
        except AttributeError:
            unresolved.append(name)
    assert unresolved == []
