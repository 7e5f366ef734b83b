"""Lab 06's reference against independent oracles: difference against the tensors' bytes, batchnorm_once against a
plain step under PyTorch's checkpoints (every BatchNorm kind, momentum=None too), recommend against a search of
every scheme that fits."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit.instruments.harness import Difference, compare_step, per_block
from labkit.plans import SchemeCost, Situation
from labkit.reference.pitfalls import batchnorm_once, difference, recommend


# ---------------------------------------------------------------- Exercise 6.1: difference
def test_difference_by_bits():
    f = lambda *v: torch.tensor(v)  # noqa: E731
    assert difference("z", f(0.0), f(-0.0)) == Difference("z", False, 0.0, 0.0)
    assert difference("n", f(float("nan")), f(float("nan"))).bitwise
    assert difference("e", f(1.0, 2.0), f(1.0, 2.0)).bitwise
    d = difference("r", f(1.0, 100.0), f(2.0, 100.0))
    assert (d.max_abs, d.max_rel) == (1.0, 0.01)
    assert difference("zero", f(0.0), f(1e-3)).max_rel == math.inf
    assert "dtype" in difference("t", f(1.0), f(1.0).double()).detail
    assert "shape" in difference("s", f(1.0, 2.0).reshape(2, 1), f(1.0, 2.0)).detail
    assert difference("none", None, None).bitwise
    assert difference("one", f(1.0), None).detail == "missing"
    assert difference("b", torch.tensor([True]), torch.tensor([False])).max_abs == 1.0
    assert difference("inf", f(float("inf"), 1.0), f(float("inf"), 3.0)).max_abs == 2.0
    assert str(difference("e", f(1.0), f(1.0))) == "e: bitwise equal"


def test_difference_keeps_the_promises_issue_50_names():
    f16 = lambda *v: torch.tensor(v, dtype=torch.float16)  # noqa: E731
    assert difference("wide", f16(65504.0), f16(-65504.0)).max_abs == 131008  # float64, not float16's inf
    nan = difference("nan", torch.tensor([1.0]), torch.tensor([math.nan]))
    assert not nan.bitwise and math.isnan(nan.max_abs) and math.isnan(nan.max_rel)  # never 0
    t = torch.tensor([1.0, 2.0])
    assert "dtype" in difference("view", t, t.view(torch.int32)).detail  # one element size, two dtypes
    assert "device" in difference("meta", t, t.to("meta")).detail
    assert difference("zero", torch.tensor([0.0]), torch.tensor([-0.0])) == Difference("zero", False, 0.0, 0.0)
    assert difference("int8", torch.tensor([3], dtype=torch.int8), torch.tensor([5], dtype=torch.int8)).max_abs == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=False), min_size=1, max_size=8),
       st.integers(0, 7), st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
def test_difference_is_bitwise_exactly_when_the_bytes_agree(values, at, dtype):
    a = torch.tensor(values).to(dtype)
    b = a.clone()
    assert difference("x", a, b).bitwise
    i = at % a.numel()
    b[i] = -b[i] if not torch.isnan(b[i]) else 1.0
    same_bytes = bytes(a.view(torch.uint8).tolist()) == bytes(b.view(torch.uint8).tolist())
    d = difference("x", a, b)
    assert d.bitwise == same_bytes
    if not d.bitwise and not torch.isnan(a).any():
        assert d.max_abs == (a.double() - b.double())[i].abs().item()  # the one changed element


# ---------------------------------------------------------------- Exercise 6.2: batchnorm_once
class _Net(nn.Module):
    def __init__(self, momentum: float | None) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(3)
            self.blocks = nn.ModuleList([nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3, momentum=momentum)),
                                         nn.Sequential(nn.Flatten(2), nn.BatchNorm1d(3, momentum=momentum))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum 0.1", "cumulative average"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_batchnorm_once_makes_a_checkpointed_step_the_plain_one(momentum, reentrant):
    x = torch.randn(5, 3, 4, 4, generator=torch.Generator().manual_seed(4))
    ckpt = per_block(lambda f, h: checkpoint(f, h, use_reentrant=reentrant))
    unpatched = compare_step(_Net(momentum), x, ckpt, difference=difference)
    assert unpatched.names("buffer") and not all(unpatched[n].bitwise for n in unpatched.names("buffer"))
    patched = compare_step(batchnorm_once(_Net(momentum)), x, ckpt, difference=difference)
    assert patched.ok, str(patched)


# ---------------------------------------------------------------- Exercise 6.3: recommend
def _by_search(s: Situation) -> set[str | None]:
    """Every answer the rule allows, by looking at each scheme: "none" when nothing needs saving or the plain step
    fits, else the fitting schemes of least overhead, then least peak; {None} when none fits."""
    if not s.training or s.schemes["none"].peak_bytes <= s.budget:
        return {"none"}
    fitting = {n: c for n, c in s.schemes.items() if n != "none" and c.peak_bytes <= s.budget}
    if not fitting:
        return {None}
    least = min((c.overhead, c.peak_bytes) for c in fitting.values())
    return {n for n, c in fitting.items() if (c.overhead, c.peak_bytes) == least}


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.integers(1, 100), st.dictionaries(st.sampled_from(["full", "sqrt_n", "selective"]),
       st.tuples(st.integers(1, 100), st.sampled_from([0.0, 0.1, 0.3, 0.5])), max_size=3), st.integers(1, 100))
def test_recommend_takes_what_a_search_of_the_schemes_allows(training, budget, others, plain_peak):
    schemes = {"none": SchemeCost(plain_peak, 0.0), **{n: SchemeCost(p, o) for n, (p, o) in others.items()}}
    s = Situation(training, budget, 1, 1, schemes)
    assert recommend(s) in _by_search(s)
