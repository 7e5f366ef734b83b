"""The logits and the loss at a real vocabulary, and chunked cross-entropy: `python -m labkit bench logits`.

A language model's last step turns each position's hidden state into `vocab` logits and cross-entropy over
them. At GPT-2's vocabulary (50,257) or Llama 3's (128,256) those (b, s, vocab) tensors, and what
cross-entropy saves for backward (its log-softmax, in float32), can outweigh every block's activations. The
ledger measures both on the capstone's shapes (labkit.planners.capstone.capstone_config) at several sequence
lengths. The fix measured beside it: the loss computed over chunks of positions, each chunk's logits under a
checkpoint (non-reentrant), so only one chunk's logits exist at a time and backward recomputes them. The
gradients are compared with the plain loss's: summed in chunks, they are equal up to float rounding, not bit
for bit (the bench reports the largest relative difference).

``race`` sets three ways of the same loss side by side at one shape: the plain loss, whose peak falls in backward
(the logits freed, log-softmax's saved output, its gradient and the gradient of the logits alive at once: about
3·b·s·vocab·4 bytes); the kit's chunked loss; and PyTorch's own, ``torch.nn.functional.linear_cross_entropy``
with a ``torch.nn.LinearCrossEntropyOptions`` (torch 2.13; ``options=None`` is its reference path): a custom op
that walks the positions in chunks, computing each chunk's logits, its loss and both gradients in the forward,
so no logits outlive a chunk and backward only scales the gradients it stashed
(torch/nn/modules/linear_cross_entropy.py). Each is measured for its peak above its inputs (the meter: forward's
and backward's), its seconds for a forward and backward, and its gradients against the plain loss's. A torch
without ``linear_cross_entropy`` (the hubs' 2.11) gets a row saying so instead of figures.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.ledger import saved_tensors
from labkit.instruments.meter import MemoryMeter
from labkit.instruments.timing import benchmark
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.models.hugging_face import VOCABS

__all__ = ["VOCABS", "head_loss", "chunked_head_loss", "torch_loss_missing", "torch_chunked_loss", "auto_chunk_rows",
           "saved_bytes", "chunked_figures", "race", "logits"]

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


def torch_loss_missing() -> str | None:
    """Why this torch cannot run PyTorch's chunked loss (it has no F.linear_cross_entropy or no
    torch.nn.LinearCrossEntropyOptions), or None where it can."""
    if hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions"):
        return None
    return (f"torch {torch.__version__} has no torch.nn.functional.linear_cross_entropy with "
            "torch.nn.LinearCrossEntropyOptions (torch 2.13 has both)")


def torch_chunked_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, options: Any) -> torch.Tensor:
    """head_loss by PyTorch's own F.linear_cross_entropy on the flattened positions, with `options` (a
    torch.nn.LinearCrossEntropyOptions: its chunked path; None: its reference path, the logits materialised)."""
    return F.linear_cross_entropy(h.flatten(0, 1), weight, targets.flatten(), options=options)


def auto_chunk_rows(positions: int, hidden: int, vocab: int, dtype: torch.dtype, device: str | torch.device) -> int:
    """The rows per chunk LinearCrossEntropyOptions() picks for these shapes ("auto", resolved by the options' own
    _adjust, as F.linear_cross_entropy resolves it)."""
    options = torch.nn.LinearCrossEntropyOptions()._adjust(positions, hidden, vocab, dtype, torch.device(device))
    return options.batch_chunk_size


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


def _inputs(cfg: GPTConfig, vocab: int, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head's input h (b, s, hidden), its weight (vocab, hidden) and the targets, from cfg's seed."""
    gen = torch.Generator().manual_seed(cfg.seed)
    h = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=gen, dtype=cfg.dtype).to(device).requires_grad_()
    weight = (torch.randn(vocab, cfg.hidden, generator=gen, dtype=cfg.dtype) * 0.02).to(device).requires_grad_()
    return h, weight, torch.randint(vocab, (cfg.batch, cfg.seq), generator=gen).to(device)


