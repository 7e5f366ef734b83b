"""Lab 06's benchmark and helpers: RNG replay bitwise on tiny, the loader, the costs table, bad input named."""
from __future__ import annotations

import json
import time

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import labkit as lk
from labkit import bench
from labkit.bench.lab06 import SlowLoader, costs, loader_seconds, rng_config, train_losses
from labkit.instruments.harness import per_block, plain


def test_pitfalls_on_tiny_reports_replay_bitwise_and_its_absence_differs():
    figures = bench.pitfalls(lk.sizes("tiny"))
    json.dumps(figures)  # what `bench pitfalls --json` prints
    assert figures["replay_bitwise_equal"] is True and figures["no_replay_differs"] is True
    assert figures["no_replay_max_loss_diff"] > 0
    for key in ("compute_bound_step_ratio", "input_bound_epoch_ratio", "recompute_hidden_share"):
        assert isinstance(figures[key], float)
    assert "pitfalls" in bench.BENCHMARKS


def test_train_losses_leave_model_and_generators_alone_and_repeat_exactly():
    cfg = rng_config(lk.sizes("tiny"))
    model, x = lk.GPTStack(cfg), lk.gpt_input(cfg, requires_grad=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    want = torch.rand(2)
    torch.manual_seed(1)
    first = train_losses(model, x, plain, 3)
    assert torch.equal(torch.rand(2), want)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert first == train_losses(model, x, plain, 3) and len(first) == 3 and first[2] < first[0]
    assert train_losses(model, x, plain, 3, seed=1) != first  # another seed, other dropout masks
    with pytest.raises(ValueError, match="steps=0"):
        train_losses(model, x, plain, 0)


def test_slow_loader_makes_every_batch_in_order_and_takes_its_time():
    x = torch.arange(3.0)
    loader = SlowLoader(x, batches=4, seconds=0.01)
    seen = []
    start = time.perf_counter()
    took = loader_seconds(seen.append, loader)
    assert len(seen) == 4 and all(torch.equal(b, x) for b in seen)
    assert took >= 0.04 and time.perf_counter() - start >= 0.04
    with pytest.raises(ValueError, match="seconds=-1"):
        SlowLoader(x, 1, -1)


def test_costs_show_checkpointing_lowers_a_training_peak_and_not_an_inference_one():
    cfg = lk.GPTConfig(seq=32, batch=4, hidden=32, heads=2, n_layers=4)
    model, x = lk.GPTStack(cfg), lk.gpt_input(cfg, requires_grad=True)
    ckpt = per_block(lambda f, h: checkpoint(f, h, use_reentrant=False))
    train = costs(model, x, {"plain": plain, "checkpointed": ckpt}, repeats=1)
    assert train["checkpointed"][0] < train["plain"][0]
    infer = costs(model, x, {"plain": plain, "checkpointed": ckpt}, training=False, repeats=1)
    assert abs(infer["checkpointed"][0] - infer["plain"][0]) < 0.01 * infer["plain"][0]
