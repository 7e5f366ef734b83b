"""Lab 05's benchmark: each op of one GPT block on the machine's measured roofline, predicted against measured."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.bench.lab04 import long_stack
from labkit.instruments.ops import OpRecord, trace
from labkit.env.profile import Sizes, sizes
from labkit.instruments.roofline import Ceilings, achieved, bound, intensity, measure_ceilings, moves_data, predict_seconds

LEAST_SECONDS = 1e-3  # ops faster than this are judged by no bar: timer and cache noise swamp them


def op_rows(records: Sequence[OpRecord], ceilings: Ceilings) -> list[dict[str, Any]]:
    """One row per op that moves data: where it sits on the roofline and its predicted and measured time."""
    rows = []
    for r in filter(moves_data, records):
        rows.append({"name": r.key, "module": r.module, "intensity": intensity(r),
                     "achieved": achieved(r),
                     "predicted_s": predict_seconds(r, ceilings), "measured_s": r.seconds,
                     "bound": bound(r, ceilings)})
    return rows


def worst_ratio(rows: Sequence[dict[str, Any]], least_seconds: float = LEAST_SECONDS) -> float | None:
    """The largest max(predicted/measured, measured/predicted) over ops measured at `least_seconds` or more;
    None when no op takes that long."""
    ratios = [max(r["predicted_s"] / r["measured_s"], r["measured_s"] / r["predicted_s"])
              for r in rows if r["measured_s"] >= least_seconds]
    return max(ratios, default=None)


def roofline(size: Sizes | None = None) -> dict[str, Any]:
    """The non-view ops of one block of the long-sequence stack (lab 04's) on the measured roofline."""
    size = size or sizes()
    model, x = long_stack(size)
    cfg, block = model.cfg, model.blocks[0]  # in training mode: its dropouts draw
    records = trace(block, x, model=block, repeats=size.repeats)
    ceilings = measure_ceilings(size.device, cfg.dtype, size)
    rows = op_rows(records, ceilings)
    return {"peak_flops": ceilings.peak_flops, "peak_bandwidth": ceilings.peak_bandwidth,
            "random_rate": ceilings.random_rate, "special_rate": ceilings.special_rate, "ops": rows,
            "worst_ratio": worst_ratio(rows),
            "config": {"s": cfg.seq, "b": cfg.batch, "h": cfg.hidden, "a": cfg.heads,
                       "dtype": str(cfg.dtype).replace("torch.", ""), "profile": size.name}}
