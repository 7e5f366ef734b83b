"""``ConvNet``: a small CNN of Conv+BatchNorm+ReLU blocks (lab 06: BatchNorm under recomputation)."""
from __future__ import annotations

import torch
from torch import nn

from labkit.models.layers import check_positive_int


class ConvNet(nn.Module):
    """`n_blocks` blocks of Conv2d(3x3) + BatchNorm2d + ReLU on (b, channels, size, size), then a mean over the
    image and a Linear to `classes`; `blocks[i]` is block i. Weights drawn from `seed`."""

    def __init__(self, channels: int = 8, n_blocks: int = 3, classes: int = 10, seed: int = 0) -> None:
        super().__init__()
        for name, value in (("channels", channels), ("n_blocks", n_blocks), ("classes", classes)):
            check_positive_int(name, value)
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
