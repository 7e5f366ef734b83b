"""Lab 07's plan for a memory budget: what each block costs, and what a plan of them predicts.

A *profile* says, for each block of a model, what running it each way costs: bytes it keeps from its forward
until its backward, bytes alive while its backward runs, and the seconds it adds to a step. The ways:

- ``keep``: run plainly; it keeps everything it saves (``act``, its input included);
- ``selective``: core attention recomputed (lab 04's policy, PyTorch's selective checkpoint API), offered only
  where it keeps no more than keep (with attention that saves no scores, as F.scaled_dot_product_attention,
  it can keep more);
- ``offload``: on a GPU, saved tensors moved to pinned host memory in forward and back in backward (its input
  counted as kept on the device all the same: a selective block before it keeps that tensor);
- ``recompute``: a *segment* of blocks [start, stop) under one checkpoint (lab 02's ``checkpoint_hooks``): it
  keeps the first block's input, and backward rebuilds all its blocks' activations at once.

A *plan* is a list of ``Step(start, stop, how)`` covering the blocks in order. ``peak_of`` predicts its peak the
way lab 03's did, per block, with the two moments a step's peak can fall at:

- the top of the step, between the blocks' forward and their backward: every byte the blocks keep, plus ``base``
  (everything else then: parameters, the optimizer's state, the embedding's and the head's activations, the
  logits and their gradient);
- a block's backward: what the blocks before it keep, what it holds (a segment: its blocks' act, rebuilt at
  once, then freed block by block from the last), plus the block's ``beside`` (everything else then:
  parameters, the optimizer's state, the gradients made so far, its own and every later block's included, the
  gradient flowing back; or, where more, what is alive beside its act while it is rebuilt: the output and the
  forward's temporaries a rebuild remakes, which its backward need not have alive).

Nothing falls below ``floor``, the peak of the moments no plan changes: the optimizer step, and what comes before
the blocks (an embedding, say) running its forward or, after theirs, its backward.

Everything here is data and sums; ``labkit.planners.profiling.profile_model`` measures a profile, and
``labkit.planners.applying.applied`` runs a plan for real.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["KEEP", "SELECTIVE", "OFFLOAD", "RECOMPUTE", "Option", "BlockCosts", "Profile", "Step", "check_plan",
           "peak_of", "seconds_of", "step_ratio", "scheme_plan", "sqrt_n_segments", "SCHEMES", "describe"]

KEEP, SELECTIVE, OFFLOAD, RECOMPUTE = "keep", "selective", "offload", "recompute"
SCHEMES = ("none", "full", "sqrt_n", "selective")  # the fixed schemes of labs 02-04, as plans


def _check_bytes(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what}={value!r} must be a whole number of bytes, 0 or more")


def _check_seconds(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise ValueError(f"{what}={value!r} must be a finite number of seconds, 0 or more")


@dataclass(frozen=True)
class Option:
    """One way to run a single block: the bytes it keeps from its forward until its backward, the bytes alive
    while its backward runs (what it keeps and what it rebuilds: at least `kept`), the seconds it adds."""

    kept: int
    held: int
    seconds: float

    def __post_init__(self) -> None:
        _check_bytes(self.kept, "Option: kept")
        _check_bytes(self.held, "Option: held")
        _check_seconds(self.seconds, "Option: seconds")
        if self.held < self.kept:
            raise ValueError(f"Option: held={self.held:,} B is less than kept={self.kept:,} B; backward holds at "
                             "least what forward kept")


@dataclass(frozen=True)
class BlockCosts:
    """What a plan knows of one block: its saved bytes, its input's, its forward's seconds, and its other ways."""

    act: int  # bytes the block saves when run plainly, its input included
    inp: int  # bytes of its input: what a recomputed segment starting at this block keeps
    fwd: float  # seconds of its forward recording a graph: what recomputing it costs
    options: Mapping[str, Option] = field(default_factory=dict)  # its single-block ways besides keep
    beside: int = 0  # bytes alive beside the blocks' activations while its backward runs (see the module's doc)
    unknown: Mapping[str, str] = field(default_factory=dict)  # ways the profile could not price, and why

    def __post_init__(self) -> None:
        _check_bytes(self.act, "BlockCosts: act")
        _check_bytes(self.beside, "BlockCosts: beside")
        _check_bytes(self.inp, "BlockCosts: inp")
        _check_seconds(self.fwd, "BlockCosts: fwd")
        for name, o in self.options.items():
            if name in (KEEP, RECOMPUTE) or not isinstance(o, Option):
                raise ValueError(f"BlockCosts: options[{name!r}] must be an Option named other than "
                                 f"{KEEP!r} and {RECOMPUTE!r} (those two every block has)")
        for name, why in self.unknown.items():
            if name in (KEEP, RECOMPUTE, *self.options) or not isinstance(why, str):
                raise ValueError(f"BlockCosts: unknown[{name!r}]={why!r} must say why a way it has no Option for "
                                 f"is not priced (a string), named other than {KEEP!r} and {RECOMPUTE!r}")

    def ways(self) -> dict[str, Option]:
        """Every single-block way offered, keep first: a way that keeps more than keeping the block never is
        (it would lose to keep on bytes and on seconds alike; ``not_offered`` says why)."""
        return {KEEP: Option(self.act, self.act, 0.0),
                **{name: o for name, o in self.options.items() if o.kept <= self.act}}

    def priced(self) -> dict[str, Option]:
        """Every single-block way the profile priced, keep first, offered or not: what an explicit plan (a fixed
        scheme such as Megatron's selective everywhere, a baseline) may run and peak_of predicts exactly. A
        planner chooses among ways() only."""
        return {KEEP: Option(self.act, self.act, 0.0), **self.options}

    def not_offered(self) -> dict[str, str]:
        """Each way the block has not offered, and why: the profile could not price it, or it keeps more than
        keeping the block."""
        losing = {name: f"it would keep {o.kept:,} B, more than keeping the block ({self.act:,} B)"
                  for name, o in self.options.items() if o.kept > self.act}
        return {**self.unknown, **losing}


@dataclass(frozen=True)
class Profile:
    """A model's blocks' costs, and what no plan changes."""

    blocks: tuple[BlockCosts, ...]
    base: int  # bytes beside what the blocks keep at the step's top, between their forward and their backward
    floor: int  # the peak of the moments no plan changes (the optimizer step's, say): no plan goes below it
    step: float  # seconds of the plain step

    def __post_init__(self) -> None:
        if not isinstance(self.blocks, tuple) or not self.blocks or \
                not all(isinstance(b, BlockCosts) for b in self.blocks):
            raise ValueError(f"Profile: blocks must be a non-empty tuple of BlockCosts, got {self.blocks!r:.80}")
        _check_bytes(self.base, "Profile: base")
        _check_bytes(self.floor, "Profile: floor")
        _check_seconds(self.step, "Profile: step")
        if self.step <= 0:
            raise ValueError(f"Profile: step={self.step!r} seconds must be more than 0")


@dataclass(frozen=True)
class Step:
    """Blocks [start, stop) run one way: `how` is "recompute" (one segment) or a block's way (one block)."""

    start: int
    stop: int
    how: str


def check_plan(plan: object, profile: Profile) -> list[Step]:
    """The plan as a list, or a ValueError naming what is wrong: the steps must cover the blocks in order, each
    non-empty; a way other than recompute covers one block, and that block must have it priced (offered to a
    planner or not: a fixed scheme may run a way that loses to keep, and is predicted exactly)."""
    n = len(profile.blocks)
    if not isinstance(plan, (list, tuple)) or not all(isinstance(s, Step) for s in plan):
        raise ValueError(f"a plan must be a list of Step, got {plan!r:.100}")
    at = 0
    for s in plan:
        if s.start != at or s.stop <= s.start or s.stop > n:
            raise ValueError(f"plan: {s} does not continue at block {at} (the steps must cover blocks 0..{n} in "
                             "order, each non-empty)")
        if s.how != RECOMPUTE and (s.stop != s.start + 1 or s.how not in profile.blocks[s.start].priced()):
            block = profile.blocks[s.start]
            why = "".join(f"; not {name}: {reason}" for name, reason in block.unknown.items())
            raise ValueError(f"plan: {s}: {s.how!r} runs one block that has it; block {s.start} has "
                             f"{', '.join([*block.priced(), RECOMPUTE])}{why}")
        at = s.stop
    if at != n:
        raise ValueError(f"plan: the steps stop at block {at}, not at the last block's end ({n})")
    return list(plan)


def _costs(s: Step, profile: Profile) -> tuple[int, int, float]:
    """(kept, need, seconds) of one step of a plan: need is the most its backward has alive besides what the
    steps before it keep (a segment's backward runs its blocks' from the last, each freeing its act)."""
    blocks = profile.blocks[s.start:s.stop]
    if s.how == RECOMPUTE:
        rebuilt, need = 0, 0
        for b in blocks:
            rebuilt += b.act
            need = max(need, rebuilt + b.beside)
        return blocks[0].inp, need, sum(b.fwd for b in blocks)
    o = blocks[0].priced()[s.how]
    return o.kept, o.held + blocks[0].beside, o.seconds


def peak_of(plan: Sequence[Step], profile: Profile) -> int:
    """Predicted peak bytes of a step under the plan (see the module's doc)."""
    kept, worst = 0, 0  # bytes the steps so far keep; the worst backward so far
    for s in check_plan(plan, profile):
        kept_here, need, _ = _costs(s, profile)
        worst = max(worst, kept + need)  # its backward: what the blocks before it keep, and what it needs
        kept += kept_here
    return max(profile.floor, profile.base + kept, worst)


def seconds_of(plan: Sequence[Step], profile: Profile) -> float:
    """Predicted seconds the plan adds to a step."""
    return sum(_costs(s, profile)[2] for s in check_plan(plan, profile))


def step_ratio(plan: Sequence[Step], profile: Profile) -> float:
    """Predicted step time under the plan over the plain step's."""
    return 1 + seconds_of(plan, profile) / profile.step


def scheme_plan(name: str, n: int) -> list[Step]:
    """A fixed scheme as a plan of n blocks: none (keep all), full (each block its own segment), sqrt_n
    (round(sqrt(n)) segments of n // k blocks, the last plain, as checkpoint_sequential), selective."""
    if name == "none":
        return [Step(i, i + 1, KEEP) for i in range(n)]
    if name == "full":
        return [Step(i, i + 1, RECOMPUTE) for i in range(n)]
    if name == "selective":
        return [Step(i, i + 1, SELECTIVE) for i in range(n)]
    if name == "sqrt_n":
        *segments, last = sqrt_n_segments(n)
        return [Step(s.start, s.stop, RECOMPUTE) for s in segments] + [Step(i, i + 1, KEEP) for i in last]
    raise ValueError(f"scheme_plan: {name!r} is not a scheme; choose one of {', '.join(SCHEMES)}")


def sqrt_n_segments(n: int) -> list[range]:
    """The blocks of n, cut as torch.utils.checkpoint.checkpoint_sequential cuts them for round(sqrt(n))
    segments: each of n // k blocks, the last taking the rest (and run plainly by checkpoint_sequential)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"sqrt_n_segments: n={n!r} must be an int >= 1")
    k = max(1, round(math.sqrt(n)))
    size = n // k
    return [range(i * size, (i + 1) * size if i < k - 1 else n) for i in range(k)]


def describe(plan: Sequence[Step]) -> str:
    """A plan in one line: "keep 0-1 | recompute 2-3" (block ranges, inclusive)."""
    parts: list[tuple[str, int, int]] = []
    for s in plan:
        if parts and parts[-1][0] == s.how and s.how != RECOMPUTE and parts[-1][2] == s.start:
            parts[-1] = (s.how, parts[-1][1], s.stop)
        else:
            parts.append((s.how, s.start, s.stop))
    return " | ".join(f"{how} {a}" + (f"-{b - 1}" if b - 1 > a else "") for how, a, b in parts)
