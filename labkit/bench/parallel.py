"""Activations under tensor and sequence parallelism: one GPTBlock sharded over RANKS processes with
``torch.distributed.tensor.parallel``, each rank's saved bytes measured by the ledger and held to the kit's
prediction, term by term (``labkit.bench.parallel_terms``, beside Korthikanti et al. 2022's formulas); the
sharded block's output and gradients held to the unsharded block's.

``parallel()`` starts RANKS processes joined by ``torch.distributed`` (labkit.env.ranks: gloo on the CPU), a
one-dimensional device mesh over them, and on each rank builds the block in every configuration:

  plain      no parallelism: the rank's whole block (t = 1)
  tensor     Megatron's split: ColwiseParallel on attn.qkv and mlp.fc1, RowwiseParallel on attn.proj and mlp.fc2,
             each rank a/t heads; LayerNorms, dropouts and the residual stream replicated
  sequence   tensor, plus SequenceParallel on ln1, ln2, attn.drop and mlp.drop: the block's input, output and
             residual stream sharded on the sequence (dim 1); PrepareModuleInput gathers it before attn and mlp,
             RowwiseParallel(output_layouts=Shard(1)) reduce-scatters it after them, as torch's tensor-parallel
             docs lay out a Llama block
  selective  sequence, with attention's core (QKᵀ, softmax, dropout, ·V) under checkpoint(use_reentrant=False),
             Korthikanti's selective recomputation
  fused      sequence, with attention's core one F.scaled_dot_product_attention call (causal, no dropout inside
             it): fused attention, as production stacks run it (See Note 5)

Notes (the code says "See Note N" where one applies):

1. The fused qkv. Its weight's rows are [q | k | v], h rows each, heads in order; ColwiseParallel gives rank r
   the rows r·3h/t up to (r+1)·3h/t, which for t = 2 is every head's q and half of k. ``qkv_order`` reorders
   the rows to [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (q_r: rank r's heads' rows of q) before sharding, and
   ``attn.core.heads`` becomes a/t: each rank attends with its own heads. A gradient of the sharded qkv,
   gathered, is the unsharded one's in that order.
2. Every rank builds the block from cfg.seed, so its weights are the unsharded block's; parallelize_module
   distributes rank 0's (src_data_rank=0).
3. Memory: train mode with cfg's dropout, one forward of the block under the ledger (model=block: parameters
   and the causal-mask buffer are left out, the input counted where LayerNorm saves it). The ledger counts a
   saved DTensor by its local shard (its notes on wrapper subclasses). DTensor's random ops are not supported
   on a CPU mesh (torch warns; silenced here): each rank draws a sequence-parallel dropout's mask from its own
   generator, which changes values, never bytes.
4. Numerics: eval mode (no dropout: the ranks draw other masks than one process), the same input and output
   gradient in every configuration; output, input gradient and every parameter's gradient (gathered) allclose
   to the unsharded block's at RTOL and ATOL (a sum split over ranks adds in another order; the fused kernel
   sums in another order too).
5. Fused attention keeps no (b, a/t, s, s) tensor: what Korthikanti's 5as/h term becomes is the kernel's
   logsumexp, one float32 per head and position (labkit.bench.parallel_terms, Departure 8). The core takes no
   dropout in it on any device (a CPU's flash kernel takes none); ``fused_with_dropout`` measures, on one
   process, what this device's kernel keeps with the block's dropout inside it, and which kernel torch picks
   (torch._fused_sdp_choice) with and without it.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit.bench.parallel_terms import (
    CONFIGURATIONS, PAPER_FORMULAS, paper_bytes, parallel_terms, predicted_by_module, predicted_bytes,
)
from labkit.env.profile import sizes
from labkit.env.ranks import device_of, launch, on_gpus
from labkit.env.sizes import Sizes
from labkit.instruments.ledger import saved_tensors
from labkit.models import CoreAttention, GPTBlock, GPTConfig, gpt_input

__all__ = ["RANKS", "BAR", "RTOL", "ATOL", "CONFIGURATIONS", "parallel", "parallel_config", "qkv_order", "build",
           "fused_core", "fused_with_dropout", "tolerance", "table"]

RANKS = 2  # t: the tensor- (and sequence-) parallel ranks
BAR = 0.05  # bars/parallel-activations: |measured - predicted| / predicted on every rank and configuration
RTOL, ATOL = 1e-4, 1e-5  # sharded vs unsharded numerics in float32 (See Note 4); tolerance() for other dtypes
SEQUENCE_PARALLEL = ("sequence", "selective", "fused")  # the configurations whose block is sharded on the sequence


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) of the numerics in `dtype`: RTOL, ATOL in float32; 8 ulps of 1 in a 16-bit dtype (its sums
    round at every addition), 1e-9 in float64."""
    if dtype == torch.float32:
        return RTOL, ATOL
    if dtype == torch.float64:
        return 1e-9, 1e-9
    eps = torch.finfo(dtype).eps
    return 8 * eps, 8 * eps


