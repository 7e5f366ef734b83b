"""The logits and the loss (labkit.bench.logits): what cross-entropy keeps at a vocabulary, to the byte, and
chunked cross-entropy against the plain loss."""
from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.bench.logits import (
    auto_chunk_rows, chunked_figures, chunked_head_loss, head_loss, logits, race, saved_bytes, torch_loss_missing,
)


def test_the_loss_keeps_its_float32_log_softmax_and_the_targets():
    cfg = lk.sizes("tiny").gpt(batch=2)
    found = saved_bytes(cfg, vocab=1000, seq=16)
    # log_softmax's output (b·s·vocab float32), nll_loss's targets (int64) and its total weight (one float32)
    assert found["head_and_loss"] == 2 * 16 * 1000 * 4 + 2 * 16 * 8 + 4
    assert found["blocks"] > 0 and found["seq"] == 16


@pytest.mark.parametrize("chunks", [1, 3, 8])
def test_chunked_cross_entropy_is_the_loss_and_its_gradients(chunks):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(2, 12, 16, generator=gen).requires_grad_()
    weight = torch.randn(50, 16, generator=gen).requires_grad_()
    targets = torch.randint(50, (2, 12), generator=gen)
    plain = head_loss(h, weight, targets)
    got = chunked_head_loss(h, weight, targets, chunks)
    torch.testing.assert_close(got, plain)
    want = torch.autograd.grad(plain, (h, weight))
    for a, b in zip(torch.autograd.grad(got, (h, weight)), want):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="chunks=0 must be an int >= 1"):
        chunked_head_loss(h, weight, targets, 0)


def test_chunks_cut_the_peak_where_positions_outnumber_the_hidden_size():
    cfg = lk.sizes("tiny").gpt(batch=4, seq=64)  # b·s = 256 positions, hidden 32
    found = chunked_figures(cfg, vocab=2000, chunks=8)
    assert found["chunked_peak"] < found["plain_peak"] / 2 and found["grads_max_rel_diff"] < 1e-5


def test_the_bench_names_each_vocabulary_and_where_the_blocks_outweigh_the_head():
    figures = logits(lk.sizes("tiny"), seqs=[8, 16], chunks=2)
    assert {"gpt2", "llama3"} <= set(figures)
    for name in ("gpt2", "llama3"):
        rows = figures[name]["rows"]
        assert [r["seq"] for r in rows] == [8, 16]
        over = figures[name]["blocks_outweigh_head_from_seq"]
        assert over == next((r["seq"] for r in rows if r["blocks"] > r["head_and_loss"]), None)


# ---------------------------------------------------------------- the race: the plain loss, the kit's, PyTorch's
needs_torch_loss = pytest.mark.skipif(torch_loss_missing() is not None, reason=str(torch_loss_missing()))


def test_the_plain_loss_peaks_in_backward_at_three_logits_sized_float32_tensors():
    cfg = lk.sizes("tiny").gpt(batch=2, seq=16, dropout=0.0)
    found = race(cfg, vocab=1000, repeats=1)
    logits = 2 * 16 * 1000 * 4
    plain = found["plain"]
    assert found["logits_bytes"] == logits and plain["peak_phase"] == "backward"
    assert plain["peak"] == plain["backward_peak"]
    # forward: the logits and log-softmax's saved output; backward: log-softmax's output, its gradient and the
    # logits' gradient (the loss, its gradient and nll's total weight: a few scalars besides)
    assert 2 * logits <= plain["forward_peak"] < 2 * logits + 64
    assert 3 * logits <= plain["backward_peak"] < 3 * logits + 64
    assert plain["grads_bitwise"] and plain["grads_max_rel_diff"] == 0.0 and plain["seconds"] > 0


@needs_torch_loss
def test_pytorchs_chunked_loss_keeps_no_logits_and_trains_the_same_gradients():
    cfg = lk.sizes("tiny").gpt(batch=4, seq=64, dropout=0.0)  # 256 positions, hidden 32
    found = race(cfg, vocab=2000, chunks=8, repeats=1, auto=1)
    assert found["chunk_rows"] == 32 and found["torch_missing"] is None
    for name in ("torch", "torch_auto"):
        row = found[name]
        # its forward computes each chunk's gradients and stashes the weight's (vocab x hidden float32), no logits
        assert row["forward_peak"] < found["logits_bytes"] / 4 and row["peak"] < found["chunked"]["peak"]
        assert row["grads_max_rel_diff"] < 1e-4 and not row["grads_bitwise"]
    assert found["auto_chunk_rows"] == auto_chunk_rows(256, cfg.hidden, 2000, torch.float32, "cpu") >= 1
    assert found["chunked"]["peak"] < found["plain"]["peak"] / 2  # positions outnumber hidden: chunks cut


def test_without_pytorchs_loss_the_race_says_so_and_runs_the_rest(monkeypatch):
    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy", raising=False)
    assert "has no torch.nn.functional.linear_cross_entropy" in torch_loss_missing()
    found = race(lk.sizes("tiny").gpt(batch=1, seq=8, dropout=0.0), vocab=100, repeats=1, auto=1)
    assert found["torch_missing"] == torch_loss_missing() and found["auto_chunk_rows"] is None
    assert "torch" not in found and "torch_auto" not in found and {"plain", "chunked"} <= set(found)


def test_the_race_refuses_a_chunk_count_that_is_not_a_positive_int():
    with pytest.raises(ValueError, match="chunks=0 must be an int >= 1"):
        race(lk.sizes("tiny").gpt(batch=1, seq=8), vocab=100, chunks=0)
