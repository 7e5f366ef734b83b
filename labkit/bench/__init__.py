"""Benchmarks: `python -m labkit bench NAME [--json]`, and the comparisons notebooks show.

Each benchmark prints figures; none asserts. Memory is tensor bytes from the
meter and ledger; time is a median of alternating A/B runs (labkit.instruments.timing).
One module per lab's benchmarks, named after its lab (lab 07's sharding, which
runs processes, is fsdp.py); a new one adds a module and a line in BENCHMARKS.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

from labkit.bench.lab01 import formula, formula_configs
from labkit.bench.lab02 import RecomputeResult, recompute, recompute_comparison, recompute_config
from labkit.bench.lab03 import (
    activation_peak, hetero_chain, mlp_chain, optimal, schedule, segment_constants, segments, segments_sweep,
    step_time_ratio,
)
from labkit.bench.lab04 import long_config, long_stack, policies, policy_rows
from labkit.bench import lab04, lab05, lab06, lab07, peers
from labkit.bench.lab05 import roofline
from labkit.bench.lab06 import pitfalls
from labkit.bench.lab07 import plan
from labkit.bench.solvers import compile_solvers
from labkit.bench import logits  # the module: lk.bench.logits.chunked_head_loss, as lab 07 names it
from labkit.bench.fsdp import fsdp
from labkit.bench import parallel  # the module: lk.bench.parallel.parallel and .table, as lab 07 names them
from labkit.bench.overhead import meter

__all__ = ["BENCHMARKS", "main", "formula", "formula_configs", "meter", "recompute", "recompute_comparison",
           "recompute_config", "RecomputeResult", "segments", "schedule", "optimal", "segments_sweep", "segment_constants",
           "activation_peak", "step_time_ratio", "mlp_chain", "hetero_chain", "policies", "policy_rows", "long_config", "long_stack",
           "roofline", "pitfalls", "plan", "fsdp", "compile_solvers"]

BENCHMARKS: dict[str, Callable[[], dict[str, Any]]] = {"formula": formula, "meter": meter, "recompute": recompute,
                                                       "segments": segments, "schedule": schedule, "optimal": optimal,
                                                       "policies": policies, "roofline": roofline,
                                                       "pitfalls": pitfalls, "plan": plan,
                                                       "fsdp": fsdp, "compile": compile_solvers,
                                                       "logits": logits.logits, "parallel": parallel.parallel}


def main(name: str, as_json: bool = False) -> int:
    """Run benchmark `name`; print one JSON object (--json) or readable lines."""
    if name not in BENCHMARKS:
        print(f"labkit bench: unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}, or grade", file=sys.stderr)
        return 2
    figures = BENCHMARKS[name]()
    if as_json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0