def parallel_config(size: Sizes) -> GPTConfig:
    """One block of the profile's GPT sizes in float32 (autocast off: the terms count one dtype), its dropout
    on. Where the ranks cannot each have a GPU, the cpu profile's sizes."""
    if size.device == "cuda" and not on_gpus(RANKS):
        size = sizes("cpu")
    return size.gpt(n_layers=1, autocast=None)


# ---------------------------------------------------------------- the sharded block

def qkv_order(hidden: int, ranks: int) -> torch.Tensor:
    """The rows of the fused qkv weight, reordered so that ColwiseParallel's r-th chunk is [q_r | k_r | v_r]
    (See Note 1): index i of the result is the unsharded row that goes to row i."""
    return torch.arange(3 * hidden).view(3, ranks, hidden // ranks).transpose(0, 1).reshape(-1)


def _plan(config: str) -> dict[str, Any]:
    """parallelize_module's plan for a GPTBlock's submodules, by configuration."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    )
    plan: dict[str, Any] = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
    if config in SEQUENCE_PARALLEL:
        gather = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())
        plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel(), "attn.drop": SequenceParallel(),
                     "mlp.drop": SequenceParallel(), "attn": gather, "mlp": gather,
                     "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                     "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))})
    return plan


def fused_core(core: CoreAttention, dropout: float = 0.0) -> Any:
    """core's forward as one F.scaled_dot_product_attention call over its heads, causal, with `dropout` in it
    (See Note 5): (b, s, 3h) fused q|k|v -> (b, s, h), the same shapes and heads as core.forward."""
    def forward(qkv: torch.Tensor) -> torch.Tensor:
        b, s, h3 = qkv.shape
        h, a = h3 // 3, core.heads
        q, k, v = (t.view(b, s, a, h // a).transpose(1, 2) for t in qkv.split(h, dim=-1))  # (b, a, s, hd) views
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout if core.training else 0.0)
        return y.transpose(1, 2).reshape(b, s, h)
    return forward


def build(config: str, cfg: GPTConfig, mesh: Any = None, *, permute_qkv: bool = True) -> GPTBlock:
    """The GPTBlock of one configuration on this rank (mesh: a 1-D DeviceMesh over the ranks; None for plain).
    permute_qkv=False leaves qkv's rows as they are: the mistake Note 1 is about, which the tests plant."""
    if config not in CONFIGURATIONS:
        raise ValueError(f"build: config={config!r} is unknown; choose one of {', '.join(CONFIGURATIONS)}")
    block = GPTBlock(cfg)
    if config == "plain":
        return block
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput, parallelize_module

    t = mesh.size()
    if permute_qkv:  # See Note 1
        order = qkv_order(cfg.hidden, t)
        with torch.no_grad():
            for p in block.attn.qkv.parameters():
                p.copy_(p[order])
    block.attn.core.heads = cfg.heads // t
    if config in SEQUENCE_PARALLEL:  # the block takes and returns its rank's part of the sequence
        parallelize_module(block, mesh, PrepareModuleInputOutput(
            input_layouts=Shard(1), desired_input_layouts=Shard(1), output_layouts=Shard(1),
            desired_output_layouts=Shard(1), use_local_output=True))
    parallelize_module(block, mesh, _plan(config))
    if config == "selective":
        core = block.attn.core
        core.forward = functools.partial(checkpoint, core.forward, use_reentrant=False)
    if config == "fused":  # See Note 5
        block.attn.core.forward = fused_core(block.attn.core)
    return block


def fused_with_dropout(cfg: GPTConfig, device: str | torch.device = "cpu") -> dict[str, Any]:
    """On one process, the bytes one block's core saves (the ledger, train mode) as written and as one fused
    attention call with the block's dropout inside it: on a CPU the flash kernel takes no dropout, and the
    kernel that does keeps the scores (See Note 5)."""
    found = {}
    for name in ("written", "fused"):
        block = GPTBlock(cfg).to(device).train()
        if name == "fused":
            block.attn.core.forward = fused_core(block.attn.core, cfg.dropout)
        led = saved_tensors(block, gpt_input(cfg, requires_grad=True, device=device), model=block)
        found[name] = led.by_module().get("attn.core", 0)
    return {"dropout": cfg.dropout, "device": str(device), "core_bytes": found,
            "kernel": {p: _kernel(cfg, device, p) for p in (0.0, cfg.dropout)}}


def _kernel(cfg: GPTConfig, device: str | torch.device, dropout: float) -> str:
    """The kernel F.scaled_dot_product_attention picks for one rank's q, k, v of cfg with `dropout` (torch's own
    choice, torch._fused_sdp_choice), or why it cannot be told."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return f"unknown (torch {torch.__version__} has no torch._fused_sdp_choice)"
    from torch.nn.attention import SDPBackend

    q = torch.empty(cfg.batch, cfg.heads // RANKS, cfg.seq, cfg.head_dim, dtype=cfg.dtype, device=device)
    return SDPBackend(choose(q, q, q, dropout_p=dropout, is_causal=True)).name


def _part(x: torch.Tensor, config: str, rank: int, ranks: int) -> torch.Tensor:
    """This rank's input (or output gradient): the whole (b, s, h) tensor, or its sequence shard."""
    if config not in SEQUENCE_PARALLEL:
        return x.clone()
    n = x.shape[1] // ranks
    return x[:, rank * n:(rank + 1) * n].clone()


# ---------------------------------------------------------------- one rank

def _measure(block: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Saved bytes of one forward in train mode, in all and per module (See Note 3)."""
    block.train()
    led = saved_tensors(block, x.requires_grad_(True), model=block)
    return {"bytes": led.total_bytes, "by_module": led.by_module()}


def _gradients(block: nn.Module, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Output, input gradient and parameter gradients (gathered whole) of one eval forward and backward."""
    from torch.distributed.tensor import DTensor

    block.eval()
    x = x.detach().requires_grad_(True)
    out = block(x)
    out.backward(g)
    whole = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731 - collective: every rank
    return out.detach(), x.grad, {name: whole(p.grad) for name, p in block.named_parameters()}


def _numerics(block: nn.Module, config: str, reference: tuple, x: torch.Tensor, g: torch.Tensor, rank: int,
              ranks: int, cfg: GPTConfig, permuted: bool) -> dict[str, Any]:
    """The largest difference from the unsharded block's output and gradients, and whether all are allclose
    (permuted: the block's qkv rows are in qkv_order)."""
    out, x_grad, grads = _gradients(block, _part(x, config, rank, ranks), _part(g, config, rank, ranks))
    ref_out, ref_x_grad, ref_grads = reference
    pairs = [(out, _part(ref_out, config, rank, ranks)), (x_grad, _part(ref_x_grad, config, rank, ranks))]
    order = qkv_order(cfg.hidden, ranks) if permuted else None
    for name, grad in grads.items():
        ref = ref_grads[name]
        pairs.append((grad, ref[order] if order is not None and name.startswith("attn.qkv.") else ref))  # Note 1
    rtol, atol = tolerance(cfg.dtype)
    close = all(a.shape == b.shape and torch.allclose(a, b, rtol=rtol, atol=atol) for a, b in pairs)
    worst = max(float((a - b).abs().max()) if a.shape == b.shape else float("inf") for a, b in pairs)
    return {"allclose": close, "max_abs_diff": worst}


def _rank(rank: int, ranks: int, cfg: GPTConfig, permute_qkv: bool) -> dict[str, Any]:
    """One rank of parallel(): each configuration's saved bytes and numerics."""
    from torch.distributed.device_mesh import init_device_mesh

    warnings.filterwarnings("ignore", message="DTensor random operators")  # See Note 3
    device = device_of(rank, ranks)
    mesh = init_device_mesh(device.type, (ranks,))
    x = gpt_input(cfg, device=device)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(cfg.seed + 2), dtype=cfg.dtype).to(device)
    reference = _gradients(GPTBlock(cfg).to(device), x, g)
    found = {}
    for config in CONFIGURATIONS:
        torch.manual_seed(cfg.seed + rank)  # the dropout masks of this rank
        block = build(config, cfg, mesh if config != "plain" else None, permute_qkv=permute_qkv).to(device)
        found[config] = {**_measure(block, _part(x, config, rank, ranks)),
                         **_numerics(block, config, reference, x, g, rank, ranks, cfg,
                                             permuted=permute_qkv and config != "plain")}
    return found


# ---------------------------------------------------------------- the bench

def parallel(size: Sizes | None = None, *, cfg: GPTConfig | None = None, timeout: float = 120.0,
             permute_qkv: bool = True) -> dict[str, Any]:
    """Each configuration's saved bytes per rank against the kit's prediction and the paper's formula, the
    per-term table, the worst relative error and whether it holds the bar, and the numerics against the
    unsharded block. cfg: a block of one's own instead of the profile's (parallel_config(size));
    permute_qkv=False: the mistake of Note 1, planted (a test hook)."""
    cfg = parallel_config(size or sizes()) if cfg is None else cfg
    import torch.distributed.tensor.parallel  # noqa: F401 - here, once: forked ranks share it (seconds each)
    predicted, paper = predicted_bytes(cfg, RANKS), paper_bytes(cfg, RANKS)
    by_module = predicted_by_module(cfg, RANKS)
    ranks = launch(_rank, cfg, permute_qkv, ranks=RANKS, timeout=timeout)
    configurations, worst = {}, 0.0
    for c in CONFIGURATIONS:
        measured = [r[c]["bytes"] for r in ranks]
        errors = [abs(m - predicted[c]) / predicted[c] for m in measured]
        worst = max(worst, *errors)
        configurations[c] = {"measured_bytes": measured, "predicted_bytes": predicted[c], "rel_error": errors,
                             "paper_formula": PAPER_FORMULAS[c], "paper_bytes": paper[c],
                             "measured_by_module": [r[c]["by_module"] for r in ranks],
                             "predicted_by_module": by_module[c]}
    dropped = fused_with_dropout(cfg, device_of(0, RANKS))
    numerics = {c: {"allclose": all(r[c]["allclose"] for r in ranks),
                    "max_abs_diff": max(r[c]["max_abs_diff"] for r in ranks)} for c in CONFIGURATIONS}
    return {"torch": torch.__version__, "ranks": RANKS,
            "config": {**{k: getattr(cfg, k) for k in ("seq", "batch", "hidden", "heads", "dropout", "seed")},
                       "dtype": str(cfg.dtype).removeprefix("torch."),
                       "element_bytes": torch.empty((), dtype=cfg.dtype).element_size()},
            "configurations": configurations,
            "terms": [dataclasses.asdict(term) for term in parallel_terms(cfg, RANKS)],
            "worst_rel_error": worst, "bar": BAR, "bar_holds": worst <= BAR,
            "numerics": numerics, "tolerance": dict(zip(("rtol", "atol"), tolerance(cfg.dtype))),
            "numerics_match": all(n["allclose"] for n in numerics.values()), "fused_with_dropout": dropped}


def table(figures: dict[str, Any]) -> str:
    """parallel()'s figures as text: the per-term table (the paper's 16-bit bytes and the kit's, per rank), then
    per configuration the paper's formula, the kit's prediction and what each rank measured."""
    terms, names = figures["terms"], CONFIGURATIONS
    w = max(len(f"{t[k][c]:,}") for t in terms for k in ("paper_bytes", "bytes") for c in names) + 2
    name_w, paper_w, kit_w = (max(len(t[k]) for t in terms) for k in ("name", "paper", "kit"))
    lead = name_w + paper_w + kit_w + 4
    lines = [" " * lead + "".join(f"{c:>{2 * w}}" for c in names),
             f"{'term':<{name_w}}  {'paper':>{paper_w}}  {'kit':>{kit_w}}" + f"{'paper':>{w}}{'kit':>{w}}" * len(names)]
    for t in terms:
        cells = "".join(f"{t['paper_bytes'][c]:>{w},}{t['bytes'][c]:>{w},}" for c in names)
        lines.append(f"{t['name']:<{name_w}}  {t['paper']:>{paper_w}}  {t['kit']:>{kit_w}}{cells}")
    lines.append("")
    formula_w = max(len(f["paper_formula"]) for f in figures["configurations"].values())
    for c in names:
        f = figures["configurations"][c]
        measured = ", ".join(f"{m:,}" for m in f["measured_bytes"])
        lines.append(f"{c:<9}  paper {f['paper_formula']:<{formula_w}} = {f['paper_bytes']:>{w},.0f} B   kit "
                     f"predicts {f['predicted_bytes']:>{w},} B   measured per rank {measured}")
    return "\n".join(lines)
