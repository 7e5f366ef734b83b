"""Models the kit did not build, to hold its planners and instruments against: written here the way outside code
writes them (nn.Dropout, nn.MultiheadAttention, F.scaled_dot_product_attention, RMSNorm, rotary embeddings,
SwiGLU; blocks that return tuples or take keyword arguments; blocks reached through a wrapper; five blocks that
differ; MLP-Mixer's mixing along the sequence), never with the kit's own layers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, seq, head_dim), half-split as LLaMA's code writes it."""
    *_, s, d = x.shape
    freqs = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), freqs)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


class Core(nn.Module):
    """Core attention, as a module of its own (`attn.core`, where the kit's selective way looks for it)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)


class Attention(nn.Module):
    """Causal self-attention through F.scaled_dot_product_attention, rotary, with nn.Dropout on its output."""

    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out, self.drop = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False), nn.Dropout(p)
        self.core = Core()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        y = self.core(q, k, v)
        return self.drop(self.out(y.transpose(1, 2).reshape(b, s, d)))


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int, p: float) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down, self.drop = nn.Linear(hidden, d, bias=False), nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(F.silu(self.gate(x)) * self.up(x)))


class LlamaBlock(nn.Module):
    """A LLaMA-style block: pre-RMSNorm, rotary attention, SwiGLU, nn.Dropout on both residual branches."""

    def __init__(self, d: int = 32, heads: int = 4, hidden: int = 64, p: float = 0.1) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = RMSNorm(d), Attention(d, heads, p), RMSNorm(d), SwiGLU(d, hidden, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MHABlock(nn.Module):
    """A block around nn.MultiheadAttention (which returns a tuple inside the block), with nn.Dropout."""

    def __init__(self, d: int = 32, heads: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mha = nn.MultiheadAttention(d, heads, dropout=p, batch_first=True)
        self.ff, self.drop = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)), nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.mha(h, h, h, need_weights=False)[0]
        return x + self.drop(self.ff(x))


class Stack(nn.Module):
    """An embedding, `blocks`, a head: the shape the kit's planners ask for."""

    def __init__(self, blocks: list[nn.Module], d: int = 32, vocab: int = 50) -> None:
        super().__init__()
        self.embed, self.blocks = nn.Embedding(vocab, d), nn.ModuleList(blocks)
        self.norm, self.head = RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class Wrapped(nn.Module):
    """A model whose blocks live in an inner model and are exposed as `blocks` too (two names, one module)."""

    def __init__(self, inner: Stack) -> None:
        super().__init__()
        self.net = inner
        self.blocks = inner.blocks

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.net(idx)


class TupleBlock(nn.Module):
    """A block that returns (hidden, aux) as Hugging Face blocks do."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.inner = LlamaBlock(d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        return self.inner(x), None


class TupleStack(Stack):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for block in self.blocks:
            h = block(h, mask=None)[0]
        return self.head(self.norm(h))


class NativeDropout(nn.Module):
    """nn.Dropout as an accelerator runs it: one native_dropout (on a CPU, nn.Dropout is empty_like, bernoulli_
    and div_; aten/src/ATen/native/Dropout.cpp, is_fused_kernel_acceptable)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.native_dropout(x, self.p, True)[0] if self.training and self.p > 0 else x


class SoftmaxCore(nn.Module):
    """Core attention written out (scores, causal mask, softmax, dropout on the probabilities, values)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.drop = NativeDropout(p)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return self.drop(scores.softmax(-1)) @ v


class DropoutBlock(nn.Module):
    """A pre-LayerNorm block with dropout on the attention probabilities (`attn.core.drop`) and on both
    residual branches, all as accelerators run nn.Dropout."""

    def __init__(self, d: int = 32, heads: int = 4, p_attn: float = 0.0, p: float = 0.1) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.out, self.attn.core = nn.Linear(d, 3 * d), nn.Linear(d, d), SoftmaxCore(p_attn)
        self.heads, self.drop1, self.drop2 = heads, NativeDropout(p), NativeDropout(p)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.attn.qkv(self.norm1(x)).chunk(3, -1))
        y = self.attn.core(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.drop1(self.attn.out(y))
        return x + self.drop2(self.mlp(self.norm2(x)))


def gpu_dropout_stack(p_attn: float, n: int = 3, d: int = 32, seed: int = 0) -> Stack:
    torch.manual_seed(seed)
    return Stack([DropoutBlock(d, p_attn=p_attn) for _ in range(n)], d)


def llama(n: int = 3, d: int = 32, p: float = 0.1, seed: int = 0) -> Stack:
    torch.manual_seed(seed)
    return Stack([LlamaBlock(d, p=p) for _ in range(n)], d)


def mixed(d: int = 32, seed: int = 0) -> Stack:
    """Five blocks that differ: LLaMA-style of two widths of MLP, dropout on and off, nn.MultiheadAttention."""
    torch.manual_seed(seed)
    return Stack([LlamaBlock(d, hidden=64), MHABlock(d), LlamaBlock(d, hidden=128, p=0.0), MHABlock(d, p=0.0),
                  LlamaBlock(d, hidden=32, p=0.2)], d)


class WideMLP(nn.Module):
    """A pre-RMSNorm residual MLP eight times as wide as the stream, GELU between."""

    def __init__(self, d: int = 32, widen: int = 8) -> None:
        super().__init__()
        self.norm, self.up, self.down = RMSNorm(d), nn.Linear(d, widen * d), nn.Linear(widen * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class SequenceMix(nn.Module):
    """A block that mixes along the sequence, as MLP-Mixer's token mixing does: a Linear over positions."""

    def __init__(self, d: int = 32, seq: int = 32) -> None:
        super().__init__()
        self.norm, self.mix = nn.LayerNorm(d), nn.Linear(seq, seq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mix(self.norm(x).transpose(1, 2)).transpose(1, 2)


class Narrow(nn.Module):
    """A residual bottleneck a quarter as wide as the stream."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.down, self.up = nn.Linear(d, d // 4), nn.Linear(d // 4, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(torch.tanh(self.down(x)))


def five(d: int = 32, seq: int = 32, seed: int = 0) -> Stack:
    """Five blocks that differ: two LLaMA-style ones (RMSNorm, rotary, SwiGLU, nn.Dropout), a wide MLP, a block
    mixing along the sequence (for inputs of `seq` tokens), a narrow one."""
    torch.manual_seed(seed)
    return Stack([LlamaBlock(d, hidden=2 * d), LlamaBlock(d, hidden=2 * d, p=0.2), WideMLP(d), SequenceMix(d, seq),
                  Narrow(d)], d)


def tokens(batch: int = 2, seq: int = 16, vocab: int = 50, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def loss(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().logsumexp(-1).mean()
