"""Profiles: one notebook, three problem sizes (tiny for tests, cpu for laptops, gpu for hubs).

tiny and cpu are fixed; gpu is sized to the memory the GPU has free when a
process first asks (labkit.env.sizing), or to $LABKIT_GPU_MEMORY, which also caps
the process's CUDA allocator there (a hub sharing one GPU among several users).
"""
from __future__ import annotations

import functools
import os
import warnings
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
    """Problem sizes of profile `name` (default: the active profile); gpu: sized to this process's GPU."""
    name = profile() if name is None else name
    if name == "gpu":
        return gpu_choice().sizes
    if name not in _SIZES:
        raise ValueError(f"profile {name!r} is unknown; choose one of {', '.join(PROFILES)}")
    return _SIZES[name]


def gpu_choice():  # -> labkit.env.sizing.Choice
    """The gpu profile's sizes for this process's GPU, and why: chosen once per process and value of
    $LABKIT_GPU_MEMORY, so that every cell of a lab sees the same sizes. The allocator's cap follows the
    variable's current value on every call (lifted when it is unset)."""
    from labkit.env.sizing import parse_bytes

    cap = os.environ.get("LABKIT_GPU_MEMORY", "").strip()
    if not torch.cuda.is_available():
        raise ValueError("the gpu profile is sized from a CUDA device's free memory, and torch sees no CUDA "
                         "device; for a given memory run `python -m labkit sizes --profile gpu --memory 16GiB`")
    try:
        limit = parse_bytes(cap) if cap else None
    except ValueError as e:
        raise ValueError(f"LABKIT_GPU_MEMORY: {e}") from None
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    # the allocator refuses to grow past the cap, as on a card of that size; 1.0 lifts an earlier cap
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total) if limit else 1.0)
    return _gpu_choice(limit)


@functools.cache
def _gpu_choice(limit: int | None):  # -> labkit.env.sizing.Choice
    from labkit.env.sizing import choose

    free, _ = torch.cuda.mem_get_info()
    choice = choose(min(free, limit) if limit else free)
    if choice.profile != "gpu":
        warnings.warn(f"labkit: {choice.note}", stacklevel=3)
    return choice
