"""The meter's overhead: the slowdown of one training step measured under it (alternating A/B, median ratio)."""
from __future__ import annotations

from typing import Any

import torch

from labkit.instruments.meter import measure_peak
from labkit.models import GPTStack, gpt_input
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.timing import compare
from labkit.planners.measuring import train_step


def meter(size: Sizes | None = None) -> dict[str, Any]:
    """Slowdown of one CPU training step of the GPT stack under the meter (alternating A/B, median ratio)."""
    size = size or sizes()
    cfg = size.gpt()
    model = GPTStack(cfg)
    opt = torch.optim.Adam(model.parameters())
    x = gpt_input(cfg)

    step = train_step(model, opt, x, lambda y: y.square().mean())
    result = compare(step, lambda: measure_peak(step, track=(model, opt, x)), repeats=size.repeats)
    return {"slowdown": round(result.ratio, 4), "ratios": [round(r, 4) for r in result.ratios]}
