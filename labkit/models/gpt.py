"""A transformer layer in the Megatron-LM layout, and the stack and language model built of it.

``GPTBlock`` has one named submodule per activation term of Korthikanti et al. 2022, so that measured saved
bytes can be attributed module by module; ``GPTStack`` takes embedded input; ``GPT`` is a whole language
model (lab 07's capstone), with ``gpt_tokens`` for its input and ``next_token_loss`` for its loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from labkit.models.layers import autocast_to, check_autocast, check_float_dtype, check_positive_int, seeded_linear


@dataclass
class GPTConfig:
    """Sizes of a GPT block/stack, named as in Korthikanti et al. 2022."""

    seq: int  # s: sequence length
    batch: int  # b: micro-batch size
    hidden: int  # h: hidden size
    heads: int  # a: attention heads; head dim hd = h / a
    n_layers: int  # transformer layers in a GPTStack
    dropout: float = 0.1  # p of all three dropouts (attention, two residual)
    dtype: torch.dtype = torch.float32  # parameter and activation dtype
    seed: int = 0  # seeds the local generator that draws weights and inputs
    bias: bool = True  # bias in Linear and LayerNorm layers
    # None: every op in dtype. torch.bfloat16 (the gpu profile's time labs, as GPU training runs): each block's,
    # stack's and model's forward runs under torch.autocast in it, over float32 weights, so a recomputation
    # (which calls the same forward) runs in it too
    autocast: torch.dtype | None = None

    def __post_init__(self) -> None:
        for name in ("seq", "batch", "hidden", "heads", "n_layers"):
            check_positive_int(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; "
                             f"choose heads among the divisors of {self.hidden}")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r} must be a number with 0 <= dropout < 1")
        check_float_dtype(self.dtype)
        check_autocast(self.autocast, self.dtype)

    @property
    def head_dim(self) -> int:
        """hd = h / a."""
        return self.hidden // self.heads


class Dropout(nn.Module):
    """Dropout that saves a 1-byte bool mask for backward on every device.

    On CPU, ``nn.Dropout``/``F.dropout`` compute ``x * noise`` and autograd
    saves ``noise`` in the activation dtype (2 or 4 bytes per element); CUDA
    uses ``torch.native_dropout``, which saves a bool mask. Korthikanti's
    formula counts 1-byte masks, so this module calls ``native_dropout``
    everywhere and the CPU ledger matches the GPU one.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"p={p!r} must satisfy 0 <= p < 1")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x with elements zeroed with probability p and the rest scaled by 1/(1-p); identity in eval or p=0."""
        if not self.training or self.p == 0:
            return x
        return torch.native_dropout(x, self.p, True)[0]

    def extra_repr(self) -> str:
        return f"p={self.p}"


class CoreAttention(nn.Module):
    """Causal softmax(q kᵀ / sqrt(hd)) v over heads: the part selective recomputation recomputes."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.scale = 1 / math.sqrt(cfg.head_dim)
        self.drop = Dropout(cfg.dropout)
        # True above the diagonal: position i may not attend to j > i.
        mask = torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).triu(1)  # (s, s)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        """(b, s, 3h) fused q|k|v -> (b, s, h)."""
        b, s, h3 = qkv.shape
        h, a = h3 // 3, self.heads
        # Views of qkv, not copies: (b, s, h) -> (b, a, s, hd), non-contiguous.
        q, k, v = (t.view(b, s, a, h // a).transpose(1, 2) for t in qkv.split(h, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (b, a, s, s); matmul saves contiguous q, k
        # where, not masked_fill: the same values and the same saved mask, and on a CPU masked_fill's kernel is a
        # scalar loop about 2.5x slower (lab 05's roofline shows it)
        scores = torch.where(self.causal_mask[:s, :s], float("-inf"), scores)
        probs = self.drop(F.softmax(scores, dim=-1))  # (b, a, s, s) in the activation dtype
        y = probs @ v  # (b, a, s, hd); matmul saves probs and a contiguous copy of v
        return y.transpose(1, 2).reshape(b, s, h)  # merge heads: (b, s, h)


class SelfAttention(nn.Module):
    """Fused QKV projection, core attention, output projection, residual dropout."""

    def __init__(self, cfg: GPTConfig, gen: torch.Generator) -> None:
        super().__init__()
        h = cfg.hidden
        self.qkv = seeded_linear(h, 3 * h, cfg.bias, cfg.dtype, gen, std=0.02)
        self.core = CoreAttention(cfg)
        self.proj = seeded_linear(h, h, cfg.bias, cfg.dtype, gen, std=0.02)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, s, h) -> (b, s, h)."""
        return self.drop(self.proj(self.core(self.qkv(x))))


class MLP(nn.Module):
    """h -> 4h, GELU, 4h -> h, dropout."""

    def __init__(self, cfg: GPTConfig, gen: torch.Generator) -> None:
        super().__init__()
        h = cfg.hidden
        self.fc1 = seeded_linear(h, 4 * h, cfg.bias, cfg.dtype, gen, std=0.02)
        self.act = nn.GELU()
        self.fc2 = seeded_linear(4 * h, h, cfg.bias, cfg.dtype, gen, std=0.02)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, s, h) -> (b, s, h)."""
        return self.drop(self.fc2(self.act(self.fc1(x))))


class GPTBlock(nn.Module):
    """Pre-LayerNorm transformer layer: x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, cfg: GPTConfig, gen: torch.Generator | None = None) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(cfg.seed) if gen is None else gen
        self.ln1 = nn.LayerNorm(cfg.hidden, bias=cfg.bias, dtype=cfg.dtype)
        self.attn = SelfAttention(cfg, gen)
        self.ln2 = nn.LayerNorm(cfg.hidden, bias=cfg.bias, dtype=cfg.dtype)
        self.mlp = MLP(cfg, gen)
        self.autocast = cfg.autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, s, h) -> (b, s, h)."""
        with autocast_to(self.autocast, x.device):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))


