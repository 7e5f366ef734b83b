"""Models the labs checkpoint, and the analytic activation-memory model.

- ``MLPChain``: a plain chain of Linear+ReLU blocks (Chen et al. 2016 labs).
- ``GPTBlock`` / ``GPTStack``: a transformer layer in the Megatron-LM layout,
  with one named submodule per activation term of Korthikanti et al. 2022, so
  that measured saved bytes can be attributed module by module.
- ``GPT``: a whole language model: token and position embeddings, a GPTStack's blocks, and a head
  (lab 07's capstone), with ``gpt_tokens`` for its input and ``next_token_loss`` for its loss.
- ``ConvNet``: a small CNN of Conv+BatchNorm+ReLU blocks (lab 06: BatchNorm under recomputation).
- ``korthikanti_terms`` / ``korthikanti_bytes``: that paper's formula, term by
  term, generalised from 16-bit activations to any element size.

Weights come from a local ``torch.Generator`` seeded by the config: building a
model never advances the global RNG (dropout during forward still does).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MLPConfig", "MLPChain", "mlp_input",
    "ConvNet", "GPTConfig", "Dropout", "CoreAttention", "SelfAttention", "MLP", "GPTBlock", "GPTStack", "gpt_input",
    "GPT", "gpt_tokens", "next_token_loss",
    "ActivationTerm", "korthikanti_terms", "korthikanti_bytes", "parameter_bytes", "gpt_param_count",
]


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int; got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int (>= 1)")


def _check_float_dtype(dtype: object) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype={dtype!r} must be a floating torch.dtype, e.g. torch.float32 or torch.bfloat16")


def _linear(n_in: int, n_out: int, bias: bool, dtype: torch.dtype, gen: torch.Generator, std: float | None) -> nn.Linear:
    """Linear layer filled from `gen`: normal(0, std), or PyTorch's default uniform bound when std is None."""
    if torch.empty(0).is_meta:  # built under torch.device("meta"): shapes only (lab 05 traces large blocks so)
        return nn.Linear(n_in, n_out, bias=bias, dtype=dtype, device="meta")
    layer = nn.utils.skip_init(nn.Linear, n_in, n_out, bias=bias, dtype=dtype)  # no global RNG use
    bound = 1 / math.sqrt(n_in)
    with torch.no_grad():
        # Draw in float32, then round: the same seed gives the same model in every dtype.
        w = torch.empty(n_out, n_in)
        w = w.uniform_(-bound, bound, generator=gen) if std is None else w.normal_(0, std, generator=gen)
        layer.weight.copy_(w)
        if bias:
            b = torch.empty(n_out).uniform_(-bound, bound, generator=gen) if std is None else torch.zeros(n_out)
            layer.bias.copy_(b)
    return layer


# ---------------------------------------------------------------- MLP chain

@dataclass
class MLPConfig:
    """Sizes of an MLPChain."""

    n_layers: int  # number of Linear+ReLU blocks
    width: int  # features in and out of every block
    bias: bool = True  # Linear layers with bias
    dtype: torch.dtype = torch.float32  # parameter and activation dtype
    seed: int = 0  # seeds the local generator that draws the weights

    def __post_init__(self) -> None:
        _check_positive_int("n_layers", self.n_layers)
        _check_positive_int("width", self.width)
        _check_float_dtype(self.dtype)


class MLPChain(nn.Module):
    """n_layers blocks of Linear(width, width) + ReLU; `layers[i]` is block i."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(cfg.seed)
        self.layers = nn.Sequential(*[
            nn.Sequential(_linear(cfg.width, cfg.width, cfg.bias, cfg.dtype, gen, std=None), nn.ReLU())
            for _ in range(cfg.n_layers)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, width) -> (batch, width)."""
        return self.layers(x)


