"""Lab 04's benchmark and its pieces, on the tiny profile: what it measures, not how fast."""
from __future__ import annotations

import json

import pytest
import torch

import labkit as lk
import labkit.reference.selective as S
from labkit.bench import lab04 as B
from labkit.reference.recompute import checkpoint_hooks


@pytest.fixture(scope="module")
def stack():
    model, x = B.long_stack(lk.sizes("tiny"))
    ops = lk.ops.trace(model.blocks[0], x, model=model.blocks[0], repeats=1)
    return model, x, ops


def test_policies_bench_prints_its_json(capsys):
    assert lk.bench.main("policies", as_json=True) == 0
    figures = json.loads(capsys.readouterr().out)
    names = [p["name"] for p in figures["policies"]]
    assert names == ["none", "full", "selective", "selective (checkpoint core attention)", "greedy", "knapsack"]
    for p in figures["policies"]:
        assert p["activation_bytes"] == p["bytes_torch"] >= 0, p
        assert p["grads_equal_ours"] and p["grads_equal_torch"], p
        assert p["step_time_ratio"] > 0 and p["predicted_step_time_ratio"] >= 1
    assert figures["policies"][0]["step_time_ratio"] == 1.0
    assert figures["selective_bytes_cut"] > 1 and figures["knapsack_vs_selective_time_ratio"] > 0


def test_kept_bytes_follow_the_model_of_the_planner(stack):
    """Kept after forward = every block's kept outputs + the inputs of blocks after the first + what ln_f saves."""
    model, x, ops = stack
    one = x.numel() * x.element_size()
    ln_f = B.kept_after_forward(model, x, lambda b, y: S.checkpoint_selective(b, y, keep=()))
    ln_f -= (len(model.blocks) - 1) * one  # full recomputation: the later blocks' inputs, then ln_f's saves
    for keep in (frozenset(), S.selective_keep(ops), frozenset(r.key for r in ops if r.op == "addmm")):
        measured = B.kept_after_forward(model, x, lambda b, y, keep=keep: S.checkpoint_selective(b, y, keep=keep))
        predicted = len(model.blocks) * S.kept_bytes(ops, keep) + (len(model.blocks) - 1) * one + ln_f
        assert measured == predicted, sorted(keep)


def test_the_pack_hook_and_the_meter_agree_on_a_plain_step(stack):
    model, x, _ = stack
    plain = lambda b, y: b(y)
    assert B.saved_after_forward(model, x, plain) == B.kept_after_forward(model, x, plain)


def test_none_is_the_reference_and_is_not_timed(stack):
    model, x, ops = stack
    rows = B.policy_rows(model, x, ops, [B.Policy("none")], S.checkpoint_selective, S.torch_policy,
                         checkpoint_hooks, repeats=1)
    assert rows[0]["step_time_ratio"] == rows[0]["predicted_step_time_ratio"] == 1.0


def test_recompute_seconds_counts_what_each_policy_reruns(stack):
    _, _, ops = stack
    total = sum(r.seconds for r in ops)
    assert B.recompute_seconds(ops, B.Policy("none")) == 0
    assert B.recompute_seconds(ops, B.Policy("full", keep=frozenset())) == pytest.approx(total)
    assert B.recompute_seconds(ops, B.Policy("block", region="")) == pytest.approx(total)
    core = sum(r.seconds for r in ops if r.module.startswith("attn.core"))
    assert B.recompute_seconds(ops, B.Policy("core", region="attn.core")) == pytest.approx(core)


def test_a_policy_is_a_key_set_or_a_region_not_both():
    with pytest.raises(ValueError, match="not both"):
        B.Policy("x", keep=frozenset(), region="attn.core")


def test_compiled_runner_refuses_a_budget_outside_0_to_1(stack):
    model, _, _ = stack
    with pytest.raises(ValueError, match="budget=1.5"):
        B.compiled_runner(model, 1.5)


def test_op_keys_count_as_pytorchs_policy_counts(stack):
    """The trace's keys are the keys PyTorch's selective checkpoint asks its policy about, in order."""
    model, x, ops = stack
    seen = []

    def policy(ctx, func, *args, **kwargs):
        if not ctx.is_recompute:
            seen.append(lk.ops.op_key(lk.ops.op_name(func), sum(1 for k in seen if k.split("#")[0] == lk.ops.op_name(func))))
        return torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE

    from functools import partial
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    checkpoint(model.blocks[0], x, use_reentrant=False,
               context_fn=partial(create_selective_checkpoint_contexts, policy)).sum().backward()
    assert seen == [r.key for r in ops]


def test_compiled_runner_keeps_less_under_a_small_budget(stack):
    """torch.compile's partitioner (aot_eager_decomp_partition) honours the budget: fewer saved bytes at 0.1."""
    model, x, _ = stack
    torch._dynamo.reset()
    tight = B.saved_after_forward(model, x, B.compiled_runner(model, 0.1))
    torch._dynamo.reset()
    loose = B.saved_after_forward(model, x, B.compiled_runner(model, 1.0))
    torch._dynamo.reset()
    assert 0 < tight < loose


