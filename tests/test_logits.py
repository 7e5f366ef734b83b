"""The logits and the loss (labkit.bench.logits): what cross-entropy keeps at a vocabulary, to the byte, and
chunked cross-entropy against the plain loss."""
from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.bench.logits import chunked_figures, chunked_head_loss, head_loss, logits, saved_bytes


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
    cfg = lk.sizes("tiny").gpt(batch=4, seq=64)  # b·s = 256 positions, hidden 16
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
