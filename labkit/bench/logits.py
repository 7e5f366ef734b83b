"""The logits and the loss at a real vocabulary, and chunked cross-entropy: `python -m labkit bench logits`.

A language model's last step turns each position's hidden state into `vocab` logits and cross-entropy over
them. At GPT-2's vocabulary (50,257) or Llama 3's (128,256) those (b, s, vocab) tensors, and what
cross-entropy saves for backward (its log-softmax, in float32), can outweigh every block's activations. The
ledger measures both on the capstone's shapes (labkit.bench.lab07.capstone_config) at several sequence
lengths. The fix measured beside it: the loss computed over chunks of positions, each chunk's logits under a
checkpoint (non-reentrant), so only one chunk's logits exist at a time and backward recomputes them. The
gradients are compared with the plain loss's: summed in chunks, they are equal up to float rounding, not bit
for bit (the bench reports the largest relative difference).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.ledger import saved_tensors
from labkit.instruments.meter import MemoryMeter
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.models.hugging_face import VOCABS

__all__ = ["VOCABS", "head_loss", "chunked_head_loss", "saved_bytes", "logits"]



def head_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the logits h @ weight.T (h: (b, s, hidden), weight: (vocab, hidden))."""
    logits = h @ weight.T  # (b, s, vocab)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _chunk_sum(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy((h @ weight.T).float(), targets, reduction="sum")


def chunked_head_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunks: int) -> torch.Tensor:
    """head_loss computed over `chunks` slices of the positions, each under checkpoint: backward recomputes one
    slice's logits at a time instead of keeping all of them."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunked_head_loss: chunks={chunks!r} must be an int >= 1")
    flat, want = h.flatten(0, 1), targets.flatten()
    total = sum(checkpoint(_chunk_sum, part, weight, t, use_reentrant=False)
                for part, t in zip(flat.chunk(chunks), want.chunk(chunks)))
    return total / want.numel()


def saved_bytes(cfg: GPTConfig, vocab: int, seq: int) -> dict[str, int]:
    """Bytes autograd keeps for backward at sequence `seq`: every block's (the stack's forward), and the head's
    and the loss's (from the final hidden state on)."""
    cfg = replace(cfg, seq=seq)
    stack, x = GPTStack(cfg), gpt_input(cfg, requires_grad=True)
    blocks = saved_tensors(stack, x, model=stack).total_bytes
    h = torch.randn(cfg.batch, seq, cfg.hidden, dtype=cfg.dtype, requires_grad=True)
    weight = torch.randn(vocab, cfg.hidden, dtype=cfg.dtype, requires_grad=True) * 0.02
    targets = torch.randint(vocab, (cfg.batch, seq))
    head = saved_tensors(head_loss, h, weight, targets, exclude=(h, weight)).total_bytes
    return {"seq": seq, "blocks": blocks, "head_and_loss": head}


def _grads_and_peak(loss_fn: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    *extra: Any) -> tuple[list[torch.Tensor], int]:
    h.grad = weight.grad = None
    with MemoryMeter(h, weight, targets) as meter:
        loss_fn(h, weight, targets, *extra).backward()
    return [h.grad.clone(), weight.grad.clone()], meter.peak - meter.baseline


def chunked_figures(cfg: GPTConfig, vocab: int, chunks: int) -> dict[str, Any]:
    """The head and loss plainly and in `chunks` chunks at cfg's shapes: each one's peak above its inputs, and
    the gradients' largest relative difference. Chunks cut what grows with b·s·vocab (the logits, their
    log-softmax and gradient); the weight's gradient (vocab x hidden) stays whole, so the cut shows where b·s is
    well above hidden."""
    gen = torch.Generator().manual_seed(cfg.seed)
    h = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=gen, dtype=cfg.dtype).requires_grad_()
    weight = (torch.randn(vocab, cfg.hidden, generator=gen, dtype=cfg.dtype) * 0.02).requires_grad_()
    targets = torch.randint(vocab, (cfg.batch, cfg.seq), generator=gen)
    plain, plain_peak = _grads_and_peak(head_loss, h, weight, targets)
    chunked, chunked_peak = _grads_and_peak(chunked_head_loss, h, weight, targets, chunks)
    rel = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(chunked, plain))
    return {"vocab": vocab, "chunks": chunks, "plain_peak": plain_peak, "chunked_peak": chunked_peak,
            "peak_cut": round(plain_peak / chunked_peak, 3), "grads_max_rel_diff": rel,
            "grads_bitwise": all(map(torch.equal, chunked, plain))}


def logits(size: Sizes | None = None, seqs: Sequence[int] | None = None, chunks: int = 8) -> dict[str, Any]:
    """`bench logits`: per vocabulary, the blocks' and the head's saved bytes at each sequence length and the
    first length where the blocks' outweigh the head's; chunked cross-entropy's peak cut and gradients."""
    from labkit.bench.lab07 import capstone_config

    cfg, _ = capstone_config(size or sizes(), batch=1, dropout=0.0)
    cfg = replace(cfg, autocast=None)  # the dtypes as stored: the ledger counts what autograd keeps in them
    seqs = list(seqs or [cfg.seq // 4, cfg.seq // 2, cfg.seq, 2 * cfg.seq, 4 * cfg.seq])
    out: dict[str, Any] = {"config": {"hidden": cfg.hidden, "heads": cfg.heads, "n_layers": cfg.n_layers,
                                      "batch": cfg.batch, "dtype": str(cfg.dtype).replace("torch.", "")}}
    for name, vocab in VOCABS.items():
        rows = [saved_bytes(cfg, vocab, s) for s in seqs]
        over = next((r["seq"] for r in rows if r["blocks"] > r["head_and_loss"]), None)  # None: not up to seqs[-1]
        out[name] = {"vocab": vocab, "rows": rows, "blocks_outweigh_head_from_seq": over,
                     "chunked": chunked_figures(replace(cfg, seq=seqs[-1]), vocab, chunks)}
    return out
