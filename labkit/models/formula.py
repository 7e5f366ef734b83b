"""Korthikanti et al. 2022's activation memory of one transformer layer, term by term, generalised from 16-bit
activations to any element size."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit.models.gpt import GPTConfig
from labkit.models.layers import check_positive_int


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
    if cfg.autocast is not None and act_bytes is None:
        raise ValueError(f"korthikanti_terms: cfg.autocast={cfg.autocast} runs the ops in two dtypes, and the "
                         "formula counts one; pass act_bytes=, or dataclasses.replace(cfg, autocast=None)")
    act_bytes = torch.empty((), dtype=cfg.dtype).element_size() if act_bytes is None else act_bytes
    check_positive_int("act_bytes", act_bytes)
    check_positive_int("mask_bytes", mask_bytes)
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