def _run(loss_fn: Callable[..., torch.Tensor], h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
         repeats: int) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """One forward and backward of loss_fn under the meter (its peaks above the inputs, forward's and
    backward's), then the median seconds of `repeats` more; and the gradients of the metered one."""
    h.grad = weight.grad = None
    with MemoryMeter(h, weight, targets) as meter:
        loss_fn(h, weight, targets).backward()
    grads = [h.grad.clone(), weight.grad.clone()]

    def step() -> None:
        h.grad = weight.grad = None
        loss_fn(h, weight, targets).backward()
    above = lambda phase: meter.phase_peaks.get(phase, meter.baseline) - meter.baseline  # noqa: E731
    return {"peak": meter.peak - meter.baseline, "peak_phase": meter.peak_phase, "forward_peak": above("forward"),
            "backward_peak": above("backward"),
            "seconds": benchmark(step, warmup=0, repeats=repeats, device=h.device).median}, grads


def race(cfg: GPTConfig, vocab: int, chunks: int = 8, repeats: int = 3, device: str | torch.device = "cpu",
         auto: int = 0) -> dict[str, Any]:
    """The plain loss, the kit's chunked loss (`chunks` chunks) and PyTorch's F.linear_cross_entropy (its chunked
    path in chunks of as many rows as the kit's) at cfg's (batch, seq, hidden) and `vocab` on `device`: each
    one's peak above its inputs (forward's and backward's), its median seconds for a forward and backward over
    `repeats`, and its gradients' largest relative difference from the plain loss's (and whether bit for bit).
    auto > 0 adds LinearCrossEntropyOptions() as it is ("auto" chunks, "torch_auto"), timed `auto` times."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"race: chunks={chunks!r} must be an int >= 1")
    h, weight, targets = _inputs(cfg, vocab, device)
    positions = cfg.batch * cfg.seq
    rows = -(-positions // chunks)
    ways: dict[str, Any] = {"plain": (head_loss, repeats),
                            "chunked": (functools.partial(chunked_head_loss, chunks=chunks), repeats)}
    missing = torch_loss_missing()
    if missing is None:
        make = torch.nn.LinearCrossEntropyOptions
        ways["torch"] = (functools.partial(torch_chunked_loss, options=make(batch_chunk_size=rows)), repeats)
        if auto:
            ways["torch_auto"] = (functools.partial(torch_chunked_loss, options=make()), auto)
    out: dict[str, Any] = {"positions": positions, "hidden": cfg.hidden, "vocab": vocab, "chunks": chunks,
                           "chunk_rows": rows, "logits_bytes": positions * vocab * 4, "torch_missing": missing,
                           "auto_chunk_rows": None if missing else auto_chunk_rows(positions, cfg.hidden, vocab,
                                                                                   cfg.dtype, device)}
    plain = None
    for name, (fn, times) in ways.items():
        row, grads = _run(fn, h, weight, targets, times)
        plain = grads if plain is None else plain
        row["grads_max_rel_diff"] = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(grads, plain))
        row["grads_bitwise"] = all(map(torch.equal, grads, plain))
        out[name] = row
    return out


def logits(size: Sizes | None = None, seqs: Sequence[int] | None = None, chunks: int = 8) -> dict[str, Any]:
    """`bench logits`: per vocabulary, the blocks' and the head's saved bytes at each sequence length and the
    first length where the blocks' outweigh the head's; chunked cross-entropy's peak cut and gradients; and the
    race of the plain loss, the kit's chunked one and PyTorch's (its "auto" chunks too) at the lab's sequence and
    the longest."""
    from labkit.planners.capstone import capstone_config

    cfg, _ = capstone_config(size or sizes(), batch=1, dropout=0.0)
    cfg = replace(cfg, autocast=None)  # the dtypes as stored: the ledger counts what autograd keeps in them
    seqs = list(seqs or [cfg.seq // 4, cfg.seq // 2, cfg.seq, 2 * cfg.seq, 4 * cfg.seq])
    out: dict[str, Any] = {"config": {"hidden": cfg.hidden, "heads": cfg.heads, "n_layers": cfg.n_layers,
                                      "batch": cfg.batch, "dtype": str(cfg.dtype).replace("torch.", "")}}
    for name, vocab in VOCABS.items():
        rows = [saved_bytes(cfg, vocab, s) for s in seqs]
        over = next((r["seq"] for r in rows if r["blocks"] > r["head_and_loss"]), None)  # None: not up to seqs[-1]
        out[name] = {"vocab": vocab, "rows": rows, "blocks_outweigh_head_from_seq": over,
                     "chunked": chunked_figures(replace(cfg, seq=seqs[-1]), vocab, chunks),
                     "race": [race(replace(cfg, seq=s), vocab, chunks, auto=3) for s in (cfg.seq, seqs[-1])]}
    return out
