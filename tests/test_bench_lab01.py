"""Lab 01's benchmark: the ledger against Korthikanti's formula, from MLP- to attention-dominated blocks."""
from __future__ import annotations

import json

from labkit import bench


def test_formula_bench_reconciles_within_15_percent_from_mlp_to_attention_dominated():
    figures = bench.formula()
    ratios = [r["s"] / r["h"] for r in figures["configs"]]
    assert len(ratios) >= 3 and min(ratios) < 0.1 and max(ratios) > 4
    assert figures["max_rel_error"] <= 0.15
    for row in figures["configs"]:
        # the whole residual is the two LayerNorms' mean and rstd: 2 x 2 x (s*b) bfloat16 values
        assert row["measured_bytes"] - row["formula_bytes"] == 2 * 2 * row["s"] * row["b"] * 2
    json.dumps(figures)
