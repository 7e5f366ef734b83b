"""The explorers of labs 01, 04, 05 and 07 (lk.widgets): each builds headless, redraws what its controls choose,
and refuses values it cannot draw; their static twins (lk.plots) draw what the lab shows. (Lab 02's player and
lab 03's explorer are tested beside their figures: test_lifetimes.py, test_bench_lab03.py; every explorer is
moved in a real browser by test_browser.py.)"""
from __future__ import annotations

import pytest

import labkit as lk
import labkit.widgets as W
from labkit.plans import BlockCosts, Option, Profile, peak_of, step_ratio
from labkit.reference.capstone import best_plan
from labkit.reference.selective import kept_bytes, knapsack_keep, recompute_cost, selective_keep


def _recording(monkeypatch, name):
    calls = []
    real = getattr(W, name)
    monkeypatch.setattr(W, name, lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    return calls


def test_the_crossover_explorer_redraws_at_the_batch_and_sequence_chosen(monkeypatch):
    calls = _recording(monkeypatch, "crossover_at")
    states = {"bf16": 2**24, "mixed": 2**25}
    box = lk.widgets.crossover_explorer(1000.0, 2.0, 4, states, batch=4, seq=256, max_seq=4096)
    batch, seq = box.children[0].children
    batch.value, seq.value = 8, 1024
    assert [a[4:6] for a, _ in calls] == [(4, 256), (8, 256), (8, 1024)]
    with pytest.raises(ValueError, match="need 1 <= batch"):
        lk.widgets.crossover_explorer(1.0, 1.0, 4, states, batch=0, seq=8)


def test_the_crossover_figure_says_where_the_activations_overtake_each_state():
    # alpha s + beta s^2 = state at s = 100 for alpha = 100, beta = 1, state = 20,000 (batch as measured)
    fig = lk.plots.crossover_at(100.0, 1.0, 4, {"bf16": 20_000}, 4, 50, 1024)
    assert "overtaken at seq 100" in fig.axes[0].get_title()
    assert "0.38x bf16's state" in fig.axes[0].get_title()  # (100*50 + 2500) / 20000


@pytest.fixture(scope="module")
def block_ops():
    cfg = lk.sizes("tiny").gpt(n_layers=1)
    model = lk.GPTStack(cfg)
    x = lk.gpt_input(cfg, requires_grad=True)
    return lk.ops.trace(model.blocks[0], x, model=model.blocks[0], repeats=1)


def test_the_keep_explorer_redraws_the_policy_at_the_budget_chosen(monkeypatch, block_ops):
    calls = _recording(monkeypatch, "keep_at")
    budget = kept_bytes(block_ops, selective_keep(block_ops))
    box = lk.widgets.keep_explorer(block_ops, knapsack_keep, kept_bytes, recompute_cost, budget, points=5)
    (slider,) = box.children[:1]
    slider.value = 0
    (ops, front, b, chosen, kept, seconds), _ = calls[-1]
    assert b == 0 and chosen == knapsack_keep(block_ops, 0) and kept == kept_bytes(block_ops, chosen) <= 0
    assert [f[0] for f in front] == sorted(f[0] for f in front) and front[-1][1] >= front[0][1]
    assert seconds == recompute_cost(block_ops, chosen) >= calls[0][0][5]  # nothing kept: the most recomputed
    with pytest.raises(ValueError, match="must be from 0 to"):
        lk.widgets.keep_explorer(block_ops, knapsack_keep, kept_bytes, recompute_cost, 1 << 60, points=3)


def test_the_roofline_explorer_redraws_under_the_roof_chosen(monkeypatch, block_ops):
    calls = _recording(monkeypatch, "roofline")
    roofs = {spec.name: spec.ceilings() for spec in list(lk.roofline.GPU_SPECS.values())[:2]}
    box = lk.widgets.roofline_explorer(roofs, block_ops)
    (pick,) = box.children[:1]
    pick.value = list(roofs)[1]
    assert [a[0] for a, _ in calls] == list(roofs.values())
    assert "ops left of it (memory-bound)" in calls[-1][1]["title"]
    with pytest.raises(ValueError, match="at least one"):
        lk.widgets.roofline_explorer({}, block_ops)


def _profile(n=4) -> Profile:
    return Profile(tuple(BlockCosts(6 * 2**20, 2**18, 0.01, {"selective": Option(4 * 2**20, 6 * 2**20, 0.004)},
                                    beside=2**20) for _ in range(n)), 2**22, 2**21, 0.1)


def test_the_plan_explorer_plans_at_the_budget_chosen_and_names_the_largest_batch(monkeypatch):
    calls = _recording(monkeypatch, "plan_at")
    prof = _profile()
    budget = peak_of(lk.plans.scheme_plan("none", 4), prof) - 2**20
    box = lk.widgets.plan_explorer(prof, best_plan, budget, peak_of, step_ratio, batch_of=lambda b: b // 2**20)
    (slider,) = box.children[:1]
    slider.value = slider.min  # the profile's floor, below its base: nothing fits
    first, last = calls[0][0], calls[-1][0]
    assert first[1] == best_plan(prof, budget) and first[3] == peak_of(first[1], prof) <= budget
    assert first[5] == budget // 2**20
    assert last[1] is None and last[3] is None and last[2] == prof.floor
    fig = lk.plots.plan_at(prof, None, 2**20)
    assert "no plan fits" in fig.axes[0].get_title()
    fig = lk.plots.plan_at(prof, first[1], budget, first[3], first[4], 7)
    assert "largest batch 7" in fig.axes[0].get_title() and len(fig.axes[0].patches) >= 4
