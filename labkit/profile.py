"""Profiles: one notebook, three problem sizes (tiny for tests, cpu for laptops, gpu for hubs)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

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


_SIZES = {
    "tiny": Sizes("tiny", "cpu", mlp_layers=4, mlp_width=32, mlp_batch=8,
                  seq=16, batch=2, hidden=32, heads=2, gpt_layers=2, repeats=3,
                  chain_width=32, chain_batch=8, chain_layers=(4, 16),
                  long_seq=32, long_batch=1, long_hidden=16, long_heads=2, long_layers=2),
    "cpu": Sizes("cpu", "cpu", mlp_layers=16, mlp_width=256, mlp_batch=256,
                 seq=128, batch=4, hidden=128, heads=4, gpt_layers=4, repeats=7,
                 chain_width=512, chain_batch=256, chain_layers=(16, 64),
                 long_seq=1024, long_batch=1, long_hidden=128, long_heads=2, long_layers=2),
    "gpu": Sizes("gpu", "cuda", mlp_layers=32, mlp_width=2048, mlp_batch=4096,
                 seq=2048, batch=4, hidden=1024, heads=16, gpt_layers=8, repeats=20,
                 chain_width=2048, chain_batch=2048, chain_layers=(16, 64, 256),
                 long_seq=2048, long_batch=2, long_hidden=1024, long_heads=16, long_layers=4),
}


def profile() -> str:
    """Name of the active profile: $LABKIT_PROFILE, else "gpu" with CUDA, else "cpu"."""
    name = os.environ.get("LABKIT_PROFILE", "").strip().lower()
    if not name:
        return "gpu" if torch.cuda.is_available() else "cpu"
    if name not in PROFILES:
        raise ValueError(f"LABKIT_PROFILE={name!r} is not a profile; choose one of {', '.join(PROFILES)}")
    if name == "gpu" and not torch.cuda.is_available():
        raise ValueError("LABKIT_PROFILE='gpu' but torch sees no CUDA device; unset it or choose 'cpu'")
    return name


def sizes(name: str | None = None) -> Sizes:
    """Problem sizes of profile `name` (default: the active profile)."""
    name = profile() if name is None else name
    if name not in _SIZES:
        raise ValueError(f"profile {name!r} is unknown; choose one of {', '.join(PROFILES)}")
    return _SIZES[name]
