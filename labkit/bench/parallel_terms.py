"""What one GPTBlock saves per rank under tensor and sequence parallelism: Korthikanti et al. 2022's terms and
the kit's own, term by term (the prediction ``labkit.bench.parallel`` holds the ledger to).

Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi, Catanzaro, "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023, arXiv 2205.05198), section 4: bytes of one layer's activations with 16-bit
activations and 1-byte dropout masks, s sequence, b micro-batch, h hidden, a heads, t tensor-parallel ranks:

  no parallelism                    sbh(34 + 5as/h)
  tensor parallel                   sbh(10 + 24/t + 5as/(ht))
  tensor + sequence parallel        sbh(34 + 5as/h) / t
  ... + selective recomputation     sbh(34) / t

Where the kit's block departs from that accounting (See Departure N in the term table):

1. Element sizes: every activation has the block's dtype's element size A (4 in float32), every dropout mask 1
   byte (the kit's Dropout calls ``torch.native_dropout``, which saves a bool mask on every device).
2. LayerNorm statistics: ``native_layer_norm`` also saves its mean and rstd, (b, s, 1) each, which the paper
   leaves out; sequence parallelism splits them with the sequence. On a CPU they are in the block's dtype
   (bfloat16 measured too); a device that keeps them in float32 for a 16-bit block would need 4 bytes here.
3. Sequence parallelism as torch builds it: ``PrepareModuleInput`` all-gathers the LayerNorm's output before
   the qkv and fc1 Linears (Shard(1) -> Replicate), and the Linear saves what it multiplied, the gathered
   (b, s, h) tensor, on every rank. Megatron-LM keeps the rank's sequence shard and gathers again in backward,
   which is where the paper's 1/t on those two terms comes from. torch 2.13's sequence-parallel block keeps
   2·A·sbh, not 2·A·sbh/t, of them.
4. Dropout off (p = 0): no masks, and attention over V multiplies the softmax output itself, one storage
   with the softmax's saved output (the ledger counts a storage once).
5. Q, K and V: the matmuls save contiguous copies of the heads' views of qkv's output when a rank holds more
   than one head, and views of that output (all of its 3·A·sbh/t bytes, one storage) when it holds one head:
   the same bytes either way.
6. Selective recomputation: attention's core (QKᵀ, mask, softmax, dropout, ·V) under a non-reentrant
   checkpoint keeps its input, qkv's output (3·A·sbh/t: the bytes of Q, K and V), and none of the as²b terms.
7. Left out as the paper leaves them out: the causal mask (a buffer the ``where`` saves, the same on every rank
   and every step), parameters, and the block's output.
8. Fused attention (``fused``: sequence, with attention's core one ``F.scaled_dot_product_attention`` call,
   causal, no dropout inside it): the kernel saves q, k and v (views of qkv's output: the bytes of Q, K and V),
   its output (which the output projection multiplies: one storage, the ledger counts it once, at attn.core) and
   the logsumexp of every row of scores, (b, a/t, s) in the kernel's computation dtype (float32 for a 16- or
   32-bit block: ``meta__scaled_dot_product_flash_attention_for_cpu`` in torch/_meta_registrations.py): 4·asb/t
   bytes where the paper's 5as²b/t were. Its backward takes q, k, v, the output and the logsumexp, no scores
   (``..._for_cpu_backward``), and recomputes them. Dropout is off in
   the core on every device: a CPU's flash kernel takes none (with dropout it falls back to the math kernel,
   which keeps the scores; ``fused_with_dropout`` in the bench measures that on one process, and names the kernel
   torch picks with and without dropout).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit.models import GPTConfig

__all__ = ["CONFIGURATIONS", "PAPER_FORMULAS", "LOGSUMEXP", "ParallelTerm", "parallel_terms", "predicted_bytes",
           "paper_bytes", "predicted_by_module"]

# plain: one rank's whole block (t = 1); tensor: Megatron's column/row split of the Linears; sequence: tensor
# plus sequence parallelism; selective: sequence with attention's core checkpointed; fused: sequence with the
# core one fused attention call (Departure 8; the paper has no such configuration: its selective formula)
CONFIGURATIONS = ("plain", "tensor", "sequence", "selective", "fused")
PAPER_FORMULAS = {"plain": "sbh(34 + 5as/h)", "tensor": "sbh(10 + 24/t + 5as/(ht))",
                  "sequence": "sbh(34 + 5as/h)/t", "selective": "sbh(34)/t", "fused": "sbh(34)/t"}


@dataclass(frozen=True)
class ParallelTerm:
    """One term of a block's saved activations: the paper's bytes and the kit's, per rank and configuration."""

    name: str  # what is saved, in the paper's words (the kit's, for what the paper leaves out)
    module: str  # the innermost GPTBlock submodule the ledger attributes it to
    paper: str  # the paper's 16-bit bytes unsharded, e.g. "4sbh" ("-" where the paper has no such term)
    kit: str  # the kit's bytes unsharded, e.g. "2A·sbh" (A: the element size; masks 1 byte)
    paper_split: str  # the configurations in which the paper divides it by t: "tensor, sequence", "sequence", "none"
    kit_split: str  # the same for the kit's block (Departure 3: qkv's and fc1's inputs differ)
    paper_bytes: dict[str, int]  # per configuration, the paper's term on one rank at 16-bit activations, 1-byte masks
    bytes: dict[str, int]  # per configuration, the kit's prediction for one rank


