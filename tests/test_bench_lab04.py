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
