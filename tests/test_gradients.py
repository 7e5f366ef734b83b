"""labkit.instruments.gradients: a way's one-step gradients judged against its reference's (Rule R), on a small
model with dropout, each verdict earned by a planted way: a checkpoint that preserves the RNG (bitwise), one that
does not (wrong: backward draws fresh masks, as compile below budget 1 does, pytorch/pytorch#190758), a forward
scaled by a rounding's worth (rounding), gradients scaled in backward (wrong even with dropout off), a forward that
draws other masks (not judged), and one that cannot run with dropout off (not judged)."""
from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit.instruments.blocks import patched
from labkit.instruments.gradients import CEILING, Judgement, NotJudged, difference, judge, one_step
from labkit.models.gpt import Dropout


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), Dropout(0.3), nn.Linear(32, 16))
                                    for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return x


@pytest.fixture
def net():
    return Net(), torch.randn(8, 16, generator=torch.Generator().manual_seed(1))


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


def _each_block(model: Net, wrap):
    return lambda: patched([(b, wrap(b.forward)) for b in model.blocks])


def test_a_checkpoint_that_replays_the_rng_is_bitwise_and_one_that_draws_again_is_wrong(net):
    model, x = net
    replay = _each_block(model, lambda f: lambda h: checkpoint(f, h, use_reentrant=False))
    assert judge(model, x, loss_fn, replay) == Judgement("bitwise", 0.0)
    redraw = _each_block(model, lambda f: lambda h: checkpoint(f, h, use_reentrant=False, preserve_rng_state=False))
    found = judge(model, x, loss_fn, redraw)
    assert found.gradients == "wrong" and found.difference > 0.1 and found.bound == 0.0, found
    assert "past the rounding bound 0 (10 x 0, the difference with dropout off)" in found.why
    assert all(m.training for m in model.modules())  # the modes put back


def test_a_difference_of_a_roundings_size_with_and_without_dropout_is_rounding(net):
    model, x = net
    nudge = _each_block(model, lambda f: lambda h: f(h) * (1 + 2**-12))
    found = judge(model, x, loss_fn, nudge)
    assert found.gradients == "rounding" and 0 < found.difference <= found.bound <= CEILING, found
    assert found.fields()["gradient_bound"] == found.bound and "why" not in found.fields()


def test_gradients_wrong_even_with_dropout_off_are_wrong_whatever_the_margin(net):
    model, x = net

    def scaled(f):
        def run(h):
            out = f(h)
            out.register_hook(lambda g: g * 1.5)
            return out
        return run
    found = judge(model, x, loss_fn, _each_block(model, scaled))
    assert found.gradients == "wrong" and found.difference > CEILING, found
    assert f"even with dropout off (over {CEILING:g}: no rounding)" in found.why


def test_a_forward_that_draws_other_masks_is_not_judged_and_says_why(net):
    model, x = net

    @contextlib.contextmanager
    def reseeded():
        torch.manual_seed(1)
        yield
    with pytest.raises(NotJudged, match="the forwards differ: its loss .* against its reference's"):
        judge(model, x, loss_fn, reseeded)


def test_a_way_that_differs_and_cannot_run_with_dropout_off_is_not_judged(net):
    model, x = net
    redraw = _each_block(model, lambda f: lambda h: checkpoint(f, h, use_reentrant=False, preserve_rng_state=False))

    @contextlib.contextmanager
    def train_only():
        if not model.training:
            raise RuntimeError("planted: no eval")
        with redraw():
            yield
    with pytest.raises(NotJudged, match="could not be measured with dropout off: RuntimeError: planted: no eval"):
        judge(model, x, loss_fn, train_only)
    assert model.training


def test_difference_is_the_largest_per_parameter_relative_difference():
    a, b = torch.tensor([1.0, -4.0]), torch.tensor([2.0, 1.0])
    assert difference([a, b], [a + torch.tensor([0.0, 1.0]), b]) == 0.25
    assert difference([a, b], [a, b * 3]) == 2.0
    assert difference([None, a], [None, a]) == 0.0
    assert math.isinf(difference([a], [None])) and math.isinf(difference([a], [a[:1]]))
    assert math.isinf(difference([torch.zeros(2)], [torch.ones(2)])) and difference([torch.zeros(2)],
                                                                                      [torch.zeros(2)]) == 0.0
    assert math.isinf(difference([a], [a * float("nan")])) and math.isinf(difference([a], [a, a]))
    json.dumps(Judgement("wrong", math.inf, 0.0, "x").fields())  # JSON has no inf


def test_one_step_runs_from_the_seed_and_leaves_the_generator_and_the_gradients_as_they_were(net):
    model, x = net
    state = torch.get_rng_state()
    one = one_step(model, x, loss_fn, contextlib.nullcontext)
    assert torch.equal(torch.get_rng_state(), state) and all(p.grad is None for p in model.parameters())
    torch.manual_seed(123)  # another state of the generator, and stale gradients: neither changes the step
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    two = one_step(model, x, loss_fn, contextlib.nullcontext, seed=0)
    assert torch.equal(one.loss, two.loss) and all(torch.equal(p, q) for p, q in zip(one.grads, two.grads))
    assert not torch.equal(one_step(model, x, loss_fn, contextlib.nullcontext, seed=1).loss, one.loss)


def test_a_parameter_without_a_gradient_is_bitwise_with_none_and_wrong_against_one(net):
    """A parameter no step uses has no gradient in either (bitwise); a way that cuts a block off backward (its
    parameters get none where the plain step's get one) is wrong, not bitwise."""
    model, x = net
    model.unused = nn.Linear(2, 2)
    assert judge(model, x, loss_fn, contextlib.nullcontext).gradients == "bitwise"
    first = model.blocks[0]
    cut = lambda: patched([(first, lambda h, f=first.forward: f(h).detach())])  # noqa: E731
    found = judge(model, x, loss_fn, cut)
    assert found.gradients == "wrong" and math.isinf(found.difference), found
