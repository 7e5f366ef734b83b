"""Every tensor's life in a region, laid out the way PyTorch's memory viewer draws a snapshot (memory_viz, fed by
``torch.cuda.memory._dump_snapshot``): each storage a band from its allocation to its free, stacked in the
order they were made, so that when one below is freed, those above it fall into its place, and the top of the
stack at every moment is the meter's live total.

``layout`` turns a meter's lifetimes (``MemoryMeter(lifetimes=True)``) into those bands; ``top_at`` says
what is alive at a moment, grouped by ``label`` (the module that made it, or the phase outside any module);
``alive_at`` is the total the bands stack to. labkit.plots.lifetimes draws them.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from labkit.instruments.meter import Lifetime, MemoryMeter

__all__ = ["Band", "label", "layout", "alive_at", "top_at", "lives_of"]

OUTSIDE = {"track": "before the step (tracked)", "forward": "forward, outside modules",
           "backward": "backward (gradients)", "recompute": "recompute, outside modules", "optimizer": "optimizer"}


def label(life: Lifetime, depth: int = 2) -> str:
    """What made a storage: the module whose forward ran (a recomputation's too), named to `depth` parts
    ("blocks.0" for "blocks.0.attn.core" at depth 2), else the phase."""
    if life.module is None:
        return OUTSIDE.get(life.phase, life.phase)
    return ".".join(life.module.split(".")[:depth])


@dataclass(frozen=True)
class Band:
    """One storage's band: from event `xs[0]` to `xs[-1]`, its bottom `bottoms[j]` bytes from xs[j] to xs[j+1]
    (it falls as storages below it are freed), `nbytes` high."""

    life: Lifetime
    xs: tuple[int, ...]
    bottoms: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.life.nbytes


def lives_of(meter: MemoryMeter) -> tuple[list[Lifetime], int]:
    """(the meter's lifetimes, the number of its events)."""
    return meter.lifetimes, len(meter.timeline)


def layout(lives: Sequence[Lifetime], n_events: int) -> list[Band]:
    """The bands of `lives` over events 0..n_events-1 (one before the first, -1, holds what was alive before),
    stacked in the order the storages were made."""
    starts: dict[int, list[int]] = defaultdict(list)
    ends: dict[int, list[int]] = defaultdict(list)
    for k, life in enumerate(lives):
        starts[life.start].append(k)
        if life.end is not None:
            ends[life.end].append(k)
    stack: list[int] = []  # live storages, bottom first
    xs: dict[int, list[int]] = {}
    bottoms: dict[int, list[int]] = {}
    for i in range(-1, n_events):
        gone = set(ends.get(i, ()))
        low = min((p for p, k in enumerate(stack) if k in gone), default=len(stack))
        stack = [k for k in stack if k not in gone]
        for k in starts.get(i, ()):
            xs[k], bottoms[k] = [], []
            stack.append(k)
        below = sum(lives[k].nbytes for k in stack[:low])
        for k in stack[low:]:  # those at or above the lowest change: a new bottom from here
            if not bottoms[k] or bottoms[k][-1] != below:
                xs[k].append(i)
                bottoms[k].append(below)
            below += lives[k].nbytes
    last = n_events - 1
    return [Band(life, (*xs[k], life.end if life.end is not None else last + 1), tuple(bottoms[k]))
            for k, life in enumerate(lives)]


def alive_at(lives: Sequence[Lifetime], i: int) -> list[Lifetime]:
    """The storages counted after event i."""
    return [life for life in lives if life.start <= i and (life.end is None or life.end > i)]


def top_at(lives: Sequence[Lifetime], i: int, k: int = 5, depth: int = 2) -> list[tuple[str, int]]:
    """The k labels (to `depth`) holding the most bytes after event i, with their bytes, most first."""
    held: dict[str, int] = defaultdict(int)
    for life in alive_at(lives, i):
        held[label(life, depth)] += life.nbytes
    return sorted(held.items(), key=lambda kv: -kv[1])[:k]
