"""Exercises 5.1 and 5.2: the roofline time of an op, and pricing ops by a cost model."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import astuple, replace
from typing import Any

import torch

from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote, trap
from labkit.checks.lab05 import hints as H
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.instruments.ops import OpRecord, trace
from labkit.checks.lab05.oracle import mistakes, seconds, terms
from labkit.instruments.roofline import Ceilings

MACHINE = Ceilings("checker", torch.float32, peak_flops=1e11, peak_bandwidth=1e10, random_rate=1e8, special_rate=1e9)
SPEC = Ceilings("spec sheet", torch.bfloat16, peak_flops=1e14, peak_bandwidth=2e12, random_rate=None)
# measured as lab 05's ceilings are: caches faster than main memory at small footprints, and a launch floor
CACHED = Ceilings("checker, measured", torch.float32, peak_flops=1e11, peak_bandwidth=1e10, random_rate=1e8,
                  special_rate=1e9, launch_seconds=1e-5, bandwidths=((10 ** 5, 1e11), (10 ** 7, 4e10), (10 ** 9, 1e10)))


def _record(op: str, flops: int, nbytes: int, elements: int, random: bool = False, view: bool = False,
            in_place: bool = False) -> OpRecord:
    return OpRecord(key=f"{op}#0", op=op, module="", flops=flops, bytes_moved=nbytes,
                    output_bytes=0 if view or in_place else nbytes // 2, elements=elements, is_view=view,
                    in_place=in_place, random=random, seconds=1e-3)


def _traced() -> list[OpRecord]:
    cfg = GPTConfig(seq=16, batch=2, hidden=16, heads=2, n_layers=1, dropout=0.1, seed=3)
    block = GPTStack(cfg).blocks[0]
    with torch.random.fork_rng(devices=[]):
        return trace(block, gpt_input(cfg, requires_grad=True), model=block, time=False)


def _cases() -> list[tuple[str, OpRecord, Ceilings]]:
    """(what, record, ceilings): each term the largest in turn, a view, a random op on a spec sheet, ceilings with
    caches and a launch floor, in-place ops (one of them drawing), and in grading drawn ones."""
    made = [("a matmul, compute-bound", _record("mm", 10 ** 10, 10 ** 6, 10 ** 5), MACHINE),
            ("an add, memory-bound", _record("add", 0, 10 ** 8, 10 ** 7), MACHINE),
            ("a softmax, bound by exp", _record("_softmax", 0, 10 ** 5, 10 ** 7), MACHINE),
            ("a dropout, bound by its draws", _record("native_dropout", 0, 10 ** 6, 10 ** 7, random=True), MACHINE),
            ("a dropout on a spec sheet (no random limit)",
             _record("native_dropout", 0, 10 ** 6, 10 ** 7, random=True), SPEC),
            ("a view", _record("view", 0, 10 ** 6, 10 ** 5, view=True), MACHINE),
            ("an add within a cache's reach", _record("add", 0, 10 ** 6, 10 ** 5), CACHED),
            ("a one-element add, shorter than a launch", _record("add", 0, 8, 1), CACHED),
            ("an in-place div_", _record("div_", 0, 10 ** 6, 125_000, in_place=True), MACHINE),
            ("bernoulli_, in place, drawing", _record("bernoulli_", 0, 4 * 10 ** 6, 10 ** 6, random=True,
                                                      in_place=True), CACHED)]
    drawn = hidden("5.1")  # labkit grade: records and ceilings the student never saw
    if drawn is not None:
        for i in range(10):
            op = drawn.choice(["mm", "add", "_softmax", "gelu", "native_dropout", "mul", "bernoulli_", "div_"])
            rec = _record(op, 10 ** drawn.randint(0, 11) if op == "mm" else 0, 10 ** drawn.randint(2, 9),
                          10 ** drawn.randint(2, 8), random=op in ("native_dropout", "bernoulli_"),
                          in_place=op.endswith("_"))
            rates = [drawn.choice([None, 10 ** drawn.uniform(7, 11)]) for _ in range(2)]
            peak = 10 ** drawn.uniform(9, 12)
            caches = drawn.choice([(), ((10 ** 4, peak * 8), (10 ** 6, peak * 3), (10 ** 10, peak))])
            c = Ceilings("drawn", torch.float32, peak_flops=10 ** drawn.uniform(9, 14), peak_bandwidth=peak,
                         random_rate=rates[0], special_rate=rates[1],
                         launch_seconds=drawn.choice([None, 10 ** drawn.uniform(-7, -4)]), bandwidths=caches)
            made.append((f"a drawn {op} record", rec, c))
    return made + [(f"{r.key} of a traced GPT block", r, c) for r in _traced() for c in (MACHINE, SPEC, CACHED)]


MISTAKES = {"sum": H.RT_MAX, "cache": H.RT_DRAM, "cache at its footprint": H.RT_DRAM, "launch as a term": H.RT_LAUNCH,
            "launch added": H.RT_LAUNCH, "in place free": H.RT_IN_PLACE, "native_dropout alone": H.RT_RANDOM_OPS,
            "no memory term": H.RT_MEMORY}  # oracle.mistakes' names -> the hint of each


def _hint(r: OpRecord, c: Ceilings, got: float, want: float) -> str:
    if r.is_view or want == 0:
        return H.RT_VIEW
    for name, value in mistakes(r, c).items():  # a named mistake's time, where it differs from the right one
        if math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-15) and \
                not math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-15):
            return MISTAKES[name]
    t = terms(r, c)
    top = max(t, key=t.__getitem__)
    return {"compute": H.RT_COMPUTE, "memory": H.RT_MEMORY, "random": H.RT_RANDOM}[top]


@remote
def ex_5_1(roofline_seconds: Callable[..., Any]) -> None:
    """Exercise 5.1: roofline_seconds equals the checkers' own roofline time (oracle.py) on every case."""
    __tracebackhide__ = True
    need_callable("5.1", "roofline_seconds", roofline_seconds)
    cases = _cases()
    for what, r, c in cases:
        label = f"roofline_seconds(<{what}>, <{c.device} ceilings>)"
        with trap("5.1", label, H.RT_RANDOM if r.random and c.random_rate is None else H.RT_SPEC,
                  known=(("moves no data", H.RT_VIEW),)):  # labkit.instruments.roofline's flops refuses a view
            got = roofline_seconds(r, c)
        want = seconds(r, c)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise CheckFailure("5.1", label, "a float of seconds", f"{type(got).__name__} {got!r:.60}", H.RT_SPEC)
        if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15):
            raise CheckFailure("5.1", label, f"{want:.6g} s", f"{got:.6g} s", _hint(r, c, got, want))
    passed("5.1", f"roofline_seconds matches the roofline on {len(cases)} ops: each term the largest in turn, "
                  "views free (in-place ops not), every drawing op random, no random limit on a spec sheet, main "
                  "memory's bandwidth and no launch term where the ceilings hold caches and a launch floor")


