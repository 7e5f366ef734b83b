"""The checkers' own roofline time, written apart from Exercise 5.1's reference so that the check does not trust
the notebook's copy (nor the student's): the first of the rules atop labkit/instruments/roofline.py, term by
term.

Not part of the `lk` surface; an answer that reaches into labkit.checks is flagged by `labkit grade`.
"""
from __future__ import annotations

from labkit.instruments.ops import OpRecord
from labkit.instruments.roofline import TRANSCENDENTALS_PER_ELEMENT, Ceilings, flops, moves_data, random_draws


def terms(record: OpRecord, ceilings: Ceilings) -> dict[str, float]:
    """Seconds each ceiling allows the op at least: {"compute", "memory", "random"}; all 0 for a view."""
    if not moves_data(record):
        return {"compute": 0.0, "memory": 0.0, "random": 0.0}
    draws = random_draws(record)
    special = TRANSCENDENTALS_PER_ELEMENT.get(record.op, 0) * record.elements
    by_exp = special / ceilings.special_rate if special and ceilings.special_rate else 0.0
    return {"compute": max(flops(record) / ceilings.peak_flops, by_exp),
            "memory": record.bytes_moved / ceilings.peak_bandwidth,
            "random": draws / ceilings.random_rate if draws and ceilings.random_rate else 0.0}


def seconds(record: OpRecord, ceilings: Ceilings) -> float:
    """The roofline time: the largest term."""
    return max(terms(record, ceilings).values())


def mistakes(record: OpRecord, ceilings: Ceilings) -> dict[str, float]:
    """What each named wrong answer gives for the op, so that a wrong time can be matched to its mistake: the terms
    summed, the memory term over a cache's bandwidth (the best, or the one at its footprint), the launch floor
    inside (as a term, or added), an in-place op free, native_dropout alone counted as random, no memory term."""
    t = terms(record, ceilings)
    right = max(t.values())
    launch = ceilings.launch_seconds or 0.0
    cached = max((bw for _, bw in ceilings.bandwidths), default=ceilings.peak_bandwidth)
    only_dropout = {**t, "random": t["random"] if record.op == "native_dropout" else 0.0}
    return {"sum": sum(t.values()),
            "cache": max(t["compute"], t["random"], record.bytes_moved / cached),
            "cache at its footprint": max(t["compute"], t["random"],
                                          record.bytes_moved / ceilings.bandwidth_at(record.bytes_moved)),
            "launch as a term": max(right, launch) if launch else right,
            "launch added": right + launch,
            "in place free": 0.0 if record.in_place else right,
            "native_dropout alone": max(only_dropout.values()),
            "no memory term": max(t["compute"], t["random"])}
