"""Lab 05's benchmark: each op of one GPT block on the machine's measured roofline, predicted against measured.

The prediction is the lab's own roofline time (Exercise 5.1, labkit.labs.roofline: the reference answer in the kit,
the student's in a handed-out one); nothing here writes it again.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from labkit.bench.lab04 import long_stack
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.ops import OpRecord, trace
from labkit.models.layers import dtype_name
from labkit.instruments.roofline import Ceilings, achieved, intensity, measure_ceilings, moves_data, random_draws

LEAST_SECONDS = 1e-3  # ops faster than this are judged by no bar: timer and cache noise swamp them
Pricing = Callable[[OpRecord, Ceilings], float]


def bound(record: OpRecord, ceilings: Ceilings, seconds: float, compute_seconds: Pricing) -> str:
    """Which ceiling sets an op's roofline time `seconds`: "compute" when its compute term reaches it, else
    "memory" when its bytes over the bandwidth do, else "random" when its draws over the generator's rate do;
    "none" when no term reaches it (a time that is not the largest of the terms: a roofline_seconds to fix)."""
    if compute_seconds(record, ceilings) >= seconds:
        return "compute"
    if record.bytes_moved / ceilings.peak_bandwidth >= seconds:
        return "memory"
    draws = random_draws(record)
    return "random" if draws and ceilings.random_rate and draws / ceilings.random_rate >= seconds else "none"


def op_rows(records: Sequence[OpRecord], ceilings: Ceilings, roofline_seconds: Pricing,
            compute_seconds: Pricing) -> list[dict[str, Any]]:
    """One row per op that moves data: where it sits on the roofline, its time by `roofline_seconds` (lab 05's
    Exercise 5.1) against the measured one, and the ceiling that sets it (`compute_seconds`: the lab's compute
    term)."""
    rows = []
    for r in filter(moves_data, records):
        predicted = roofline_seconds(r, ceilings)
        rows.append({"name": r.key, "module": r.module, "intensity": intensity(r), "achieved": achieved(r),
                     "predicted_s": predicted, "measured_s": r.seconds,
                     "bound": bound(r, ceilings, predicted, compute_seconds)})
    return rows


def sides(records: Sequence[OpRecord], by_dtype: dict[str, Ceilings]) -> list[dict[str, Any]]:
    """Each op that moves data, its intensity, and for each precision of `by_dtype` (measure_ceilings_by_dtype)
    the side of that precision's ridge it sits on: "compute" at or right of it, "memory" left of it."""
    return [{"name": r.key, "intensity": intensity(r),
             **{name: "compute" if intensity(r) >= c.ridge else "memory" for name, c in by_dtype.items()}}
            for r in filter(moves_data, records)]


def worst_ratio(rows: Sequence[dict[str, Any]], least_seconds: float = LEAST_SECONDS) -> float | None:
    """The largest max(predicted/measured, measured/predicted) over ops measured at `least_seconds` or more;
    None when no op takes that long."""
    ratios = [max(r["predicted_s"] / r["measured_s"], r["measured_s"] / r["predicted_s"])
              for r in rows if r["measured_s"] >= least_seconds]
    return max(ratios, default=None)


def roofline(size: Sizes | None = None) -> dict[str, Any]:
    """The non-view ops of one block of the long-sequence stack (lab 04's) on the measured roofline."""
    from labkit.labs.roofline import compute_seconds, roofline_seconds  # lab 05's (the student's, handed out)

    size = size or sizes()
    model, x = long_stack(size)
    cfg, block = model.cfg, model.blocks[0]  # in training mode: its dropouts draw
    records = trace(block, x, model=block, repeats=size.repeats)
    # the dtype its matmuls run in; the other ceilings are measured in it too (on CUDA, autocast runs softmax and
    # its dropout in float32, whose exp and random rates may differ)
    ceilings = measure_ceilings(size.device, cfg.autocast or cfg.dtype, size)
    rows = op_rows(records, ceilings, roofline_seconds, compute_seconds)
    return {"peak_flops": ceilings.peak_flops, "peak_bandwidth": ceilings.peak_bandwidth,
            "random_rate": ceilings.random_rate, "special_rate": ceilings.special_rate, "ops": rows,
            "worst_ratio": worst_ratio(rows),
            "config": {"s": cfg.seq, "b": cfg.batch, "h": cfg.hidden, "a": cfg.heads,
                       "dtype": dtype_name(cfg.dtype), "profile": size.name, "autocast": dtype_name(cfg.autocast),
                       "ceilings_dtype": dtype_name(ceilings.dtype)}}