def mlp_input(cfg: MLPConfig, batch: int, requires_grad: bool = False,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """A deterministic (batch, width) input of cfg.dtype on `device` (a leaf), drawn from cfg.seed."""
    _check_positive_int("batch", batch)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(batch, cfg.width, generator=gen).to(device=device, dtype=cfg.dtype)
    return x.requires_grad_(requires_grad)


class ConvNet(nn.Module):
    """`n_blocks` blocks of Conv2d(3x3) + BatchNorm2d + ReLU on (b, channels, size, size), then a mean over the
    image and a Linear to `classes`; `blocks[i]` is block i. Weights drawn from `seed`."""

    def __init__(self, channels: int = 8, n_blocks: int = 3, classes: int = 10, seed: int = 0) -> None:
        super().__init__()
        for name, value in (("channels", channels), ("n_blocks", n_blocks), ("classes", classes)):
            _check_positive_int(name, value)
        with torch.random.fork_rng(devices=[]):  # PyTorch's own initialisation, seeded: the global RNG untouched
            torch.manual_seed(seed)
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
                for _ in range(n_blocks))
            self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, channels, size, size) -> (b, classes)."""
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


# ---------------------------------------------------------------- GPT (Megatron layout)

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

    def __post_init__(self) -> None:
        for name in ("seq", "batch", "hidden", "heads", "n_layers"):
            _check_positive_int(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; "
                             f"choose heads among the divisors of {self.hidden}")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r} must be a number with 0 <= dropout < 1")
        _check_float_dtype(self.dtype)

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
        self.qkv = _linear(h, 3 * h, cfg.bias, cfg.dtype, gen, std=0.02)
        self.core = CoreAttention(cfg)
        self.proj = _linear(h, h, cfg.bias, cfg.dtype, gen, std=0.02)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, s, h) -> (b, s, h)."""
        return self.drop(self.proj(self.core(self.qkv(x))))


class MLP(nn.Module):
    """h -> 4h, GELU, 4h -> h, dropout."""

    def __init__(self, cfg: GPTConfig, gen: torch.Generator) -> None:
        super().__init__()
        h = cfg.hidden
        self.fc1 = _linear(h, 4 * h, cfg.bias, cfg.dtype, gen, std=0.02)
        self.act = nn.GELU()
        self.fc2 = _linear(4 * h, h, cfg.bias, cfg.dtype, gen, std=0.02)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, s, h) -> (b, s, h)."""
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
        _check_positive_int("vocab", vocab)
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
        self.head = _linear(cfg.hidden, vocab, False, cfg.dtype, gen, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(b, s) int64 token ids, s <= cfg.seq -> (b, s, vocab) logits."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"GPT: tokens must be a (batch, seq) int64 tensor, got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        if tokens.shape[1] > self.cfg.seq:
            raise ValueError(f"GPT: a sequence of {tokens.shape[1]} tokens is longer than cfg.seq={self.cfg.seq}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.tok(tokens) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt_tokens(cfg: GPTConfig, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Deterministic (cfg.batch, cfg.seq) token ids below `vocab`, drawn from cfg.seed."""
    _check_positive_int("vocab", vocab)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randint(vocab, (cfg.batch, cfg.seq), generator=gen).to(device)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting tokens[:, 1:] from logits[:, :-1]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


# ---------------------------------------------------------------- analytic model

@dataclass(frozen=True)
class ActivationTerm:
    """One term of Korthikanti's per-layer activation memory."""

    name: str  # what is saved, in the paper's words
    module: str  # submodule of a GPTBlock that saves it, e.g. "attn.core"
    formula: str  # bytes as a multiple of sbh or as²b, e.g. "4·sbh"
    bytes: int  # that formula evaluated for the config


