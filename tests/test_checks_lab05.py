"""Tests for the checkers of 05_roofline: they pass the reference and catch each planted bug with its own hint."""
from __future__ import annotations

from dataclasses import replace

import pytest

import labkit.reference.roofline as R
from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.checks.lab05 import hints as H
from labkit.instruments.roofline import moves_data, random_draws


def _fails(check, *args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


def _roofline(combine=max, memory=True, random=True, none_rate_ok=True, views_free=True, compute=True):
    def bug(r, c):
        if views_free and not moves_data(r):
            return 0.0
        draws = random_draws(r)
        if not random or not draws:
            rand = 0.0
        elif c.random_rate is None:
            rand = draws / c.random_rate if not none_rate_ok else 0.0
        else:
            rand = draws / c.random_rate
        comp = R.compute_seconds(r, c) if compute else R.flops(r) / c.peak_flops
        terms = [comp, r.bytes_moved / c.peak_bandwidth if memory else 0.0, rand]
        return combine(terms)
    return bug


@pytest.mark.parametrize("bug, hint", [
    (_roofline(combine=sum), H.RT_MAX), (_roofline(memory=False), H.RT_MEMORY),
    (_roofline(random=False), H.RT_RANDOM), (_roofline(none_rate_ok=False), H.RT_RANDOM),
    (_roofline(views_free=False), H.RT_VIEW), (_roofline(compute=False), H.RT_COMPUTE),
], ids=["sum", "no-memory", "no-random", "none-rate", "views", "flops-only"])
def test_ex_5_1_catches(bug, hint):
    assert _fails(checks.ex_5_1, bug).hint == hint


def _mutating_price(ops, seconds_of):
    for r in ops:
        object.__setattr__(r, "seconds", seconds_of(r))
    return list(ops)


@pytest.mark.parametrize("bug, hint", [
    (_mutating_price, H.PRICE_ORIGINALS),
    (lambda ops, seconds_of: [replace(r, seconds=seconds_of(r), flops=0) for r in ops], H.PRICE_SECONDS),
    (lambda ops, seconds_of: [replace(r, seconds=seconds_of(r)) for r in reversed(ops)], H.PRICE_SPEC),
    (lambda ops, seconds_of: tuple(replace(r, seconds=seconds_of(r)) for r in ops), H.PRICE_SPEC),
], ids=["mutates", "other-field", "reversed", "tuple"])
def test_ex_5_2_catches(bug, hint):
    assert _fails(checks.ex_5_2, bug).hint == hint
