"""The advisor's situation: does the step train, the budget, and each scheme's peak (measured, and as predicted)
and overhead.

Data only: ``labkit.planners.advice.situation`` measures a model to fill one in, and lab 06's Exercise 6.3
(``recommend``) decides from it.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SchemeCost", "Situation", "check_budget"]


@dataclass(frozen=True)
class SchemeCost:
    """A scheme's peak bytes of one training step (measured: what a decision holds to), its extra step time over
    the plain step's (predicted), and the peak as predicted from the plain step's figures (None: not predicted)."""

    peak_bytes: int
    overhead: float  # 0.3: the step takes 30% longer than without checkpointing
    predicted_bytes: int | None = None


@dataclass(frozen=True)
class Situation:
    """What the decision needs: does the step train, the budget, and each scheme's predicted cost."""

    training: bool
    budget: int  # bytes the step may use
    state_bytes: int  # parameters, gradients and optimizer state: no checkpoint changes them
    activation_bytes: int  # what the plain forward saves for backward
    schemes: dict[str, SchemeCost]  # "none" first, then each scheme that applies to this model

    @property
    def activation_share(self) -> float:
        """Saved activations over the plain step's peak."""
        return self.activation_bytes / self.schemes["none"].peak_bytes

    def __str__(self) -> str:
        mib = lambda b: "" if b is None else f"{b / 2**20:,.1f}"  # noqa: E731
        lines = [f"budget {self.budget / 2**20:,.1f} MiB; activations {self.activation_share:.1%} of the plain peak",
                 f"{'scheme':10} {'peak MiB':>9} {'predicted':>10} {'fits':>5} {'overhead':>9}"]
        lines += [f"{name:10} {mib(c.peak_bytes):>9} {mib(c.predicted_bytes):>10} "
                  f"{'yes' if c.peak_bytes <= self.budget else 'no':>5} {c.overhead:>+9.0%}"
                  for name, c in self.schemes.items()]
        return "\n".join(lines)


def check_budget(budget: object, who: str = "budget") -> int:
    """`budget` if it is a positive whole number of bytes: a TypeError naming it when it is not an int (a bool is
    not), a ValueError when it is not positive (the kit's one convention, as lab 03's and lab 04's budgets)."""
    why = (f"{who}: budget={budget!r} ({type(budget).__name__}) must be a positive int of bytes, "
           "e.g. 2 * 2**30 for 2 GiB")
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise TypeError(why)
    if budget <= 0:
        raise ValueError(why)
    return budget
