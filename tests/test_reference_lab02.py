"""Lab 02's reference code (labkit.reference.recompute) against PyTorch, at the edges PyTorch's own tests cover.

Each test is held against a plain, un-checkpointed run or against torch.utils.checkpoint: gradients bitwise
where the same ops rerun, errors where PyTorch raises, and the ledger where bytes are kept.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from labkit.instruments import saved_tensors
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.reference import recompute as ref

OURS = {"checkpoint": ref.checkpoint, "checkpoint_hooks": ref.checkpoint_hooks}
TORCH = {"torch reentrant": lambda fn, *a, **k: torch_checkpoint(fn, *a, use_reentrant=True, **k),
         "torch non-reentrant": lambda fn, *a, **k: torch_checkpoint(fn, *a, use_reentrant=False, **k)}


class Net(nn.Module):
    """pre -> h -> fn(h) -> out; fn has parameters, dropout and a tanh that saves its output."""

    def __init__(self, p: float = 0.0, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pre = nn.Linear(6, 8, dtype=dtype)
        self.w1 = nn.Linear(8, 16, dtype=dtype)
        self.w2 = nn.Linear(16, 8, dtype=dtype)
        self.p = p
        self.x = torch.randn(5, 6, dtype=dtype, requires_grad=True)

    def fn(self, h: torch.Tensor) -> torch.Tensor:
        a = torch.tanh(self.w1(h))
        return self.w2(nn.functional.dropout(a, self.p, training=True) if self.p else a)

    def fn2(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.tanh(self.w1(h))
        return self.w2(a), a

    def grads(self) -> list[torch.Tensor | None]:
        return [p.grad for p in self.parameters()] + [self.x.grad]


def _equal(a: list, b: list) -> bool:
    return all(x is not None and y is not None and torch.equal(x, y) for x, y in zip(a, b))


def _plain_and(ckpt, run) -> tuple[list, list]:
    """Gradients of run(net, fn_caller) plainly and through ckpt, from the same weights and seed."""
    out = []
    for call in (lambda f, *a, **k: f(*a, **k), ckpt):
        net = Net()
        torch.manual_seed(1)
        run(net, call)
        out.append([None if g is None else g.clone() for g in net.grads()])
    return out[0], out[1]


# ---------------------------------------------------------------- A2: inputs are autograd saved tensors
@pytest.mark.parametrize("name", [*OURS, *TORCH])
def test_an_input_changed_in_place_after_forward_is_refused(name):
    ckpt = {**OURS, **TORCH}[name]
    net = Net()
    h = net.pre(net.x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = ckpt(net.fn, h)
    h.add_(1)  # the recompute would start from the changed h: silently wrong gradients
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_the_ledger_sees_checkpoint_hooks_inputs_as_torch_non_reentrant():
    cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dropout=0.1)
    block = GPTStack(cfg, final_norm=False).blocks[0]
    x = gpt_input(cfg, requires_grad=True)
    ours = saved_tensors(lambda t: ref.checkpoint_hooks(block, t), x).total_bytes
    theirs = saved_tensors(lambda t: torch_checkpoint(block, t, use_reentrant=False), x).total_bytes
    assert ours == theirs == x.untyped_storage().nbytes()


def test_checkpoint_hooks_releases_its_inputs_with_the_graph():
    import gc
    import weakref

    net = Net()
    h = net.pre(net.x)
    y = ref.checkpoint_hooks(net.fn, h)
    ref_h = weakref.ref(h.untyped_storage())
    del h
    gc.collect()
    assert ref_h() is not None  # kept for the recompute
    y.sum().backward()
    del y
    gc.collect()
    assert ref_h() is None


# ---------------------------------------------------------------- A3: every backward finds what it needs
def _two_backwards(net, call):
    out, a = call(net.fn2, net.pre(net.x))
    (a * a).sum().backward(retain_graph=True)  # reaches part of fn only
    out.sum().backward()  # needs what the first backward already used


def _grad_then_backward(net, call):
    y = call(net.fn, net.pre(net.x))
    torch.autograd.grad(y.sum(), [net.w2.weight], retain_graph=True)  # a partial backward first: w2's node only
    y.sum().backward()


@pytest.mark.parametrize("run", [_two_backwards, _grad_then_backward], ids=["two outputs", "grad, then backward"])
def test_checkpoint_hooks_serves_every_backward(run):
    want, got = _plain_and(ref.checkpoint_hooks, run)
    assert _equal(want, got)


def test_checkpoint_hooks_reruns_once_per_backward():
    net = Net()
    calls = []

    def fn(h):
        calls.append(torch.is_grad_enabled())
        return net.fn2(h)

    out, a = ref.checkpoint_hooks(fn, net.pre(net.x))
    out.sum().backward(retain_graph=True)
    assert len(calls) == 2
    (a * a).sum().backward()
    assert calls == [True, True, True]


# ---------------------------------------------------------------- A4: autocast is replayed
def _autocast_step(net, call):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = call(net.fn, net.pre(net.x))
    y.float().square().sum().backward()  # backward outside autocast, as PyTorch recommends


@pytest.mark.parametrize("name", OURS)
def test_autocast_is_replayed_in_the_recompute(name):
    want, got = _plain_and(OURS[name], _autocast_step)
    assert _equal(want, got)


def test_restored_autocast_sets_and_restores():
    with torch.autocast("cpu", dtype=torch.float16):
        state = ref.stash_autocast(torch.zeros(1))
    assert state.settings["cpu"] == (True, torch.float16)
    with ref.restored_autocast(state):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float16
    assert not torch.is_autocast_enabled("cpu")
    off = ref.stash_autocast()
    with torch.autocast("cpu", dtype=torch.bfloat16), ref.restored_autocast(off):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32


# ---------------------------------------------------------------- A5: .grad() is refused, with no side effects
def test_checkpoint_refuses_autograd_grad_and_touches_no_grad():
    net = Net()
    y = ref.checkpoint(net.fn, net.pre(net.x))
    with pytest.raises(ref.CheckpointError, match=r"autograd.grad\(\).*checkpoint_hooks"):
        torch.autograd.grad(y.sum(), [net.x])
    assert all(g is None for g in net.grads())
    y = ref.checkpoint(net.fn, net.pre(net.x))
    with pytest.raises(ref.CheckpointError, match="inputs="):
        y.sum().backward(inputs=[net.x])
    assert all(g is None for g in net.grads())


def test_torch_reentrant_refuses_autograd_grad_too():
    net = Net()
    y = TORCH["torch reentrant"](net.fn, net.pre(net.x))
    with pytest.raises(RuntimeError, match="incompatible with .grad()"):
        torch.autograd.grad(y.sum(), [net.x])


# ---------------------------------------------------------------- A6: second derivatives
# backward(create_graph=True) warns of a parameter-gradient cycle; these functions have no parameters
pytestmark = pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")


def _grad_of_grad(ckpt):
    x = torch.linspace(-1, 1, 7, dtype=torch.float64, requires_grad=True)
    f = lambda t: torch.sin(torch.exp(torch.sin(t)))  # noqa: E731
    y = ckpt(f, x) + x ** 3  # a part outside the checkpoint, so a wrong answer is not an error
    y.sum().backward(create_graph=True)
    g, x.grad = x.grad, None
    g.sum().backward()
    return x.grad


def test_checkpoint_refuses_create_graph():
    with pytest.raises(ref.CheckpointError, match="create_graph=True"):
        _grad_of_grad(ref.checkpoint)


def test_checkpoint_hooks_second_derivative_is_exact_where_torch_reentrant_is_silently_wrong():
    want = _grad_of_grad(lambda f, x: f(x))
    assert torch.equal(_grad_of_grad(ref.checkpoint_hooks), want)
    assert torch.equal(_grad_of_grad(TORCH["torch non-reentrant"]), want)
    assert not torch.allclose(_grad_of_grad(TORCH["torch reentrant"]), want)  # no error, wrong numbers


# ---------------------------------------------------------------- A7: non-tensor outputs
def _t5_like(net, call):
    """A block returning (hidden, position_bias, None), as Hugging Face's T5 blocks do, and an int."""
    def block(h):
        hidden = net.fn(h)
        return hidden, torch.tanh(h).sum(-1), None, 3

    hidden, bias, nothing, three = call(block, net.pre(net.x))
    assert nothing is None and three == 3
    (hidden.sum() + bias.square().sum()).backward()


