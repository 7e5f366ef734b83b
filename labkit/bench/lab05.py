"""Lab 05's benchmark: each op of one GPT block on the machine's measured roofline, predicted against measured.

The prediction is the lab's own roofline time (Exercise 5.1, labkit.labs.roofline: the reference answer in the kit,
the student's in a handed-out one); nothing here writes it again. It is given the ceilings as the op's replay meets
them (Ceilings.hot: the bandwidth at its footprint, since the trace replays it on the same buffers), and an op takes
at least one launch (Ceilings.launch_seconds): predicted = max(roofline time, launch). The larger, not the sum: on
CUDA the host queues the next launch while the device runs this one, so a replay costs the slower of the two (on a
CPU they add, and the larger is still a bound from below).

The bar holds every op priced to that bound from below: measured >= predicted / BAR. An op slower than its bound is
reported (slowest_ratio), not judged: a roofline says what an op cannot beat, not that a kernel reaches it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from labkit.bench.lab04 import long_stack
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.ops import OpRecord, trace
from labkit.instruments.roofline import (Ceilings, achieved, intensity, measure_ceilings, measure_launch, moves_data,
                                         random_draws)
from labkit.instruments.timing import timing_method
from labkit.models.layers import dtype_name

BAR = 2.0  # no op may beat its predicted time by more than this factor (cache and timer noise on a shared CPU)
Pricing = Callable[[OpRecord, Ceilings], float]


def bound(record: OpRecord, ceilings: Ceilings, seconds: float, compute_seconds: Pricing) -> str:
    """Which ceiling sets an op's predicted time `seconds`: "compute" when its compute term reaches it, else
    "memory" when its bytes over the bandwidth do, else "random" when its draws over the generator's rate do,
    else "launch" when one launch does; "none" when nothing reaches it (a time that is not the largest of the
    terms: a roofline_seconds to fix)."""
    if compute_seconds(record, ceilings) >= seconds:
        return "compute"
    if record.bytes_moved / ceilings.peak_bandwidth >= seconds:
        return "memory"
    draws = random_draws(record)
    if draws and ceilings.random_rate and draws / ceilings.random_rate >= seconds:
        return "random"
    return "launch" if ceilings.launch_seconds and ceilings.launch_seconds >= seconds else "none"


WHY_FASTER = {  # each ceiling, where an op's replay beat the prediction it sets: each a measurement
    "compute": "its bound is the matmul peak or the exp rate, each the best median of a few sizes, measured once",
    "memory": "its bound is a copy's bandwidth at the measured footprint nearest its bytes, a median measured once",
    "random": "its bound is native_dropout's draws per second at the measuring size, a median measured once",
    "launch": "its bound is one launch, the median of one-element adds",
    "none": "no ceiling sets its predicted time: a roofline_seconds to fix",
}


def why_faster(bound_name: str) -> str:
    """Why an op bound by `bound_name` can replay faster than predicted: its ceiling is a measurement too, taken
    at other sizes and another moment of a machine shared with other work (the bar allows BAR for that)."""
    if bound_name not in WHY_FASTER:
        raise ValueError(f"why_faster: bound {bound_name!r}; allowed: {', '.join(WHY_FASTER)}")
    return f"{WHY_FASTER[bound_name]}, and this replay came out faster (the bar allows up to {BAR:g}x)"


def predicted_seconds(record: OpRecord, ceilings: Ceilings, roofline_seconds: Pricing) -> float:
    """The least time a replay of `record` takes: the roofline's on the ceilings it meets hot, or one launch."""
    return max(roofline_seconds(record, ceilings.hot(record.bytes_moved)), ceilings.launch_seconds or 0.0)


def op_rows(records: Sequence[OpRecord], ceilings: Ceilings, roofline_seconds: Pricing,
            compute_seconds: Pricing) -> list[dict[str, Any]]:
    """One row per op that moves data: where it sits on the roofline, its predicted time (predicted_seconds, with
    `roofline_seconds`: lab 05's Exercise 5.1) against the measured one, and the ceiling that sets it
    (`compute_seconds`: the lab's compute term)."""
    rows = []
    for r in filter(moves_data, records):
        predicted = predicted_seconds(r, ceilings, roofline_seconds)
        rows.append({"name": r.key, "module": r.module, "intensity": intensity(r), "achieved": achieved(r),
                     "predicted_s": predicted, "measured_s": r.seconds,
                     "bound": bound(r, ceilings.hot(r.bytes_moved), predicted, compute_seconds)})
    return rows


def sides(records: Sequence[OpRecord], by_dtype: dict[str, Ceilings]) -> list[dict[str, Any]]:
    """Each op of a float32 trace that moves data, its intensity (float32's), and for each precision of `by_dtype`
    (measure_ceilings_by_dtype, or a spec sheet's) the side of that precision's ridge it sits on, the op run in
    that precision: its intensity scaled by 4 / the precision's bytes per element (an op in bfloat16 moves half
    the bytes: twice float32's intensity; TF32 keeps float32's), "compute" at or right of the ridge, "memory"
    left of it."""
    def side(r: OpRecord, c: Ceilings) -> str:
        return "compute" if intensity(r) * 4 / c.dtype.itemsize >= c.ridge else "memory"

    return [{"name": r.key, "intensity": intensity(r), **{name: side(r, c) for name, c in by_dtype.items()}}
            for r in filter(moves_data, records)]


def _checked(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the bar can judge: every one, refused by name if a time is missing or not positive."""
    for r in rows:
        for key in ("predicted_s", "measured_s"):
            if not (isinstance(r[key], float) and r[key] > 0):
                raise ValueError(f"roofline bar: {r['name']} has {key}={r[key]!r}; every op priced needs a positive "
                                 "time in seconds (trace with time=True)")
    return list(rows)


def worst_ratio(rows: Sequence[dict[str, Any]]) -> float | None:
    """The largest predicted / measured over every row: how far the op that beat its bound most beat it (the bar
    is at most BAR); None when there is no row."""
    return max((r["predicted_s"] / r["measured_s"] for r in _checked(rows)), default=None)


def slowest_ratio(rows: Sequence[dict[str, Any]]) -> float | None:
    """The largest measured / predicted over every row (reported, not judged); None when there is no row."""
    return max((r["measured_s"] / r["predicted_s"] for r in _checked(rows)), default=None)


def bar_holds(rows: Sequence[dict[str, Any]], bar: float = BAR) -> bool:
    """Whether every row has measured >= predicted / `bar`, and there is at least one: a bar that checked no op
    has not held."""
    worst = worst_ratio(rows)
    return worst is not None and worst <= bar


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
    alone, _ = measure_launch(size.device)
    return {"peak_flops": ceilings.peak_flops, "peak_bandwidth": ceilings.peak_bandwidth,
            "bandwidths": [list(b) for b in ceilings.bandwidths], "random_rate": ceilings.random_rate,
            "special_rate": ceilings.special_rate, "launch_seconds": ceilings.launch_seconds,
            "one_launch_alone_seconds": alone, "timing": timing_method(size.device), "ops": rows,
            "bar": f"every op priced: measured >= predicted / {BAR:g}", "ops_checked": len(rows),
            "worst_ratio": worst_ratio(rows), "slowest_ratio": slowest_ratio(rows), "bar_holds": bar_holds(rows),
            "config": {"s": cfg.seq, "b": cfg.batch, "h": cfg.hidden, "a": cfg.heads,
                       "dtype": dtype_name(cfg.dtype), "profile": size.name, "autocast": dtype_name(cfg.autocast),
                       "ceilings_dtype": dtype_name(ceilings.dtype)}}
