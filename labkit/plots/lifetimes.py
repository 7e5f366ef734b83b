"""Every tensor's life in a step, drawn: the bands of labkit.instruments.lifetimes (lifetimes, lifetimes_compared)
and what is alive at one moment of it (step_moment; step_frames, the step player's static twin)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from labkit.instruments.meter import MemoryMeter
from labkit.plots.base import PHASE_COLOURS, MiB, _new, _phase_spans

__all__ = ["lifetimes", "lifetimes_compared", "step_moment", "step_frames", "moments"]


GREY = (0.75, 0.75, 0.75, 1.0)


def _colours(meters: Sequence[MemoryMeter], colours: int, depth: int) -> dict[str, tuple]:
    """One colour per label, the same in every panel: the `colours` labels holding the most at any of the
    meters' peaks (the rest are grey)."""
    from labkit.instruments.lifetimes import top_at

    most: dict[str, int] = {}
    for meter in meters:
        n = len(meter.timeline)
        peak = max(range(n), key=lambda i: meter.timeline[i].live_bytes, default=0)
        for name, held in top_at(meter.lifetimes, peak, k=len(meter.lifetimes) or 1, depth=depth):
            most[name] = max(most.get(name, 0), held)
    palette = plt.get_cmap("tab10")
    chosen = sorted(most, key=lambda k: -most[k])[:colours]
    return {name: palette(j % 10) for j, name in enumerate(chosen)}


def lifetimes(meter: MemoryMeter, title: str = "every tensor's life in one step", colours: int = 8, depth: int = 2,
              ax=None, top: float | None = None, colour: Mapping[str, tuple] | None = None,
              notes: bool = True) -> Figure:
    """Each storage a band from its allocation to its free, stacked in the order they were made (the layout of
    PyTorch's memory viewer), coloured by the module that made it, named to `depth` parts (the `colours`
    largest at the peak; the rest grey), phases along the bottom, the peak marked (`notes`: with what holds
    the most then). The meter must have recorded lifetimes (MemoryMeter(..., lifetimes=True)). ax, top, colour:
    draw on that axes, up to `top` bytes, with those colours (to set several side by side alike)."""
    from matplotlib.collections import PolyCollection

    from labkit.instruments.lifetimes import label, layout, top_at

    if not isinstance(meter, MemoryMeter):
        raise TypeError(f"lifetimes: expected a MemoryMeter, got {type(meter).__name__}")
    lives, n = meter.lifetimes, len(meter.timeline)
    peak = max(range(n), key=lambda i: meter.timeline[i].live_bytes, default=0)
    colour = colour if colour is not None else _colours([meter], colours, depth)
    fig, axes = (ax.figure, [ax]) if ax is not None else _new(width=9.0, height=4.2)
    ax = axes[0]
    polys, faces = [], []
    for b in layout(lives, n):
        xs, lows, hi = b.xs, [v / MiB for v in b.bottoms], b.nbytes / MiB
        bottom = [(x, y) for j, y in enumerate(lows) for x in (xs[j], xs[j + 1])]
        polys.append(bottom + [(x, y + hi) for x, y in reversed(bottom)])
        faces.append(colour.get(label(b.life, depth), GREY))
    ax.add_collection(PolyCollection(polys, facecolors=faces, edgecolors="none"))
    for phase, first, last in _phase_spans(meter):
        ax.axvspan(first, last + 1, ymax=0.025, color=PHASE_COLOURS.get(phase, "#cccccc"), linewidth=0)
    live = meter.timeline[peak].live_bytes / MiB if n else 0.0
    ax.set_xlim(-1, n)
    ax.set_ylim(0, 1.45 * max(live, top / MiB if top else 0.0, 1e-9))
    ax.axvline(peak, color="crimson", linewidth=0.8)
    note = f"peak {live:.1f} MiB at event {peak} ({meter.timeline[peak].phase if n else ''})"
    if notes:
        note += ":\n" + "\n".join(f"{name[:28]} {b / MiB:.1f} MiB" for name, b in top_at(lives, peak, 4, depth))
    ax.text(0.99, 0.97, note, transform=ax.transAxes, ha="right", va="top", fontsize=7, color="crimson",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    if notes:
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colour.values()]
        ax.legend(handles, [name[:30] for name in colour], fontsize=7, loc="upper left", ncol=2)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("allocation / free event (phases along the bottom)")
    ax.set_ylabel("live tensor MiB")
    return fig


def lifetimes_compared(meters: Mapping[str, MemoryMeter], title: str = "", depth: int = 2,
                       colours: int = 10) -> Figure:
    """lifetimes() of several steps side by side, on one memory scale and in one set of colours (one legend,
    below them)."""
    if not meters:
        raise ValueError("lifetimes_compared: no meters given; pass {'none': meter_a, 'checkpoint': meter_b}")
    fig, axes = _new(len(meters), width=4.6 * len(meters), height=4.4, sharey=True)
    top = max((e.live_bytes for m in meters.values() for e in m.timeline), default=1)
    colour = _colours(list(meters.values()), colours, depth)
    for ax, (name, meter) in zip(axes, meters.items()):
        lifetimes(meter, title=name, ax=ax, top=top, depth=depth, colour=colour, notes=False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colour.values()]
    fig.legend(handles, [name[:30] for name in colour], fontsize=8, loc="lower center", ncol=min(len(colour), 6))
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig

