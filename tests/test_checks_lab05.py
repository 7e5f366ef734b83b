"""Tests for the checkers of 05_roofline: they pass the reference and catch each planted bug with its own hint."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import labkit.reference.roofline as R
from labkit.instruments.ops import OpRecord
from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.checks.base import hidden_cases
from labkit.checks.lab05 import hints as H
from labkit.instruments.roofline import Ceilings, moves_data, random_draws


# Checker strength (docs/maintainers.md, "Checker strength"): tools/mutants.py labkit/reference/roofline.py
# tests/test_checks_lab05.py kills every mutant of the module (10 sites: --sample 10 --seed 1 and --sample 30
# --seed 2 both run all of them), `rand = draws / c.random_rate` with `*` for `/` among them; no survivor.
def _fails(check, *args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


@pytest.mark.parametrize("seed", [None, 7], ids=["notebook", "graded"])
@pytest.mark.parametrize("check, answer", [(checks.ex_5_1, R.roofline_seconds), (checks.ex_5_2, R.price)],
                         ids=["5.1", "5.2"])
def test_the_reference_passes_in_the_notebook_and_in_grading(check, answer, seed, capsys):
    """The reference passes its checker, on the public cases and on hidden ones (as `labkit grade` draws them)."""
    with hidden_cases(seed):
        check(answer)
    assert capsys.readouterr().out.startswith(f"[ex {check.__name__[3:].replace('_', '.')}] passed")


def _roofline(combine=max, memory=True, random=True, none_rate_ok=True, views_free=True, compute=True,
              bandwidth="peak", launch=None, in_place_free=False, only_dropout=False, rate_times=False):
    def bug(r, c):
        if views_free and not moves_data(r) or in_place_free and r.in_place:
            return 0.0
        draws = random_draws(r) if not only_dropout else r.elements * 0.5 if r.op == "native_dropout" else 0.0
        if not random or not draws:
            rand = 0.0
        elif c.random_rate is None:
            rand = draws / c.random_rate if not none_rate_ok else 0.0
        else:
            rand = draws * c.random_rate if rate_times else draws / c.random_rate
        comp = R.compute_seconds(r, c) if compute else R.flops(r) / c.peak_flops
        bw = {"peak": c.peak_bandwidth, "at": c.bandwidth_at(r.bytes_moved),
              "best": max((b for _, b in c.bandwidths), default=c.peak_bandwidth)}[bandwidth]
        terms = [comp, r.bytes_moved / bw if memory else 0.0, rand]
        if launch == "max":
            terms.append(c.launch_seconds or 0.0)
        seconds = combine(terms)
        return seconds + (c.launch_seconds or 0.0) if launch == "sum" else seconds
    return bug


@pytest.mark.parametrize("bug, hint", [
    (_roofline(combine=sum), H.RT_MAX), (_roofline(memory=False), H.RT_MEMORY),
    (_roofline(random=False), H.RT_RANDOM), (_roofline(none_rate_ok=False), H.RT_RANDOM),
    (_roofline(views_free=False), H.RT_VIEW), (_roofline(compute=False), H.RT_COMPUTE),
    (_roofline(bandwidth="at"), H.RT_DRAM), (_roofline(bandwidth="best"), H.RT_DRAM),
    (_roofline(launch="max"), H.RT_LAUNCH), (_roofline(launch="sum"), H.RT_LAUNCH),
    (_roofline(in_place_free=True), H.RT_IN_PLACE), (_roofline(only_dropout=True), H.RT_RANDOM_OPS),
    (_roofline(rate_times=True), H.RT_RANDOM),
], ids=["sum", "no-memory", "no-random", "none-rate", "views", "flops-only", "cache-bandwidth", "best-bandwidth",
        "launch-floor", "launch-added", "in-place-free", "only-native-dropout", "draws-times-rate"])
def test_ex_5_1_catches(bug, hint):
    assert _fails(checks.ex_5_1, bug).hint == hint


def _mutating_price(ops, seconds_of):
    for r in ops:
        object.__setattr__(r, "seconds", seconds_of(r))
    return list(ops)


def test_each_mistake_is_caught_in_grading_too():
    """The hidden cases carry every kind of public case (caches, launch floors, in-place and drawing ops)."""
    with hidden_cases(3):
        assert _fails(checks.ex_5_1, _roofline(in_place_free=True)).hint == H.RT_IN_PLACE
        assert _fails(checks.ex_5_2, _keeps_measured).hint == H.PRICE_TIMED


def _keeps_measured(ops, seconds_of):
    """Issue 50: a record's measured seconds kept; the checker's records were all untimed, so it passed."""
    return [replace(r, seconds=r.seconds if r.seconds is not None else seconds_of(r)) for r in ops]


@pytest.mark.parametrize("bug, hint", [
    (_keeps_measured, H.PRICE_TIMED),
    (_mutating_price, H.PRICE_ORIGINALS),
    (lambda ops, seconds_of: [replace(r, seconds=seconds_of(r), flops=0) for r in ops], H.PRICE_SECONDS),
    (lambda ops, seconds_of: [replace(r, seconds=seconds_of(r)) for r in reversed(ops)], H.PRICE_SPEC),
    (lambda ops, seconds_of: tuple(replace(r, seconds=seconds_of(r)) for r in ops), H.PRICE_SPEC),
], ids=["keeps-measured", "mutates", "other-field", "reversed", "tuple"])
def test_ex_5_2_catches(bug, hint):
    assert _fails(checks.ex_5_2, bug).hint == hint


def test_flops_only_prices_by_pytorchs_count_alone():
    """The given cost model lab 05 sets beside the roofline: PyTorch's FLOP count over the peak, elementwise free."""
    c = Ceilings("c", torch.float32, peak_flops=4e11, peak_bandwidth=1e10, random_rate=None)
    seconds_of = R.flops_only(c)
    mm = OpRecord(key="mm#0", op="mm", module="", flops=8 * 10 ** 9, bytes_moved=10 ** 6, output_bytes=10 ** 5,
                  elements=10 ** 4, is_view=False, in_place=False, random=False, seconds=None)
    assert seconds_of(mm) == pytest.approx(0.02)
    assert seconds_of(replace(mm, op="gelu", flops=0)) == 0.0
