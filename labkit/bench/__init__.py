"""Benchmarks: `python -m labkit bench NAME [--json]`, and the comparisons notebooks show.

Each benchmark prints figures; none asserts. Memory is tensor bytes from the
meter and ledger; time is a median of alternating A/B runs (labkit.instruments.timing).

Where each lives: a lab's benchmarks that share its helpers sit with them in labNN.py, the module its notebook
calls (`bench segments` is lab03.segments, beside lk.bench.lab03.schedule). A benchmark in a module of its own
is named after it: `bench meter` is meter.py, `bench compile` compile.py (lab 04's knapsack inside
torch.compile), `bench plan` plan.py (with the helpers lab 07 calls as lk.bench.plan.capstone, .rows, ...;
peers.py is the part of it that races PyTorch's own answers), `bench logits` logits.py, `bench parallel`
parallel.py (its prediction: parallel_terms.py), `bench fsdp` fsdp.py. The package binds such a module, not
its function (lk.bench.plan is the module, lk.bench.plan.plan the benchmark): BENCHMARKS says which function
each name runs. A new benchmark adds its line there, and a function in its lab's labNN.py or a module named
after it.
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
from labkit.bench import lab04, lab05, lab06, peers
from labkit.bench.lab05 import roofline
from labkit.bench.lab06 import pitfalls
# the benchmarks named after their modules, bound as modules: lk.bench.plan.capstone, lk.bench.logits.race
from labkit.bench import compile, fsdp, logits, meter, parallel, plan  # noqa: A004  (compile: the module, as named)

__all__ = ["BENCHMARKS", "main", "formula", "formula_configs", "recompute", "recompute_comparison",
           "recompute_config", "RecomputeResult", "segments", "schedule", "optimal", "segments_sweep", "segment_constants",
           "activation_peak", "step_time_ratio", "mlp_chain", "hetero_chain", "policies", "policy_rows", "long_config", "long_stack",
           "roofline", "pitfalls", "fsdp", "meter", "compile", "plan", "logits", "parallel", "peers"]

BENCHMARKS: dict[str, Callable[[], dict[str, Any]]] = {"formula": formula, "meter": meter.meter, "recompute": recompute,
                                                       "segments": segments, "schedule": schedule, "optimal": optimal,
                                                       "policies": policies, "roofline": roofline,
                                                       "pitfalls": pitfalls, "plan": plan.plan,
                                                       "fsdp": fsdp.fsdp, "compile": compile.compile_solvers,
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