def _groups(meter: MemoryMeter, i: int, depth: int) -> list[tuple[str, int]]:
    """What is alive after event i, grouped: the state from before the step; each block's activations (its
    forward's); what a recomputation rebuilt; the gradients; the optimizer's; in that order, empty groups left
    out."""
    from labkit.instruments.lifetimes import alive_at, label

    held: dict[str, int] = {}
    for life in alive_at(meter.lifetimes, i):
        if life.phase == "recompute":
            name = "recomputed"
        elif life.phase == "forward":
            name = f"kept: {label(life, depth) if life.module is not None else 'outside the blocks'}"
        else:
            name = label(life, depth)
        held[name] = held.get(name, 0) + life.nbytes
    first = [k for k in held if k.startswith("before")]
    kept = sorted(k for k in held if k.startswith("kept: "))
    rest = [k for k in held if k not in first and k not in kept]
    return [(k, held[k]) for k in (*first, *kept, *rest)]


def _bar(ax, groups: list[tuple[str, int]], budget: int | None, top: float) -> None:
    bottom = 0.0
    palette = plt.get_cmap("tab20")
    for j, (name, nbytes) in enumerate(groups):
        ax.bar(0, nbytes / MiB, bottom=bottom, color=palette(j % 20), width=0.6, label=f"{name[:26]} {nbytes / MiB:.1f}")
        bottom += nbytes / MiB
    if budget is not None:
        ax.axhline(budget / MiB, color="crimson", linestyle="--", linewidth=1)
    ax.set_xlim(-0.5, 0.5)
    ax.set_xticks([])
    ax.set_ylim(0, top / MiB)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def step_moment(meter: MemoryMeter, i: int, budget: int | None = None, depth: int = 2, title: str = "") -> Figure:
    """One moment of a measured step: the live total over the step with the moment marked (and the budget), and
    what is alive then, stacked: the state from before the step, each block's kept activations, what a
    recomputation has rebuilt, the gradients (the step player's frame; lifetimes=True meters)."""
    n = len(meter.timeline)
    if not n:
        raise ValueError("step_moment: the meter recorded no event (nothing was allocated or freed in its region)")
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
        raise ValueError(f"step_moment: i={i!r} must be an event of the step, 0 to {n - 1}")
    fig, (line, bar) = _new(2, width=9.0, height=3.6)
    bar.set_position([0.62, 0.15, 0.08, 0.72])
    line.set_position([0.07, 0.15, 0.48, 0.72])
    live = [e.live_bytes / MiB for e in meter.timeline]
    line.plot(range(n), live, color="black", linewidth=1)
    for phase, first, last in _phase_spans(meter):
        line.axvspan(first, last + 1, color=PHASE_COLOURS.get(phase, "#cccccc"), alpha=0.25, linewidth=0)
    line.axvline(i, color="crimson", linewidth=1)
    top = 1.15 * max(max(live, default=0) * MiB, budget or 0, 1)
    if budget is not None:
        line.axhline(budget / MiB, color="crimson", linestyle="--", linewidth=1, label="budget")
    line.set_ylim(0, top / MiB)
    line.set_xlabel("allocation / free event")
    line.set_ylabel("live tensor MiB")
    e = meter.timeline[i]
    over = "" if budget is None else (" over the budget" if e.live_bytes > budget else " within the budget")
    line.set_title(f"{title + ': ' if title else ''}event {i} of {n} ({e.phase}), {e.live_bytes / MiB:.1f} MiB{over}",
                   fontsize=9)
    _bar(bar, _groups(meter, i, depth), budget, top)
    return fig


def moments(meter: MemoryMeter) -> dict[str, int]:
    """The moments a step is read at: the end of its forward, its peak, halfway through its backward, its end."""
    tl = meter.timeline
    backward = [e.index for e in tl if e.phase in ("backward", "recompute")]
    forward = [e.index for e in tl if e.phase == "forward" and (not backward or e.index < backward[0])]
    peak = max(range(len(tl)), key=lambda k: tl[k].live_bytes, default=0)
    found = {"end of forward": forward[-1] if forward else 0, "peak": peak,
             "mid backward": backward[len(backward) // 2] if backward else peak, "end": len(tl) - 1}
    return dict(sorted(found.items(), key=lambda kv: kv[1]))


def step_frames(meter: MemoryMeter, budget: int | None = None, depth: int = 2, title: str = "") -> Figure:
    """The step player's static twin: what is alive at the moments() of the step, side by side on one scale."""
    at = moments(meter)
    fig, axes = _new(len(at), width=2.6 * len(at), height=3.6, sharey=True)
    top = 1.15 * max(max((e.live_bytes for e in meter.timeline), default=1), budget or 0)
    for ax, (name, i) in zip(axes, at.items()):
        _bar(ax, _groups(meter, i, depth), budget, top)
        ax.legend(fontsize=6, loc="upper right")
        ax.set_title(f"{name} (event {i})", fontsize=8)
        ax.set_xlim(-0.5, 1.6)
    axes[0].set_ylabel("live tensor MiB")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
