"""Chains of layers: ``MLPChain`` (Linear+ReLU blocks, Chen et al. 2016's labs) and ``layer_chain`` (heavy and
light layers that differ, lab 03's optimal schedule)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from labkit.models.layers import check_float_dtype, check_positive_int, seeded_linear


@dataclass
class MLPConfig:
    """Sizes of an MLPChain."""

    n_layers: int  # number of Linear+ReLU blocks
    width: int  # features in and out of every block
    bias: bool = True  # Linear layers with bias
    dtype: torch.dtype = torch.float32  # parameter and activation dtype
    seed: int = 0  # seeds the local generator that draws the weights

    def __post_init__(self) -> None:
        check_positive_int("n_layers", self.n_layers)
        check_positive_int("width", self.width)
        check_float_dtype(self.dtype)


class MLPChain(nn.Module):
    """n_layers blocks of Linear(width, width) + ReLU; `layers[i]` is block i."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(cfg.seed)
        self.layers = nn.Sequential(*[
            nn.Sequential(seeded_linear(cfg.width, cfg.width, cfg.bias, cfg.dtype, gen, std=None), nn.ReLU())
            for _ in range(cfg.n_layers)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, width) -> (batch, width)."""
        return self.layers(x)


def mlp_input(cfg: MLPConfig, batch: int, requires_grad: bool = False,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """A deterministic (batch, width) input of cfg.dtype on `device` (a leaf), drawn from cfg.seed."""
    check_positive_int("batch", batch)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(batch, cfg.width, generator=gen).to(device=device, dtype=cfg.dtype)
    return x.requires_grad_(requires_grad)


class ChainLayer(nn.Module):
    """A layer of a chain: Linear then GELU ("heavy": a matmul's FLOPs), or GELU alone ("light": none).

    Either way the layer keeps its input and (heavy) the Linear's output for backward, and nothing its
    neighbours keep: its output is kept by the next layer, so per-layer bytes add up without overlap.
    """

    def __init__(self, width: int, heavy: bool, dtype: torch.dtype, gen: torch.Generator) -> None:
        super().__init__()
        self.heavy = heavy
        self.linear = seeded_linear(width, width, True, dtype, gen, std=None) if heavy else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., width) -> (..., width)."""
        return F.gelu(self.linear(x) if self.linear is not None else x)

    def extra_repr(self) -> str:
        return "heavy" if self.heavy else "light"


def layer_chain(kinds: str, width: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Sequential:
    """A chain of ChainLayers, one per letter of `kinds`: "H" heavy, "L" light (e.g. "HL" * 16)."""
    if not isinstance(kinds, str) or not kinds or set(kinds) - {"H", "L"}:
        raise ValueError(f"layer_chain: kinds={kinds!r} must be a non-empty string of 'H' (heavy) and 'L' (light)")
    check_positive_int("width", width)
    check_float_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    return nn.Sequential(*[ChainLayer(width, k == "H", dtype, gen) for k in kinds])
