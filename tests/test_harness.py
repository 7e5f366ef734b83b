"""The state-equivalence harness: bitwise equality for correct checkpoints, each planted fault flagged by name."""
from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import labkit as lk
from labkit.instruments import harness
from labkit.instruments.blocks import blocks_of, patched, wrap_blocks
from labkit.instruments.harness import Difference, Report, per_block, plain
from labkit.reference.recompute import Recompute, checkpoint as lab02_checkpoint, checkpoint_hooks
from labkit.reference.pitfalls import batchnorm_once, difference, in_backward


def compare_step(*args, **kwargs):
    """The harness comparing with lab 06's difference (Exercise 6.1's reference), as the lab runs it."""
    return harness.compare_step(*args, difference=difference, **kwargs)


NON_REENTRANT = per_block(lambda f, x: checkpoint(f, x, use_reentrant=False))
REENTRANT = per_block(lambda f, x: checkpoint(f, x, use_reentrant=True))
CORRECT = {"torch non-reentrant": NON_REENTRANT, "torch reentrant": REENTRANT,
           "lab 02 checkpoint": per_block(lab02_checkpoint), "lab 02 checkpoint_hooks": per_block(checkpoint_hooks)}


@pytest.fixture(scope="module")
def gpt():
    cfg = lk.GPTConfig(seq=16, batch=2, hidden=32, heads=2, n_layers=2, dropout=0.1)
    return lk.GPTStack(cfg), lk.gpt_input(cfg, requires_grad=True)


@pytest.fixture(scope="module")
def cnn():
    return lk.ConvNet(channels=4, n_blocks=2), torch.randn(4, 4, 6, 6, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("name", CORRECT)
def test_correct_checkpoints_are_bitwise_equal_on_the_gpt_stack_with_dropout(gpt, name):
    report = compare_step(*gpt, CORRECT[name])
    assert report.ok, f"{name}:\n{report}"
    names = report.names()
    assert {"output", "loss", "grad input", "rng cpu", "saved-tensor metadata"} <= set(names)
    assert names[:4] == ["output", "loss", "saved-tensor metadata", "grad input"]  # metadata after output and loss
    assert len(report.names("grad blocks.")) == sum(1 for n, _ in gpt[0].named_parameters() if n.startswith("blocks."))


@pytest.mark.parametrize("scheme", [NON_REENTRANT, REENTRANT], ids=["non-reentrant", "reentrant"])
def test_correct_checkpoints_with_batchnorm_patched_are_bitwise_equal_on_the_cnn(cnn, scheme):
    report = compare_step(*cnn, lambda m, x: scheme(batchnorm_once(m), x))
    assert report.ok, str(report)
    assert report.names("buffer") and all(report[n].bitwise for n in report.names("buffer"))


@pytest.mark.parametrize("scheme", [per_block(lambda f, x: checkpoint(f, x, use_reentrant=False, preserve_rng_state=False)),
                                    per_block(lambda f, x: Recompute.apply(f, x))], ids=["torch-no-rng", "Recompute"])
def test_rng_not_replayed_is_flagged_by_name(gpt, scheme):
    report = compare_step(*gpt, scheme)
    flagged = {d.name for d in report.failures}
    assert "rng cpu" in flagged and "grad input" in flagged
    assert any(n.startswith("grad blocks.0.") for n in flagged)
    assert report["loss"].bitwise  # the forward is the same: only what backward used differs
    assert "another state" in str(report["rng cpu"])


def test_batchnorm_updated_twice_is_flagged_by_name(cnn):
    report = compare_step(*cnn, NON_REENTRANT)
    flagged = {d.name for d in report.failures}
    assert flagged == {f"buffer blocks.{i}.1.{b}" for i in range(2)
                       for b in ("running_mean", "running_var", "num_batches_tracked")}
    assert report["buffer blocks.0.1.num_batches_tracked"].max_abs == 1


def _autocast_when_rerun(f):
    def run(h):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=in_backward()):
            return f(h)
    return run