# name, module, the paper's multiple of its unit, unit, an activation (A bytes) or a mask (1 byte), how the paper
# splits it over ranks, how the kit's torch block does (Departure 3): "tp" by tensor (and so also by sequence)
# parallelism, "sp" by sequence parallelism only
_TERMS = (
    ("LayerNorm 1 input", "ln1", 2, "sbh", "act", "sp", "sp"),
    ("QKV input", "attn.qkv", 2, "sbh", "act", "sp", "none"),
    ("Q and K", "attn.core", 4, "sbh", "act", "tp", "tp"),
    ("softmax output", "attn.core", 2, "as²b", "act", "tp", "tp"),
    ("softmax dropout mask", "attn.core.drop", 1, "as²b", "mask", "tp", "tp"),
    ("attention over V: dropout output", "attn.core", 2, "as²b", "act", "tp", "tp"),
    ("attention over V: V", "attn.core", 2, "sbh", "act", "tp", "tp"),
    ("output-projection input", "attn.proj", 2, "sbh", "act", "tp", "tp"),
    ("attention dropout mask", "attn.drop", 1, "sbh", "mask", "sp", "sp"),
    ("LayerNorm 2 input", "ln2", 2, "sbh", "act", "sp", "sp"),
    ("fc1 input", "mlp.fc1", 2, "sbh", "act", "sp", "none"),
    ("GELU input", "mlp.act", 8, "sbh", "act", "tp", "tp"),
    ("fc2 input", "mlp.fc2", 8, "sbh", "act", "tp", "tp"),
    ("MLP dropout mask", "mlp.drop", 1, "sbh", "mask", "sp", "sp"),
)
_CORE_SCORES = ("softmax output", "softmax dropout mask", "attention over V: dropout output")  # the 5as²b/t
_OFF_WITHOUT_DROPOUT = ("softmax dropout mask", "attention dropout mask", "MLP dropout mask",
                        "attention over V: dropout output")  # Departure 4
_SPLIT_IN = {"tp": ("tensor", "sequence", "selective", "fused"), "sp": ("sequence", "selective", "fused"),
             "none": ()}
_FUSED_MODULE = {"output-projection input": "attn.core"}  # Departure 8: one storage with the kernel's output
LOGSUMEXP = "attention logsumexp"
_SPLIT_TEXT = {"tp": "tensor, sequence", "sp": "sequence", "none": "none"}


def _check(cfg: GPTConfig, ranks: int) -> None:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"parallel_terms: ranks={ranks!r} must be a positive int")
    for name, n in (("heads", cfg.heads), ("seq", cfg.seq)):
        if n % ranks:
            raise ValueError(f"parallel_terms: {name}={n} does not split over {ranks} ranks; choose a multiple "
                             f"of {ranks}")
    if cfg.autocast is not None:
        raise ValueError(f"parallel_terms: cfg.autocast={cfg.autocast} runs the block in two dtypes and the terms "
                         "count one; set dtype= instead")