def test_measuring_what_forward_saves_leaves_no_graph_behind():
    import gc

    model, x = B.long_stack(lk.sizes("tiny"))
    none = lambda blk, y: blk(y)  # noqa: E731
    def graphs() -> set[int]:
        return {id(o) for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.grad_fn is not None}

    gc.collect()
    gc.disable()  # a graph kept alive by a reference cycle would wait for the collector: see it here
    try:
        before = graphs()
        saved = B.saved_after_forward(model, x, none)
        left = graphs() - before
    finally:
        gc.enable()
    assert saved > 0 and not left


def test_compiled_runner_compiles_under_a_meter_rather_than_running_eagerly(stack):
    """Under a meter dynamo runs a compiled function eagerly without a word; compiled_runner steps outside the
    meter and runs its graphs inside, so the budget still acts (fewer bytes saved than eager's) and is seen."""
    model, x, _ = stack
    torch._dynamo.reset()
    alone = B.saved_after_forward(model, x, B.compiled_runner(model, 0.1))
    torch._dynamo.reset()
    with lk.MemoryMeter(history=True) as meter:
        metered = B.saved_after_forward(model, x, B.compiled_runner(model, 0.1))
    torch._dynamo.reset()
    eager = B.saved_after_forward(model, x, lambda block, y: block(y))
    assert metered == alone < eager
    # the compiled graphs' own ops, counted: their dropout decomposed to rand and a comparison (eager's
    # native_dropout would show instead)
    forward = {e.op for e in meter.timeline if e.phase == "forward"}
    assert {"rand", "gt", "bmm"} <= forward and "native_dropout" not in forward, forward


def test_a_verdict_is_given_only_where_every_pair_agrees():
    from labkit.instruments.timing import Comparison

    assert B.verdict(Comparison([1.0, 1.0, 1.0], [1.2, 1.1, 1.3])) == "slower"
    assert B.verdict(Comparison([1.0, 1.0], [0.9, 0.8])) == "faster"
    # the median says 1.17 faster-or-slower, the pairs disagree: no order this run supports (issue 50's x1.17, x0.99)
    assert B.verdict(Comparison([1.0, 1.0, 1.0], [1.17, 0.99, 1.2])) == "not told apart"


def test_masks_are_read_from_eager_and_decomposed_dropout_and_matched_by_shape():
    block = torch.nn.Dropout(0.25)
    x = torch.randn(64, 64)
    eager = B.step_draws(block, x, lambda blk, y: torch.native_dropout(y, 0.25, True)[0])
    (mask,) = B.dropout_masks(eager, "forward", 0.25)
    assert mask.dtype == torch.bool and B.dropout_masks(eager, "backward", 0.25) == []
    decomposed = B.step_draws(block, x, lambda blk, y: y * (torch.rand(y.shape) > 0.25))  # as the decomposition
    (drawn,) = B.dropout_masks(decomposed, "forward", 0.25)
    torch.manual_seed(0)
    assert torch.equal(drawn, torch.rand(64, 64) > 0.25)
    assert B.match_masks([mask, drawn], [mask]) == (True, 1.0)
    same, least = B.match_masks([mask], [drawn])
    assert not same and 0.5 < least < 0.75  # two independent masks of p = 0.25 agree on 62.5%
    assert least == B.agreement(mask, drawn)
    with pytest.raises(ValueError, match="no drawn mask of shape"):
        B.match_masks([mask], [torch.ones(3, dtype=torch.bool)])


def test_relative_difference_is_the_farthest_tensor_against_its_own_size():
    a, b = [torch.tensor([1.0, 2.0]), torch.tensor([100.0])], [torch.tensor([1.0, 1.0]), torch.tensor([101.0])]
    assert B.relative_difference(a, b) == pytest.approx(1.0)  # the first: off by 1 against its largest, 1
    assert B.relative_difference([torch.zeros(2)], [torch.zeros(2)]) == 0.0


def test_a_compiled_block_below_budget_1_draws_again_in_backward():
    """Lab 04's block on tiny (pytorch/pytorch#190758): budget 1 draws no random op in backward, 0.1 draws each
    dropout again; the loss is the same, the gradients are not."""
    from labkit.instruments.compiled import Compiled

    model, x = lk.bench.long_stack(lk.sizes("tiny"))
    block = model.blocks[0]
    at = {budget: Compiled(block.forward, budget) for budget in (1.0, 0.1)}
    masks = {b: {phase: B.dropout_masks(B.step_draws(block, x, lambda blk, y, c=c: c(y)), phase, 0.1)
                 for phase in ("forward", "backward")} for b, c in at.items()}
    assert len(masks[1.0]["forward"]) == 3 and masks[1.0]["backward"] == []
    assert len(masks[0.1]["backward"]) == 3
    assert B.match_masks(masks[0.1]["forward"], masks[0.1]["backward"])[0] is False
    (loss_1, one), (loss_low, low) = (B.block_step(block, x, lambda blk, y, c=c: c(y)) for c in at.values())
    assert torch.equal(loss_1, loss_low) and B.relative_difference(low, one) > 0.01