@remote
def ex_5_2(price: Callable[..., Any]) -> None:
    """Exercise 5.2: price replaces each record's seconds by seconds_of(record) and leaves the originals alone."""
    __tracebackhide__ = True
    need_callable("5.2", "price", price)
    rng = hidden("5.2")  # labkit grade: a cost model, and which records the stopwatch timed, the student never saw
    timed = (lambda i: i % 2 == 1) if rng is None else (lambda i: rng.random() < 0.5)  # noqa: E731
    # records as a trace gives them: untimed (seconds None, time=False) or timed (the stopwatch's seconds)
    ops = [replace(r, seconds=1e-3 * (1 + i % 7)) if timed(i) else r for i, r in enumerate(_traced())]
    before = [astuple(r) for r in ops]
    scale, offset = (1e-6, 0.0) if rng is None else (rng.uniform(1e-9, 1e-5), rng.uniform(0, 1e-4))
    seconds_of = lambda r: scale * (len(r.key) + r.elements) + offset  # noqa: E731  (differs from op to op)
    with trap("5.2", "price(ops, seconds_of)", H.PRICE_SPEC):
        got = price(ops, seconds_of)
    if [astuple(r) for r in ops] != before:
        raise CheckFailure("5.2", "the records passed in, after price", "unchanged", "changed", H.PRICE_ORIGINALS)
    if not isinstance(got, list) or len(got) != len(ops) or not all(isinstance(r, OpRecord) for r in got):
        raise CheckFailure("5.2", "price(ops, seconds_of)", f"a list of {len(ops)} OpRecords",
                           f"{type(got).__name__} {got!r:.80}", H.PRICE_SPEC)
    for r, g in zip(ops, got):
        if g.key != r.key:
            raise CheckFailure("5.2", "the order of the priced records", r.key, g.key, H.PRICE_SPEC)
        if g != replace(r, seconds=seconds_of(r)):
            kept = r.seconds is not None and g.seconds == r.seconds and g == r
            raise CheckFailure("5.2", f"the priced record of {r.key}" + (" (timed)" if r.seconds is not None else ""),
                               f"seconds={seconds_of(r):.3g}, all else as before", f"seconds={g.seconds!r}",
                               H.PRICE_TIMED if kept else H.PRICE_SECONDS)
    timed_n = sum(r.seconds is not None for r in ops)
    passed("5.2", f"price gives {len(ops)} new records ({timed_n} of them timed) with seconds from the cost model; "
                  "the originals unchanged")