def parallel_terms(cfg: GPTConfig, ranks: int = 2) -> list[ParallelTerm]:
    """The paper's terms and the kit's per rank, for each of CONFIGURATIONS on `ranks` ranks (t = 1 for plain)."""
    _check(cfg, ranks)
    A = torch.empty((), dtype=cfg.dtype).element_size()
    s, b, h, a, t = cfg.seq, cfg.batch, cfg.hidden, cfg.heads, ranks
    unit = {"sbh": s * b * h, "as²b": a * s * s * b, "sb": s * b}

    def per_rank(total: int, split: str) -> dict[str, int]:
        return {c: total // (t if c in _SPLIT_IN[split] else 1) for c in CONFIGURATIONS}

    terms = []
    for name, module, k, u, kind, paper_split, kit_split in _TERMS:
        elements = k // 2 if kind == "act" else 1  # the paper's 2-byte activations, in elements
        paper, kit = per_rank(k * unit[u], paper_split), per_rank(elements * (A if kind == "act" else 1) * unit[u],
                                                                  kit_split)
        if name in _CORE_SCORES:
            paper["selective"] = kit["selective"] = paper["fused"] = kit["fused"] = 0  # Departures 6 and 8
        if cfg.dropout == 0 and name in _OFF_WITHOUT_DROPOUT:
            kit = dict.fromkeys(CONFIGURATIONS, 0)
        kit_text = f"{elements if elements > 1 else ''}A·{u}" if kind == "act" else f"{u} (bool)"
        terms.append(ParallelTerm(name, module, f"{k if k > 1 else ''}{u}", kit_text, _SPLIT_TEXT[paper_split],
                                  _SPLIT_TEXT[kit_split], paper, kit))
    for i, ln in ((1, "ln1"), (11, "ln2")):  # Departure 2: after each LayerNorm's input
        terms.insert(i, ParallelTerm(f"LayerNorm {ln[-1]} mean and rstd", ln, "-", "2A·sb", "none", "sequence",
                                     dict.fromkeys(CONFIGURATIONS, 0), per_rank(2 * A * unit["sb"], "sp")))
    lse = {c: max(A, 4) * a * s * b // t if c == "fused" else 0 for c in CONFIGURATIONS}  # Departure 8; a/t heads
    terms.insert(7, ParallelTerm(LOGSUMEXP, "attn.core", "-", "4·asb (float32)", "none", "tensor, sequence",
                                 dict.fromkeys(CONFIGURATIONS, 0), lse))
    return terms


def predicted_bytes(cfg: GPTConfig, ranks: int = 2) -> dict[str, int]:
    """The kit's prediction of one rank's saved bytes, per configuration."""
    terms = parallel_terms(cfg, ranks)
    return {c: sum(term.bytes[c] for term in terms) for c in CONFIGURATIONS}


def predicted_by_module(cfg: GPTConfig, ranks: int = 2) -> dict[str, dict[str, int]]:
    """The kit's prediction per configuration and module (those with bytes), as the ledger's by_module() groups."""
    found: dict[str, dict[str, int]] = {c: {} for c in CONFIGURATIONS}
    for term in parallel_terms(cfg, ranks):
        for c in CONFIGURATIONS:
            module = _FUSED_MODULE.get(term.name, term.module) if c == "fused" else term.module
            if term.bytes[c]:
                found[c][module] = found[c].get(module, 0) + term.bytes[c]
    return found


def paper_bytes(cfg: GPTConfig, ranks: int = 2) -> dict[str, float]:
    """The paper's closed forms (PAPER_FORMULAS) at 16-bit activations and 1-byte masks, per configuration."""
    _check(cfg, ranks)
    s, b, h, a, t = cfg.seq, cfg.batch, cfg.hidden, cfg.heads, ranks
    sbh = s * b * h
    return {"plain": sbh * (34 + 5 * a * s / h), "tensor": sbh * (10 + 24 / t + 5 * a * s / (h * t)),
            "sequence": sbh * (34 + 5 * a * s / h) / t, "selective": sbh * 34 / t, "fused": sbh * 34 / t}