def test_a_recomputation_under_another_autocast_state_is_flagged_by_name(gpt):
    scheme = per_block(lambda f, x: checkpoint(_autocast_when_rerun(f), x, use_reentrant=False,
                                               determinism_check="none"))
    report = compare_step(*gpt, scheme)
    assert not report.ok and "in backward" in report.error
    meta = report["saved-tensor metadata"]
    assert not meta.bitwise and "bfloat16" in meta.detail


def test_torchs_own_metadata_check_refuses_the_same_fault_and_the_report_says_so(gpt):
    scheme = per_block(lambda f, x: checkpoint(_autocast_when_rerun(f), x, use_reentrant=False))
    report = compare_step(*gpt, scheme)
    assert "CheckpointError" in report.error and "metadata" in report.error
    assert "raised" in str(report)


def test_a_recomputation_summing_in_another_order_differs_in_values_not_metadata(gpt):
    class Halves(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.addmm.default:
                bias, p, q = args[:3]
                k = p.shape[-1] // 2
                return torch.mm(p[:, :k], q[:k]) + torch.mm(p[:, k:], q[k:]) + bias
            return func(*args, **(kwargs or {}))

    scheme = per_block(lambda f, x: checkpoint(f, x, use_reentrant=False,
                                               context_fn=lambda: (nullcontext(), Halves())))
    report = compare_step(*gpt, scheme)
    assert report["saved-tensor metadata"].bitwise and report["loss"].bitwise
    grads = [d for d in report.failures if d.name.startswith("grad")]
    assert grads and all(0 < d.max_rel < 1e-3 and not d.detail for d in grads)
    assert report.within(1e-3) and not report.within(0.0)


def test_the_model_and_the_generators_are_left_as_they_were(gpt):
    model, x = gpt
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    want = torch.rand(2)
    torch.manual_seed(3)
    compare_step(model, x, NON_REENTRANT)
    assert torch.equal(torch.rand(2), want)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert x.grad is None


def test_a_copy_starts_without_the_originals_gradients(cnn):
    model, x = cnn
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    try:
        report = compare_step(model, x, lambda m, x: m(x), baseline=lambda m, x: m(x))
        assert report.ok
        fresh = compare_step(model, x, plain, baseline=plain)
        assert fresh["grad head.weight"].bitwise
    finally:
        model.zero_grad(set_to_none=True)
    # the gradient compared is this step's own, not 7 plus it
    grads = {}
    for start in (None, 7.0):
        for p in model.parameters():
            p.grad = None if start is None else torch.full_like(p, start)
        grads[start] = compare_step(model, x, plain)
    model.zero_grad(set_to_none=True)
    assert grads[None].ok and grads[7.0].ok


def test_a_forward_that_raises_is_reported_and_a_baseline_that_raises_is_an_error(gpt):
    def refuses(model, x):
        raise RuntimeError("no")
    report = compare_step(*gpt, refuses)
    assert report.error == "RuntimeError in forward: no" and not report.ok and not report.items
    with pytest.raises(RuntimeError, match="baseline"):
        compare_step(*gpt, plain, baseline=lambda m, x: m(x).detach())


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        compare_step("model", torch.ones(1), plain)
    with pytest.raises(TypeError, match="x must be a tensor"):
        compare_step(nn.Linear(1, 1), [1.0], plain)
    with pytest.raises(TypeError, match="scheme must be callable"):
        compare_step(nn.Linear(1, 1), torch.ones(1), "plain")
    with pytest.raises(ValueError, match="has no blocks"):
        blocks_of(nn.Linear(2, 2))
    report = compare_step(nn.Linear(2, 2), torch.ones(1, 2), NON_REENTRANT)  # the scheme's error, reported
    assert "ValueError in forward: Linear has no blocks" in str(report)


def test_wrap_blocks_puts_every_forward_back_even_when_the_body_raises():
    chain = lk.MLPChain(lk.MLPConfig(n_layers=3, width=4))
    with pytest.raises(KeyError):
        with wrap_blocks(chain, lambda f, x: f(x) * 0):
            assert torch.equal(chain(torch.ones(1, 4)), torch.zeros(1, 4))
            raise KeyError("inside")
    assert all("forward" not in vars(m) for _, m in blocks_of(chain))


def test_patched_restores_what_it_found_a_patch_made_before_included():
    chain = lk.MLPChain(lk.MLPConfig(n_layers=2, width=4))
    first, second = (m for _, m in blocks_of(chain))
    earlier = lambda x: x + 1  # noqa: E731  (a patch someone made before)
    first.forward = earlier
    with patched([(first, lambda x: x * 0), (second, lambda x: x * 0), (first, lambda x: x * 2)]):
        assert first.forward(torch.ones(1)).item() == 2.0  # the last patch of a module wins inside
    assert vars(first)["forward"] is earlier and "forward" not in vars(second)
    with pytest.raises(TypeError, match="not an nn.Module"):
        with patched([("block", lambda x: x)]):
            pass


def test_the_harness_needs_a_comparison_and_checks_what_it_returns(gpt):
    with pytest.raises(TypeError, match="difference"):
        harness.compare_step(*gpt, plain)
    with pytest.raises(TypeError, match="returned bool"):
        harness.compare_step(*gpt, plain, difference=lambda name, a, b: True)
    for bad in (None, "difference", 3):  # refused by name before any step runs, not failing inside one
        with pytest.raises(TypeError, match=r"compare_step: difference must be callable"):
            harness.compare_step(*gpt, plain, difference=bad)


def test_the_default_loss_is_the_mean_square_of_the_floating_outputs_only():
    """A model may return integer tensors and other values beside its floating outputs (a tuple, as
    transformers blocks do): the default loss reads the floating tensors and nothing else."""
    out = (torch.full((2, 2), 2.0), torch.tensor([5, 7]), None, "meta", [torch.full((3,), 3.0)])
    assert harness._mean_square(out).item() == 4.0 + 9.0


def test_report_reads_by_name_and_says_what_it_compared():
    report = Report([Difference("loss", True), Difference("grad w", False, 1e-7, 1e-6)])
    assert not report.ok and report.failures == [report["grad w"]]
    assert report.within(1e-5) and not report.within(1e-7) and report.within(0.0, ignore=["grad"])
    assert str(report) == "1 of 2 compared items bitwise equal:\n  grad w: max abs 1e-07, max rel 1e-06"
    with pytest.raises(KeyError, match="compared: loss, grad w"):
        report["rng cpu"]


def test_a_stub_s_error_goes_through_and_any_other_refusal_is_a_finding(gpt):
    def stub(model, x):
        raise NotImplementedError("Exercise 2.4: a checkpoint from the two Functions")
    with pytest.raises(NotImplementedError, match="Exercise 2.4"):
        compare_step(*gpt, stub)

    class NoBackward(torch.autograd.Function):  # PyTorch's own NotImplementedError: a fault, reported
        @staticmethod
        def forward(ctx, x):
            return x * 2

    report = compare_step(*gpt, lambda m, x: m(NoBackward.apply(x)))
    assert report.error.startswith("NotImplementedError in backward"), report.error


def test_block_inputs_leaves_no_hook_behind_and_wrapped_refuses_what_it_cannot_call(gpt):
    from labkit.instruments.blocks import block_inputs, wrapped
    model, x = gpt
    blocks = [m for _, m in blocks_of(model)]
    before = [dict(m._forward_hooks) for m in blocks]
    assert len(block_inputs(model, lambda: model(x), "test")) == len(blocks)
    assert [dict(m._forward_hooks) for m in blocks] == before
    with pytest.raises(TypeError, match="wrapped: wrap must be callable"):
        wrapped(blocks, None)
