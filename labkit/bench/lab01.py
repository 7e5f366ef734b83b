"""Lab 01's benchmark: the ledger of one bfloat16 GPT block against Korthikanti et al.'s formula."""
from __future__ import annotations

from typing import Any

import torch

from labkit.instruments.ledger import saved_tensors
from labkit.models import GPTBlock, GPTConfig, gpt_input, korthikanti_bytes


def formula_configs() -> list[GPTConfig]:
    """bfloat16 GPT blocks from MLP-dominated (s/h small) to attention-dominated (s/h large), CPU-sized."""
    shapes = [(32, 4, 512, 8), (128, 2, 256, 4), (256, 2, 128, 4), (512, 1, 64, 4)]  # (s, b, h, a)
    return [GPTConfig(seq=s, batch=b, hidden=h, heads=a, n_layers=1, dtype=torch.bfloat16) for s, b, h, a in shapes]


def formula() -> dict[str, Any]:
    """Ledger total of one bf16 GPT block against Korthikanti et al.'s s·b·h·(34 + 5·a·s/h)."""
    rows = []
    for cfg in formula_configs():
        block = GPTBlock(cfg)
        measured = saved_tensors(block, gpt_input(cfg), model=block).total_bytes
        rows.append({"s": cfg.seq, "b": cfg.batch, "h": cfg.hidden, "a": cfg.heads,
                     "measured_bytes": measured, "formula_bytes": korthikanti_bytes(cfg, act_bytes=2, mask_bytes=1)})
    worst = max(abs(r["measured_bytes"] - r["formula_bytes"]) / r["formula_bytes"] for r in rows)
    return {"configs": rows, "max_rel_error": round(worst, 6)}
