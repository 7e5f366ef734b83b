"""The fsdp bench: two ranks and four combinations held to the bars and to one process's losses, the wrong
order of checkpoint and fully_shard, and teardown: no child process outlives the bench, even when a rank
raises, dies or hangs."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.bench.fsdp import COMBINATIONS, RANKS, RTOL, build, fsdp, fsdp_config, micro_batch, wrong_order
from labkit.instruments.meter import MemoryMeter
from labkit.env.ranks import Fault, RankError, launch

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="needs torch.distributed with gloo")


def mid_sizes() -> lk.Sizes:
    """A stack where parameters/state and activations both count (the tiny one is all state)."""
    return dataclasses.replace(lk.sizes("tiny"), seq=64, batch=4, hidden=64, heads=2, gpt_layers=4)


def block_bytes(size: lk.Sizes) -> int:
    """One block's parameter bytes: the most a sharded peak varies by between runs (Note 4 of the module)."""
    return lk.parameter_bytes(lk.GPTStack(fsdp_config(size)).blocks[0])


@pytest.fixture
def no_child_left():
    """Fails the test when a child process of this one is alive after it that was not before."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running()]
    assert not left, f"child processes left running: {left}"


def assert_gone(pids: tuple[int, ...]) -> None:
    """The ranks' processes are ended and reaped (not even zombies of this process are left)."""
    assert len(pids) == RANKS
    ours = {p.pid for p in psutil.Process().children()}
    assert not ours & set(pids)


@pytest.mark.slow
def test_every_rank_holds_the_bars_and_the_losses_match_one_process(no_child_left):
    figures = fsdp(mid_sizes())
    json.dumps(figures)  # what `bench fsdp --json` prints
    assert figures["ranks"] == RANKS and set(figures["per_rank_peak_bytes"]) == set(COMBINATIONS)
    peaks = figures["per_rank_peak_bytes"]
    for rank in range(RANKS):
        plain, ckpt, sharded, both = (peaks[c][rank] for c in COMBINATIONS)
        assert both < sharded < plain and both < ckpt < plain, (rank, peaks)
    assert figures["bars_hold"] is True
    assert figures["losses_match"] is True
    assert max(figures["loss_max_rel_diff"].values()) <= RTOL
    state, acts = figures["per_rank_state_bytes"], figures["per_rank_activation_bytes"]
    for rank in range(RANKS):  # sharding halves the state; checkpointing cuts the activations
        assert abs(RANKS * state["sharded"][rank] - state["plain"][rank]) <= 0.01 * state["plain"][rank]
        assert acts["checkpointed"][rank] < acts["plain"][rank] / 4
    gathers = figures["per_rank_all_gathers"]  # checkpointing rides on the backward's all-gather: it adds none
    n = figures["config"]["n_layers"]
    for rank in range(RANKS):
        assert gathers["plain"][rank] == gathers["checkpointed"][rank] == 0
        assert gathers["sharded"][rank] == gathers["sharded_checkpointed"][rank] == 2 * n + 1, gathers
        scatters = figures["per_rank_reduce_scatters"]  # one per group in backward, recomputed or not
        assert scatters["sharded"][rank] == scatters["sharded_checkpointed"][rank] == n + 1, scatters


def test_a_failing_rank_is_named_and_no_child_survives(no_child_left):
    with pytest.raises(RankError, match=r"rank 1 failed: RuntimeError: fault injected on rank 1") as err:
        fsdp(lk.sizes("tiny"), fault=Fault(rank=1))
    assert err.value.rank == 1 and "Traceback" in err.value.detail
    assert_gone(err.value.pids)


def test_a_hanging_rank_times_out_and_no_child_survives(no_child_left):
    with pytest.raises(RankError, match=r"sent nothing within timeout=6 s") as err:
        fsdp(lk.sizes("tiny"), fault=Fault(rank=1, hang=True), timeout=6)
    assert_gone(err.value.pids)


def _die_on_rank_1(rank: int, ranks: int) -> dict:
    if rank == 1:
        os._exit(3)  # no exception, no message: as a rank killed for memory
    dist.barrier()
    return {}


def test_a_rank_that_dies_silently_is_named_with_its_exit_code(no_child_left):
    with pytest.raises(RankError, match=r"rank 1 exited with code 3 before sending") as err:
        launch(_die_on_rank_1, ranks=RANKS, timeout=30)
    assert err.value.rank == 1
    assert_gone(err.value.pids)


