"""The problem sizes of each profile: one table, read by every lab (`lk.sizes()`).

tiny and cpu are fixed; the gpu profile is GPU_SHAPES with every batch multiplied by a scale fitted to the GPU's
free memory (labkit.env.sizing). `Sizes.gpt()` and `Sizes.long_gpt()` are the one conversion from a profile's
sizes to a model's config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from labkit.models import GPTConfig

PROFILES = ("tiny", "cpu", "gpu")


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one profile; every lab reads its sizes from here."""

    name: str  # "tiny" | "cpu" | "gpu"
    device: str  # where the labs put tensors: "cpu" or "cuda"
    # MLP chain: n_layers Linear+ReLU blocks of `width`, batch `batch`
    mlp_layers: int
    mlp_width: int
    mlp_batch: int
    # GPT stack (Megatron layout): sequence s, batch b, hidden h, heads a
    seq: int
    batch: int
    hidden: int
    heads: int
    gpt_layers: int
    repeats: int  # timing repeats per measurement
    # chains of lab 03: Linear(width, width) + ReLU layers at batch chain_batch, of each length in chain_layers
    chain_width: int = 32
    chain_batch: int = 8
    chain_layers: tuple[int, ...] = (4, 16)
    # labs 04-05: a long-sequence GPT stack, where attention's (b, a, s, s) tensors dominate (5as/h >> 34)
    long_seq: int = 32
    long_batch: int = 1
    long_hidden: int = 16
    long_heads: int = 2
    long_layers: int = 2
    # the dtype the labs whose lesson is time or bandwidth (02, 04-07) run their steps in under torch.autocast, as
    # GPU training does: "bfloat16" on the gpu profile; None (float32 throughout) on the CPU profiles and in the
    # memory lessons. Read it as a torch.dtype with `amp`
    autocast: str | None = None

    def __post_init__(self) -> None:
        if self.autocast not in (None, "bfloat16"):  # float16 would need a GradScaler, which the labs do not use
            raise ValueError(f"Sizes.autocast={self.autocast!r} must be None or 'bfloat16'")

    @property
    def amp(self) -> torch.dtype | None:
        """`autocast` as a torch.dtype (GPTConfig's autocast=), or None."""
        return None if self.autocast is None else getattr(torch, self.autocast)

    def gpt(self, **changes: Any) -> GPTConfig:
        """The profile's GPT stack: seq, batch, hidden, heads and n_layers (gpt_layers) from these sizes, any
        GPTConfig field changed by `changes` (``size.gpt(n_layers=2 * size.gpt_layers, dropout=0.0)``)."""
        return GPTConfig(**{"seq": self.seq, "batch": self.batch, "hidden": self.hidden, "heads": self.heads,
                            "n_layers": self.gpt_layers, **changes})

    def long_gpt(self, **changes: Any) -> GPTConfig:
        """The profile's long-sequence stack (labs 04-05), any GPTConfig field changed by `changes`."""
        return GPTConfig(**{"seq": self.long_seq, "batch": self.long_batch, "hidden": self.long_hidden,
                            "heads": self.long_heads, "n_layers": self.long_layers, **changes})


FIXED = {  # the profiles whose sizes do not depend on the machine
    "tiny": Sizes("tiny", "cpu", mlp_layers=4, mlp_width=32, mlp_batch=8,
                  seq=16, batch=2, hidden=32, heads=2, gpt_layers=2, repeats=3,
                  chain_width=32, chain_batch=8, chain_layers=(4, 16),
                  long_seq=32, long_batch=1, long_hidden=16, long_heads=2, long_layers=2),
    "cpu": Sizes("cpu", "cpu", mlp_layers=16, mlp_width=256, mlp_batch=256,
                 seq=128, batch=4, hidden=128, heads=4, gpt_layers=4, repeats=7,
                 chain_width=512, chain_batch=256, chain_layers=(16, 64),
                 long_seq=1024, long_batch=1, long_hidden=128, long_heads=2, long_layers=2),
}

# The gpu profile's shapes at scale 1, which fit the floor: GPT-2 small's width (h = 768, a = 12) at s = 512, and a
# long-sequence stack with 5as/h = 160. Every batch below is multiplied by the scale.
GPU_SHAPES = Sizes("gpu", "cuda", mlp_layers=32, mlp_width=1024, mlp_batch=512,
                   seq=512, batch=1, hidden=768, heads=12, gpt_layers=8, repeats=20,
                   chain_width=512, chain_batch=1024, chain_layers=(16, 64, 256),
                   long_seq=2048, long_batch=1, long_hidden=512, long_heads=8, long_layers=2, autocast="bfloat16")

# lab 05's ceilings are measured at these sizes, per profile: square matmul sides, a copy's buffer in MiB (well
# above the last-level cache on cpu and gpu; 512 MiB keeps the gpu profile's floor), random draws per
# measurement, exp elements (small enough to stay in cache)
MEASURE_SIZES = {"tiny": ((64, 128), 8, 2 ** 14, 2 ** 12), "cpu": ((512, 1024, 2048), 256, 2 ** 22, 2 ** 16),
                 "gpu": ((4096, 8192), 512, 2 ** 26, 2 ** 22)}