class GPTStack(nn.Module):
    """n_layers GPTBlocks and an optional final LayerNorm; takes embedded (b, s, h) input."""

    def __init__(self, cfg: GPTConfig, final_norm: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(cfg.seed)  # one stream: blocks differ from each other
        self.blocks = nn.ModuleList(GPTBlock(cfg, gen) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden, bias=cfg.bias, dtype=cfg.dtype) if final_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, s, h) -> (b, s, h)."""
        with autocast_to(self.cfg.autocast, x.device):
            for block in self.blocks:
                x = block(x)
            return x if self.ln_f is None else self.ln_f(x)


def gpt_input(cfg: GPTConfig, requires_grad: bool = False, device: torch.device | str = "cpu") -> torch.Tensor:
    """A deterministic (b, s, h) input of cfg.dtype on `device` (a leaf), drawn from cfg.seed."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=gen).to(device=device, dtype=cfg.dtype)
    return x.requires_grad_(requires_grad)


class GPT(nn.Module):
    """A language model: token and position embeddings, embedding dropout, cfg.n_layers GPTBlocks (``blocks``, as
    in GPTStack), a final LayerNorm and an untied head to `vocab` logits. Takes (b, s) token ids."""

    def __init__(self, cfg: GPTConfig, vocab: int) -> None:
        super().__init__()
        check_positive_int("vocab", vocab)
        self.cfg, self.vocab = cfg, vocab
        gen = torch.Generator().manual_seed(cfg.seed)
        self.tok = nn.Embedding(vocab, cfg.hidden, dtype=cfg.dtype)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden, dtype=cfg.dtype)
        with torch.no_grad():
            for emb in (self.tok, self.pos):
                emb.weight.copy_(torch.randn(emb.weight.shape, generator=gen) * 0.02)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(GPTBlock(cfg, gen) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden, bias=cfg.bias, dtype=cfg.dtype)
        self.head = seeded_linear(cfg.hidden, vocab, False, cfg.dtype, gen, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(b, s) int64 token ids, s <= cfg.seq -> (b, s, vocab) logits."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"GPT: tokens must be a (batch, seq) int64 tensor, got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        if tokens.shape[1] > self.cfg.seq:
            raise ValueError(f"GPT: a sequence of {tokens.shape[1]} tokens is longer than cfg.seq={self.cfg.seq}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        with autocast_to(self.cfg.autocast, tokens.device):
            x = self.drop(self.tok(tokens) + self.pos(positions))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))


def gpt_tokens(cfg: GPTConfig, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Deterministic (cfg.batch, cfg.seq) token ids below `vocab`, drawn from cfg.seed."""
    check_positive_int("vocab", vocab)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randint(vocab, (cfg.batch, cfg.seq), generator=gen).to(device)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting tokens[:, 1:] from logits[:, :-1]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def gpt_param_count(cfg: GPTConfig, final_norm: bool = True) -> int:
    """Parameters of GPTStack(cfg): 12h² + 13h per block with bias (12h² + 2h without), plus ln_f."""
    h = cfg.hidden
    per_block = 12 * h * h + (13 * h if cfg.bias else 2 * h)
    ln_f = (2 * h if cfg.bias else h) if final_norm else 0
    return cfg.n_layers * per_block + ln_f
