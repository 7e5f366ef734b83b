"""`labkit bench plan` (lab 07): its keys, and on the tiny profile the bars it prints for the cpu one."""
from __future__ import annotations

import json

import pytest

import labkit as lk
from labkit import bench, plots
from labkit.bench import lab07


@pytest.fixture(scope="module")
def figures():
    return bench.plan()


def test_plan_bench_prints_its_json_keys(figures):
    json.dumps(figures)
    assert set(figures) == {"machine", "budget_bytes", "plan", "predicted_peak", "measured_peak", "predicted_step_ratio",
                            "measured_step_ratio", "fits", "step_ratio", "largest_batch", "planner_200_blocks_seconds",
                            "budgets", "settings", "peers", "head_to_head", "sac_milp_fed", "sac_milp_plain_peak",
                            "planner_over_best_peer_max",
                            "planner_within_3_percent_of_best_peer", "foreign"}
    assert set(figures["fits"]) == set(figures["step_ratio"]) == {"planner", *lk.plans.SCHEMES}
    assert set(figures["largest_batch"]) == {"planner", *lk.plans.SCHEMES}


def test_the_plan_fits_where_keeping_everything_does_not(figures):
    assert figures["fits"]["none"] is False and figures["fits"]["full"] is True and figures["fits"]["planner"] is True
    assert figures["measured_peak"] <= figures["budget_bytes"]
    assert abs(figures["predicted_peak"] - figures["measured_peak"]) <= 0.25 * figures["measured_peak"]
    plan = [lk.plans.Step(*s) for s in figures["plan"]]
    assert lk.plans.check_plan(plan, lab07.capstone(lk.sizes(), repeats=1).profile) == plan


def test_the_largest_batches_grow_as_schemes_keep_less(figures):
    largest = figures["largest_batch"]
    assert largest["none"] < lk.sizes().batch <= largest["full"]  # at the bench's budget, plain does not fit
    assert largest["full"] >= max(largest[s] for s in ("sqrt_n", "selective"))
    assert largest["planner"] >= largest["full"]  # full is one of the plans it weighs, and predicted to the byte


def test_the_planners_speed_is_measured_on_200_blocks_of_four_ways(figures):
    profile = lab07.random_profile(200)
    assert len(profile.blocks) == 200 and all(set(b.ways()) == {"keep", "selective", "offload"} for b in profile.blocks)
    assert figures["planner_200_blocks_seconds"] > 0


def test_the_largest_batch_figure_draws_a_bar_per_scheme():
    rows = [{"name": "none", "batch": 0, "seconds_per_sample": float("nan")},
            {"name": "full", "batch": 6, "seconds_per_sample": 0.01}]
    fig = plots.largest_batches(rows, 2**20)
    assert [len(ax.patches) for ax in fig.axes] == [2, 2]


def test_the_peers_table_has_every_method_at_five_budgets_each_measured(figures):
    """The issue's bar, in form (its figures are the cpu profile's: `labkit bench plan`): at least five budgets,
    four methods besides the planner, compile's budget and sac_milp among them; every row measured; PyTorch's
    checkpoints train bit for bit; the head-to-head ratio wherever a peer fits."""
    budgets, table = figures["budgets"], figures["peers"]
    assert len(budgets) >= 5
    methods = {r["method"] for r in table} - {"planner"}
    assert len(methods) >= 4 and {"compile budget", "sac_milp", "torch full", "checkpoint_sequential"} <= methods
    for budget in budgets:
        here = [r for r in table if r["budget"] == budget]
        assert here[0]["method"] == "planner" and here[0]["fits"] and here[0]["measured_peak"] <= budget
        assert all(r["fits"] == (r["measured_peak"] <= budget) for r in here if "error" not in r)
    assert all(r["bitwise"] for r in figures["settings"] if r["method"] in ("planner", "torch full",
                                                                           "checkpoint_sequential") and "error" not in r)
    for row in figures["head_to_head"]:
        fitting = [r for r in table if r["budget"] == row["budget"] and r["method"] != "planner" and r["fits"]]
        assert (row["planner_over_best_peer"] is None) == (not fitting)
    from labkit.bench.peers import bar_holds

    assert figures["planner_within_3_percent_of_best_peer"] == bar_holds(figures["head_to_head"])


def test_hugging_face_models_are_planned_fit_and_train_bitwise(figures):
    pytest.importorskip("transformers", reason="transformers is not installed: the foreign models are not run")
    for name, found in figures["foreign"].items():
        assert found["fits"] and found["measured_peak"] <= found["budget"], name
        assert found["trains_bitwise"] is True, name
        assert {r["method"] for r in found["peers"]} >= {"planner", "torch full", "compile budget"}, name
