"""The capstone: lab 07's model, its measured profile and the budgets it is planned for, in one place that lab 07,
`labkit bench plan` (labkit.bench.plan, labkit.bench.peers) and the leaderboard (labkit.course.grade) share.

``capstone_config`` is the model's shapes (labkit.models.GPT at the profile's GPT shapes); ``capstone`` builds it
and measures its profile (labkit.planners.profiling); ``budget_between`` is one budget between full
recomputation's predicted peak and keeping everything's, ``budgets`` the COUNT of them that `bench plan` races
PyTorch's peers at and the leaderboard races the class at.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit.env.sizes import Sizes
from labkit.models import GPT, GPTConfig, gpt_tokens, next_token_loss
from labkit.planners.profiling import profile_model
from labkit.plans import Profile, peak_of, scheme_plan

__all__ = ["Capstone", "capstone_config", "capstone_model", "capstone", "budget_between", "budgets", "COUNT"]

COUNT = 5  # budgets: `bench plan` races the peers at this many, the leaderboard the class


def capstone_config(size: Sizes, batch: int | None = None, dropout: float = 0.1) -> tuple[GPTConfig, int]:
    """The lab's model: the profile's GPT shapes (`batch` sequences, default the profile's) and a vocabulary of
    4 x hidden tokens; its forward under the profile's autocast (bfloat16 on the gpu profile)."""
    cfg = size.gpt(batch=batch or size.batch, dropout=dropout, autocast=size.amp)
    return cfg, 4 * size.hidden


@dataclass
class Capstone:
    """The lab's model, its input tokens, its loss and its measured profile."""

    model: GPT
    tokens: torch.Tensor
    profile: Profile

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        return next_token_loss(logits, self.tokens)


def capstone_model(size: Sizes, batch: int | None = None, device: str = "cpu") -> tuple[GPT, torch.Tensor]:
    """The lab's model at `batch` on `device`, and its input tokens (drawn from the default generator)."""
    cfg, vocab = capstone_config(size, batch)
    return GPT(cfg, vocab).to(device), gpt_tokens(cfg, vocab, device=device)


def capstone(size: Sizes, batch: int | None = None, repeats: int | None = None) -> Capstone:
    """The lab's model at `batch`, on the profile's device, and its profile."""
    model, tokens = capstone_model(size, batch, size.device)
    prof = profile_model(model, tokens, lambda out: next_token_loss(out, tokens), repeats=repeats or size.repeats)
    return Capstone(model, tokens, prof)


def _ends(profile: Profile, n: int) -> tuple[int, int]:
    """Full recomputation's predicted peak and keeping everything's: the span a budget is drawn from."""
    low, high = (peak_of(scheme_plan(name, n), profile) for name in ("full", "none"))
    return low, high


def budget_between(profile: Profile, n: int, share: float = 0.85) -> int:
    """A budget `share` of the way from full recomputation's predicted peak up to keeping everything's."""
    low, high = _ends(profile, n)
    return int(low + share * (high - low))


def budgets(profile: Profile, n: int, count: int = COUNT) -> list[int]:
    """`count` budgets spread between full recomputation's predicted peak and keeping everything's (not at
    either end: at full's own peak only full fits, at none's nothing needs planning)."""
    low, high = _ends(profile, n)
    return [int(low + (high - low) * (k + 0.5) / count) for k in range(count)]