@pytest.mark.slow
def test_the_wrong_order_raises_nothing_and_matches_the_right_one_bit_for_bit(no_child_left):
    size = lk.sizes("tiny")
    found = wrong_order(size)
    json.dumps(found)
    for how in ("wrapper", "forward"):
        run = found[how]
        assert run["error"] is None
        assert run["losses_bitwise_equal"] is True and run["grads_bitwise_equal"] is True
        for key in ("all_gathers", "reduce_scatters", "block_calls"):  # no extra all-gather in the recompute
            assert run[f"per_rank_{key}"]["wrong"] == run[f"per_rank_{key}"]["right"], (how, key)
            assert all(count > 0 for count in run[f"per_rank_{key}"]["right"]), (how, key)  # counted at all
        for right, wrong in zip(*run["per_rank_peak_bytes"].values()):
            assert abs(right - wrong) <= block_bytes(size)
    calls = found["wrapper"]["per_rank_fsdp_calls"]  # a wrapper around a sharded block reruns FSDP's hooks
    assert calls["wrong"] == [2 * c for c in calls["right"]]
    assert calls["right"] == [size.gpt_layers] * len(calls["right"])  # one per sharded block, in the measured step only
    assert found["forward"]["per_rank_fsdp_calls"]["wrong"] == found["forward"]["per_rank_fsdp_calls"]["right"]


def _meter_and_memtracker(rank: int, ranks: int, size: lk.Sizes) -> dict:
    """One sharded training step measured by labkit's meter, and the same step by PyTorch's FSDPMemTracker."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    cfg = fsdp_config(size)
    x = micro_batch(cfg, rank, ranks)
    model = build("sharded", cfg)
    opt = torch.optim.Adam(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    step()
    tracker = FSDPMemTracker(model, opt)
    tracker.track_inputs((x,))
    with tracker, MemoryMeter(model, opt, x) as meter:  # the same step: gloo's thread frees at its own moment
        step()
    local = sum(p.to_local().nbytes for p in model.parameters())
    return {"meter": meter.peak, "tracker": tracker.get_tracker_snapshot("peak")[x.device]["Total"],
            "baseline": meter.baseline, "local_params": local, "global_params": sum(p.nbytes for p in model.parameters())}


@pytest.mark.slow
def test_the_meter_counts_fsdp2_as_pytorchs_fsdp_memtracker_does(no_child_left):
    for rank, found in enumerate(launch(_meter_and_memtracker, mid_sizes(), ranks=RANKS, timeout=60)):
        assert found["local_params"] * RANKS == found["global_params"]  # the parameters are sharded
        assert found["meter"] == found["tracker"], (rank, found)  # a DTensor counts by its local shard


def test_micro_batches_split_the_global_batch_and_dropout_is_off():
    cfg = fsdp_config(lk.sizes("tiny"))
    assert cfg.dropout == 0 and cfg.batch % RANKS == 0
    parts = [micro_batch(cfg, rank, RANKS) for rank in range(RANKS)]
    assert torch.equal(torch.cat(parts), lk.gpt_input(cfg))
    assert parts[0].untyped_storage().nbytes() == parts[0].nbytes  # a copy of its own, not a view of the batch
    with pytest.raises(ValueError, match="does not split into 3"):
        micro_batch(cfg, 0, 3)


def test_checkpointed_blocks_recompute_and_give_the_plain_gradients():
    cfg = fsdp_config(lk.sizes("tiny"))
    x = lk.gpt_input(cfg)
    grads, calls = {}, {}
    for combination in ("plain", "checkpointed"):
        model = build(combination, cfg)
        calls[combination] = 0

        def count(module, args, name=combination):
            calls[name] += 1
        for block in model.blocks:
            block.attn.register_forward_pre_hook(count)
        model(x).square().mean().backward()
        grads[combination] = [p.grad for p in model.parameters()]
    assert calls == {"plain": cfg.n_layers, "checkpointed": 2 * cfg.n_layers}
    assert all(torch.equal(a, b) for a, b in zip(grads["plain"], grads["checkpointed"]))
    with pytest.raises(ValueError, match="choose one of plain, checkpointed"):
        build("sharded_twice", cfg)