def korthikanti_terms(cfg: GPTConfig, act_bytes: int | None = None, mask_bytes: int = 1) -> list[ActivationTerm]:
    """Activation bytes of ONE layer, term by term (Korthikanti et al. 2022, section 4.1).

    With A = act_bytes (default: the element size of cfg.dtype) and M =
    mask_bytes, the sum is (16·A + 2·M)·sbh + (2·A + M)·as²b; at A=2, M=1 that
    is the paper's sbh·(34 + 5·as/h).
    """
    act_bytes = torch.empty((), dtype=cfg.dtype).element_size() if act_bytes is None else act_bytes
    _check_positive_int("act_bytes", act_bytes)
    _check_positive_int("mask_bytes", mask_bytes)
    s, b, h, a = cfg.seq, cfg.batch, cfg.hidden, cfg.heads
    sbh, as2b = s * b * h, a * s * s * b

    def term(name: str, module: str, k: int, unit: str) -> ActivationTerm:
        return ActivationTerm(name, module, f"{k}·{unit}", k * (sbh if unit == "sbh" else as2b))

    A, M = act_bytes, mask_bytes
    return [
        term("LayerNorm 1 input", "ln1", A, "sbh"),
        term("QKV input", "attn.qkv", A, "sbh"),
        term("Q and K", "attn.core", 2 * A, "sbh"),
        term("softmax output", "attn.core", A, "as²b"),
        term("softmax dropout mask", "attn.core", M, "as²b"),
        term("attention-over-V: dropout output", "attn.core", A, "as²b"),
        term("attention-over-V: V", "attn.core", A, "sbh"),
        term("output-projection input", "attn.proj", A, "sbh"),
        term("attention residual dropout mask", "attn.drop", M, "sbh"),
        term("LayerNorm 2 input", "ln2", A, "sbh"),
        term("fc1 input", "mlp.fc1", A, "sbh"),
        term("GeLU input", "mlp.act", 4 * A, "sbh"),
        term("fc2 input", "mlp.fc2", 4 * A, "sbh"),
        term("MLP dropout mask", "mlp.drop", M, "sbh"),
    ]


def korthikanti_bytes(cfg: GPTConfig, act_bytes: int | None = None, mask_bytes: int = 1) -> int:
    """Activation bytes of the whole stack: the per-layer term sum times n_layers."""
    return cfg.n_layers * sum(t.bytes for t in korthikanti_terms(cfg, act_bytes, mask_bytes))


# ---------------------------------------------------------------- chains of unequal layers (lab 03)

class ChainLayer(nn.Module):
    """A layer of a chain: Linear then GELU ("heavy": a matmul's FLOPs), or GELU alone ("light": none).

    Either way the layer keeps its input and (heavy) the Linear's output for backward, and nothing its
    neighbours keep: its output is kept by the next layer, so per-layer bytes add up without overlap.
    """

    def __init__(self, width: int, heavy: bool, dtype: torch.dtype, gen: torch.Generator) -> None:
        super().__init__()
        self.heavy = heavy
        self.linear = _linear(width, width, True, dtype, gen, std=None) if heavy else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., width) -> (..., width)."""
        return F.gelu(self.linear(x) if self.linear is not None else x)

    def extra_repr(self) -> str:
        return "heavy" if self.heavy else "light"


def layer_chain(kinds: str, width: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Sequential:
    """A chain of ChainLayers, one per letter of `kinds`: "H" heavy, "L" light (e.g. "HL" * 16)."""
    if not isinstance(kinds, str) or not kinds or set(kinds) - {"H", "L"}:
        raise ValueError(f"layer_chain: kinds={kinds!r} must be a non-empty string of 'H' (heavy) and 'L' (light)")
    _check_positive_int("width", width)
    _check_float_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    return nn.Sequential(*[ChainLayer(width, k == "H", dtype, gen) for k in kinds])


def parameter_bytes(model: nn.Module) -> int:
    """Bytes held by the model's (deduplicated) parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def gpt_param_count(cfg: GPTConfig, final_norm: bool = True) -> int:
    """Parameters of GPTStack(cfg): 12h² + 13h per block with bias (12h² + 2h without), plus ln_f."""
    h = cfg.hidden
    per_block = 12 * h * h + (13 * h if cfg.bias else 2 * h)
    ln_f = (2 * h if cfg.bias else h) if final_norm else 0
    return cfg.n_layers * per_block + ln_f
