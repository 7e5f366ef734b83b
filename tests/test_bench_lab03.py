"""Lab 03's benchmarks on the tiny profile: the keys the issue names, and the bars' meaning."""
from __future__ import annotations

import json

import pytest

import labkit as lk
from labkit.bench import lab03


def test_segments_bench_keys_and_an_exact_model():
    figures = lab03.segments(lk.sizes("tiny"))
    json.dumps(figures)
    assert set(figures) == {"n_layers", "none_bytes", "rows", "best_segments", "max_rel_error"}
    assert set(figures["rows"][0]) == {"segments", "measured_bytes", "predicted_bytes", "step_time_ratio"}
    n = figures["n_layers"]
    assert figures["max_rel_error"] <= 0.10
    assert n ** 0.5 / 2 <= figures["best_segments"] <= 2 * n ** 0.5
    best = next(r for r in figures["rows"] if r["segments"] == figures["best_segments"])
    assert best["measured_bytes"] < figures["none_bytes"]


def test_schedule_bench_keys_and_bars():
    figures = lab03.schedule(lk.sizes("tiny"))
    json.dumps(figures)
    assert set(figures) == {"budget_bytes", "optimal", "sqrt_n", "solve_seconds_n1000"}
    for name in ("optimal", "sqrt_n"):
        assert {"measured_bytes", "recompute_cost", "recompute_s"} <= set(figures[name])
        assert figures[name]["measured_bytes"] <= figures["budget_bytes"]
    assert figures["optimal"]["recompute_cost"] < figures["sqrt_n"]["recompute_cost"]


def test_optimal_bench_bars(monkeypatch):
    monkeypatch.setattr(lab03, "_revolve_rows", lambda: {"revolve": "held by tests/test_persistent.py"})
    figures = lab03.optimal(lk.sizes("tiny"))
    json.dumps(figures)
    for bar in ("exact", "bitwise", "optimal_bounds_the_others", "matches_exhaustive",
                "least_budget_at_most_recursive_peak"):
        assert figures[bar] is True, bar
    rows = figures["rows"]
    assert {r["name"].split(" k=")[0] for r in rows} == {"optimal", "recursive", "sqrt_n", "one-level planner"}
    assert all(r["measured_peak"] == r["predicted_peak"] for r in rows)
    mine = [r for r in rows if r["name"] == "optimal"]
    assert all(r["measured_peak"] <= r["budget"] for r in mine) and mine[0]["budget"] == figures["least_budget"]
    costs = [r["forward_cost"] for r in mine]  # more memory never costs more forwards
    assert costs == sorted(costs, reverse=True) and costs[-1] == 1.0


def test_revolve_rows_on_a_small_grid():
    pytest.importorskip("checkpoint_schedules", reason="checkpoint-schedules is not installed")
    rows = lab03._revolve_rows(longest=10, most=3)
    assert rows == {"revolve_cases": 27, "matches_revolve": True, "mixed_within_bounds": True,
                    "mixed_equal": rows["mixed_equal"]} and 0 <= rows["mixed_equal"] < 27


def test_u_curves_and_schedule_figures():
    sweep = lab03.segments_sweep(lambda ls, h, k, c: h, lambda n, k, **c: 1, lambda f, h: f(h), lk.sizes("tiny"), 4,
                                 [1, 2], progress=False, timed=[2])
    assert sweep["rows"][0]["step_time_ratio"] is None and sweep["rows"][1]["step_time_ratio"] is not None
    figs = [lk.plots.u_curves({4: sweep}), lk.plots.pareto({"a": [(1, 1.0), (2, 0.5)]}),
            lk.plots.segments_figure(8, 3, lambda n, k, a, b, e: k * a + -(-n // k) * b + e, 1, 1)]
    assert all(len(f.axes) >= 1 for f in figs)


def test_segments_explorer_builds_and_follows_its_sliders():
    model = lambda n, k, a, b, e: k * a + -(-n // k) * b + e  # noqa: E731
    box = lk.widgets.segments_explorer(model, 1, 1, 0, n_layers=16, segments=4, n_max=64)
    n_slider, k_slider = box.children[0].children
    n_slider.value = 9
    assert k_slider.max == 9
    k_slider.value = 3
    assert n_slider.value == 9 and k_slider.value == 3
    import pytest
    with pytest.raises(ValueError, match="need 1 <= segments"):
        lk.widgets.segments_explorer(model, 1, 1, n_layers=4, segments=5)


def test_an_unfinished_exercise_fails_before_the_sweep_times_anything(monkeypatch):
    """Run All on a student notebook: segment_peak's or checkpoint_segments' stub fails at once, not after the
    first timing of the sweep."""
    monkeypatch.setattr(lab03, "step_time_ratio", lambda *a, **k: pytest.fail("timed before the stub failed"))

    def stub(*args, **kwargs):
        raise NotImplementedError("Exercise 3.2: the model")
    for peak, segments in ((stub, lambda ls, h, k, c: h), (lambda n, k, **c: 1, stub)):
        with pytest.raises(NotImplementedError, match="Exercise 3.2"):
            lab03.segments_sweep(segments, peak, lambda f, h: f(h), lk.sizes("tiny"), 4, [1, 2], progress=False)
