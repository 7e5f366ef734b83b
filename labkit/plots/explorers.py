"""The figures the labs' explorers redraw (labkit.widgets), each also the static twin a saved notebook shows:
activations against the training state at a batch and sequence (lab 01), the kept ops and the point on the
memory-time front at a budget (lab 04), and a plan at a budget (lab 07). Each takes the lab's measurements, or
the lab's own functions, as arguments: nothing here decides."""
from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from labkit.plots.base import MiB, _new, _plain_log_labels

__all__ = ["crossover_at", "keep_front", "keep_at", "plan_at"]


def crossover_at(alpha: float, beta: float, measured_batch: int, states: Mapping[str, int], batch: int, seq: int,
                 max_seq: int) -> Figure:
    """Activation bytes of a GPT stack at `batch` over sequence lengths up to max_seq, from the model measured at
    measured_batch (alpha·s + beta·s², linear in the batch), against each training state; the point (seq, that
    batch) marked, and where the activations overtake each state."""
    if batch < 1 or seq < 1 or max_seq < 2:
        raise ValueError(f"crossover_at: batch={batch}, seq={seq} and max_seq={max_seq} must be at least 1, 1, 2")
    scale = batch / measured_batch
    act = lambda s: scale * (alpha * s + beta * s * s)  # noqa: E731
    seqs = sorted({2 ** k for k in range(1, max_seq.bit_length())} | {max_seq, seq})
    fig, (ax,) = _new()
    ax.plot(seqs, [act(s) / MiB for s in seqs], "-", color="black", label=f"activations at batch {batch}")
    here = act(seq)
    ax.plot([seq], [here / MiB], "o", color="crimson")
    notes = []
    for (name, state), style in zip(states.items(), ("--", ":", "-.")):
        ax.axhline(state / MiB, color="grey", linestyle=style, label=f"training state, {name}")
        cross = (-alpha + (alpha ** 2 + 4 * beta * state / scale) ** 0.5) / (2 * beta) if beta > 0 else state / (
            scale * alpha)
        notes.append(f"{here / state:.2f}x {name}'s state (overtaken at seq {cross:.0f})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_log_labels(ax.yaxis)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("MiB")
    ax.set_title(f"batch {batch}, seq {seq}: activations {here / MiB:.1f} MiB = " + "; ".join(notes), fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def keep_front(ops: Sequence[Any], keep: Callable[[Sequence[Any], int], Any], kept_bytes: Callable[..., int],
               cost: Callable[..., float], points: int = 24) -> list[tuple[int, int, float]]:
    """(budget, kept bytes, recompute seconds) of keep(ops, budget) at `points` budgets from 0 to what the policy
    keeps with no limit (lab 04's policy given as `keep`, priced by its kept_bytes and recompute cost)."""
    everything = kept_bytes(ops, keep(ops, 1 << 62))  # what the policy keeps with no limit: every candidate
    out = []
    for k in range(points):
        budget = everything * k // (points - 1)
        chosen = keep(ops, budget)
        out.append((budget, kept_bytes(ops, chosen), cost(ops, chosen)))
    return out


def keep_at(ops: Sequence[Any], front: Sequence[tuple[int, int, float]], budget: int, chosen: Any,
            kept: int, seconds: float, title: str = "") -> Figure:
    """The memory-time front of a policy (keep_front) with the point at `budget` marked, and the ops it keeps
    there (`chosen`: their keys), listed."""
    fig, (ax,) = _new(width=8.0)
    ax.plot([f[1] / MiB for f in front], [f[2] * 1e3 for f in front], "o-", color="grey", markersize=3,
            label="the policy at other budgets")
    ax.plot([kept / MiB], [seconds * 1e3], "o", color="crimson", markersize=8, label=f"at {budget / MiB:.2f} MiB")
    ax.axvline(budget / MiB, color="crimson", linestyle=":", linewidth=1)
    names = sorted(chosen)
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    ax.text(0.99, 0.97, f"keeps {len(names)} ops, {kept / MiB:.2f} MiB:\n" + textwrap.fill(shown, 48),
            transform=ax.transAxes, ha="right", va="top", fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    ax.set_xlabel("kept activations, MiB")
    ax.set_ylabel("recompute per block, ms")
    ax.set_title(title or f"budget {budget / MiB:.2f} MiB: {kept / MiB:.2f} MiB kept, {seconds * 1e3:.2f} ms "
                          "recomputed", fontsize=9)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


WAY_COLOURS = {"keep": "#4c72b0", "selective": "#dd8452", "offload": "#8172b3", "recompute": "#55a868"}


def plan_at(profile: Any, plan: Sequence[Any] | None, budget: int, peak: int | None = None,
            ratio: float | None = None, batch: int | None = None) -> Figure:
    """A plan at a budget: each block's bar the bytes it keeps until its backward, coloured by its way (a
    recomputed segment keeps its first block's input), with the plan's predicted peak and step time, and the
    largest batch it fits where given."""
    fig, (ax,) = _new(width=8.0)
    n = len(profile.blocks)
    if plan is None:
        ax.set_title(f"budget {budget / MiB:.2f} MiB: no plan fits", fontsize=9)
        ax.set_xlim(-0.5, n - 0.5)
        return fig
    for s in plan:
        for i in range(s.start, s.stop):
            b = profile.blocks[i]
            kept = b.inp if (s.how == "recompute" and i == s.start) else 0 if s.how == "recompute" else (
                b.act if s.how == "keep" else b.options[s.how].kept)
            ax.bar(i, kept / MiB, color=WAY_COLOURS.get(s.how, "grey"))
            ax.text(i, kept / MiB, s.how if i == s.start or s.how != "recompute" else "", ha="center", va="bottom",
                    fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in WAY_COLOURS.values()]
    ax.legend(handles, list(WAY_COLOURS), fontsize=7, loc="upper right")
    ax.set_xticks(range(n))
    ax.set_xlabel("block")
    ax.set_ylabel("kept until its backward, MiB")
    parts = [f"budget {budget / MiB:.2f} MiB"]
    if peak is not None:
        parts.append(f"predicted peak {peak / MiB:.2f} MiB")
    if ratio is not None:
        parts.append(f"step x{ratio:.2f}")
    if batch is not None:
        parts.append(f"largest batch {batch}")
    ax.set_title(", ".join(parts), fontsize=9)
    fig.tight_layout()
    return fig
