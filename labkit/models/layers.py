"""What every model of the kit shares: argument checks, seeded Linear layers, autocast, parameter bytes.

Weights come from a local ``torch.Generator`` seeded by the config: building a model never advances the global
RNG (dropout during forward still does).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import nn


def check_positive_int(name: str, value: object) -> None:
    """A TypeError or ValueError naming `name` unless `value` is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int; got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int (>= 1)")


def check_float_dtype(dtype: object) -> None:
    """A TypeError naming `dtype` unless it is a floating torch.dtype."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype={dtype!r} must be a floating torch.dtype, e.g. torch.float32 or torch.bfloat16")


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """"bfloat16" for torch.bfloat16 (as JSON and labels print it); None for None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def check_autocast(autocast: object, dtype: torch.dtype) -> None:
    """A TypeError naming `autocast` unless it is None, or torch.bfloat16 or torch.float16 over float32 weights."""
    if autocast is None:
        return
    if autocast not in (torch.bfloat16, torch.float16):
        raise TypeError(f"autocast={autocast!r} must be None, torch.bfloat16 or torch.float16 (the dtype "
                        "torch.autocast runs matmuls in)")
    if dtype != torch.float32:
        raise TypeError(f"autocast={autocast} needs float32 weights (dtype=torch.float32), got dtype={dtype}: "
                        "autocast runs a float32 model's matmuls in a lower precision")


def autocast_to(autocast: torch.dtype | None, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """torch.autocast on `device`'s type in `autocast`, or nothing when it is None. A device autocast does not
    run on (meta) is refused: its ops would run in float32, and their bytes be silently other than autocast's."""
    if autocast is None:
        return contextlib.nullcontext()
    if not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"autocast={autocast} on a {device.type} tensor: torch.autocast does not run on "
                         f"{device.type!r}; build the model with dataclasses.replace(cfg, autocast=None)")
    return torch.autocast(device.type, dtype=autocast)


def seeded_linear(n_in: int, n_out: int, bias: bool, dtype: torch.dtype, gen: torch.Generator,
                  std: float | None) -> nn.Linear:
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


def parameter_bytes(model: nn.Module) -> int:
    """Bytes held by the model's (deduplicated) parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