@pytest.mark.parametrize("name", OURS)
def test_non_tensor_outputs(name):
    want, got = _plain_and(OURS[name], _t5_like)
    assert _equal(want, got)


# ---------------------------------------------------------------- the properties the lab keeps
@pytest.mark.parametrize("name", OURS)
def test_dropout_gradients_bitwise_and_fn_runs_twice(name):
    calls = []

    def run(net, call):
        net.p = 0.5

        def fn(h):
            calls.append(1)
            return net.fn(h)

        call(fn, net.pre(net.x)).sum().backward()

    want, got = _plain_and(OURS[name], run)
    assert _equal(want, got) and len(calls) == 1 + 2


def test_frozen_inputs_warn():
    net = Net()
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        ref.checkpoint(net.fn, torch.randn(5, 8))


def test_the_warning_points_at_the_caller_and_stays_quiet_under_no_grad():
    net = Net()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref.checkpoint(net.fn, torch.randn(5, 8))  # this line
        with torch.no_grad():
            ref.checkpoint(net.fn, torch.randn(5, 8))
    assert len(caught) == 1 and caught[0].filename == __file__


def test_checkpoint_hooks_trains_the_block_behind_a_frozen_input():
    """The frozen-embedding case: no input requires grad, the parameters inside fn still get exact gradients."""
    def run(net, call):
        call(net.fn, torch.linspace(-1, 1, 40).reshape(5, 8)).square().sum().backward()

    want, got = _plain_and(ref.checkpoint_hooks, run)
    assert _equal(want[2:6], got[2:6])  # w1 and w2, weight and bias
