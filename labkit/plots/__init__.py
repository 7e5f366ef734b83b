"""Figures for the labs; every function returns a matplotlib Figure (display it by ending a cell with it).

Shared helpers are in base.py; every tensor's life in lifetimes.py; the figures the explorers (labkit.widgets)
redraw in explorers.py; all of them are lk.plots.NAME."""
from __future__ import annotations

from collections.abc import Callable
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from labkit.instruments.ledger import Ledger
from labkit.instruments.meter import MemoryMeter
from labkit.models.layers import dtype_name
from labkit.plots.base import PHASE_COLOURS, MiB, _new, _phase_spans, _plain_log_labels, _PlainLog  # noqa: F401
from labkit.plots.explorers import crossover_at, keep_at, keep_front, plan_at  # noqa: F401  (lk.plots.NAME)
from labkit.plots.lifetimes import lifetimes, lifetimes_compared, moments, step_frames, step_moment  # noqa: F401


def _draw_timeline(ax, meter: MemoryMeter, title: str) -> None:
    steps = [e.index for e in meter.timeline]
    live = [e.live_bytes / MiB for e in meter.timeline]
    ax.plot(steps, live, color="black", linewidth=1.2)
    labelled = set()
    for phase, first, last in _phase_spans(meter):
        label = phase if phase not in labelled else None
        labelled.add(phase)
        ax.axvspan(first, last + 1, color=PHASE_COLOURS.get(phase, "#cccccc"), alpha=0.25, label=label, linewidth=0)
    peak = max(meter.timeline, key=lambda e: e.live_bytes, default=None)
    if peak is not None:
        ax.plot([peak.index], [peak.live_bytes / MiB], "v", color="crimson")
        late = peak.index > 0.5 * max(steps)  # the label runs away from the nearer side, so it stays inside
        ax.annotate(f"peak {peak.live_bytes / MiB:.1f} MiB ({peak.phase})", (peak.index, peak.live_bytes / MiB),
                    textcoords="offset points", xytext=(-4 if late else 4, 5), ha="right" if late else "left",
                    fontsize=8, color="crimson")
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.2 * peak.live_bytes / MiB))  # room above the peak for its label
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("allocation / free event")
    ax.set_ylabel("live tensor MiB")
    ax.legend(fontsize=8, loc="upper left")


def timeline(meter: MemoryMeter, title: str = "live tensor memory") -> Figure:
    """Live tensor bytes over one measured region, phases shaded, the peak marked."""
    if not isinstance(meter, MemoryMeter):
        raise TypeError(f"timeline: expected a MemoryMeter (from lk.measure_peak), got {type(meter).__name__}")
    fig, (ax,) = _new()
    _draw_timeline(ax, meter, title)
    return fig


def timelines(meters: Mapping[str, MemoryMeter], title: str = "") -> Figure:
    """Several timelines side by side on one memory scale."""
    if not meters:
        raise ValueError("timelines: no meters given; pass a dict like {'none': meter_a, 'checkpoint': meter_b}")
    fig, axes = _new(len(meters), width=4.2 * len(meters), sharey=True)
    for ax, (name, meter) in zip(axes, meters.items()):
        _draw_timeline(ax, meter, name)
    top = max(e.live_bytes for m in meters.values() for e in m.timeline) / MiB if any(
        m.timeline for m in meters.values()) else 1.0
    axes[0].set_ylim(0, 1.2 * top)  # shared: every panel's peak label fits under the highest
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def saved_by_op(ledger: Ledger, title: str = "saved bytes by op") -> Figure:
    """Horizontal bars: bytes autograd saved per (module, op) row of the ledger's table."""
    rows = ledger.table().rows  # (module, op, count, bytes)
    labels = [f"{module or '(top)'} · {op}" for module, op, _, _ in rows]
    sizes = [nbytes / MiB for *_, nbytes in rows]
    fig, (ax,) = _new(height=0.3 * len(rows) + 1.2)
    ax.barh(labels[::-1], sizes[::-1], color=PHASE_COLOURS["forward"])
    ax.set_xlabel("MiB saved")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def measured_vs_predicted(labels: Sequence[str], measured: Sequence[float], predicted: Sequence[float],
                          title: str = "measured against predicted", unit: str = "bytes") -> Figure:
    """Paired bars of a measurement and its prediction, one pair per label."""
    if not (len(labels) == len(measured) == len(predicted)):
        raise ValueError(f"measured_vs_predicted: {len(labels)} labels, {len(measured)} measured, "
                         f"{len(predicted)} predicted; all three must have the same length")
    fig, (ax,) = _new()
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], measured, width=0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], predicted, width=0.4, label="predicted")
    ax.set_xticks(list(xs), labels, rotation=20, fontsize=8)
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def crossover(xs: Sequence[float], activation_bytes: Sequence[float], state_bytes: float, cross: float | None = None,
              xlabel: str = "batch size", title: str = "activations against the training state") -> Figure:
    """Activation bytes over a sweep against the flat training state, the crossover marked."""
    fig, (ax,) = _new()
    ax.plot(xs, [a / MiB for a in activation_bytes], "o-", label="activations (saved for backward)")
    ax.axhline(state_bytes / MiB, color="grey", linestyle="--", label="parameters + gradients + Adam state")
    if cross is not None:
        ax.axvline(cross, color="crimson", linewidth=1, label=f"crossover at {cross:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_log_labels(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("MiB")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- lab 03
def u_curves(sweeps: Mapping[int, Mapping], title: str = "checkpointing in k segments") -> Figure:
    """Measured and predicted activation peak (left) and step time (right) against k, one line per chain length.

    `sweeps` maps n_layers to labkit.bench.segments_sweep's result.
    """
    if not sweeps:
        raise ValueError("u_curves: no sweeps given; pass {n_layers: segments_sweep(...)}")
    fig, (mem, tim) = _new(2, width=10.0)
    for n, sweep in sweeps.items():
        ks = [r["segments"] for r in sweep["rows"]]
        line, = mem.plot(ks, [r["measured_bytes"] / MiB for r in sweep["rows"]], "o", label=f"n={n} measured")
        mem.plot(ks, [r["predicted_bytes"] / MiB for r in sweep["rows"]], "-", color=line.get_color(),
                 label=f"n={n} model")
        mem.axhline(sweep["none_bytes"] / MiB, color=line.get_color(), linestyle=":", linewidth=1)
        mem.axvline(n ** 0.5, color=line.get_color(), linestyle="--", linewidth=0.8)
        timed = [(r["segments"], r["step_time_ratio"]) for r in sweep["rows"] if r["step_time_ratio"] is not None]
        tim.plot([k for k, _ in timed], [t for _, t in timed], "o-", color=line.get_color(), label=f"n={n}")
    tim.axhline(4 / 3, color="grey", linestyle="--", linewidth=1, label="one extra forward (4/3)")
    for ax in (mem, tim):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("segments k")
    mem.set_ylabel("activation peak, MiB (dotted: no checkpointing; dashed: √n)")
    tim.set_ylabel("step time / step time without checkpointing")
    mem.legend(fontsize=8)
    tim.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def pareto(points: Mapping[str, Sequence[tuple[float, float]]], title: str = "memory against time",
           xlabel: str = "activation peak, MiB", ylabel: str = "step time / plain") -> Figure:
    """Points (memory bytes, time) per method; lines join each method's points in memory order."""
    if not points:
        raise ValueError("pareto: no points given; pass {method: [(bytes, time), ...]}")
    fig, (ax,) = _new()
    for name, pts in points.items():
        pts = sorted(pts)
        ax.plot([p[0] / MiB for p in pts], [p[1] for p in pts], "o-" if len(pts) > 1 else "o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def schedule_diagram(schedule: Sequence, n_layers: int, title: str = "a schedule",
                     kinds: str | None = None) -> Figure:
    """Which layers a schedule keeps (blue), checkpoints (green: only the first layer's input is kept) and
    recomputes in backward; `kinds` ("HL...") marks heavy layers."""
    fig, (ax,) = _new(height=1.9)
    for seg in schedule:
        colour = PHASE_COLOURS["recompute"] if seg.recompute else PHASE_COLOURS["forward"]
        ax.barh(0, seg.stop - seg.start, left=seg.start, color=colour, alpha=0.45, edgecolor="black", linewidth=0.6)
        if seg.recompute:
            ax.plot([seg.start + 0.5], [0], "v", color="black", markersize=5)
    if kinds:
        for i, kind in enumerate(kinds):
            if kind == "H":
                ax.plot([i + 0.5], [0.3], "s", color="dimgray", markersize=3)
    ax.set_xlim(0, n_layers)
    ax.set_ylim(-0.6, 0.6)
    ax.set_yticks([])
    ax.set_xlabel("layer (blue: kept; green: recomputed in backward, ▼ the input its checkpoint keeps"
                  + ("; ■ heavy layer)" if kinds else ")"), fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def segments_figure(n_layers: int, segments: int, model: Callable[..., int], input_bytes: int, layer_bytes: int,
                    extra_bytes: int = 0) -> Figure:
    """The model's peak against k for an n-layer chain, k marked (left), and the k segments it keeps (right).

    `model(n, k, input_bytes, layer_bytes, extra_bytes)` is lab 03's segment_peak; the static twin of
    labkit.widgets.segments_explorer.
    """
    if not 1 <= segments <= n_layers:
        raise ValueError(f"segments_figure: segments={segments} must be between 1 and n_layers={n_layers}")
    fig, (curve, bars) = _new(2, width=10.0, height=3.0)
    ks = list(range(1, n_layers + 1))
    peaks = [model(n_layers, k, input_bytes, layer_bytes, extra_bytes) / MiB for k in ks]
    curve.plot(ks, peaks, "-", color=PHASE_COLOURS["forward"])
    curve.plot([segments], [peaks[segments - 1]], "o", color="crimson")
    curve.axvline(n_layers ** 0.5, color="grey", linestyle="--", linewidth=0.8, label="√n")
    curve.set_xscale("log", base=2)
    curve.set_xlabel("segments k")
    curve.set_ylabel("predicted activation peak, MiB")
    curve.set_title(f"n={n_layers}, k={segments}: {peaks[segments - 1]:.2f} MiB", fontsize=10)
    curve.legend(fontsize=8)
    bounds = [i * n_layers // segments for i in range(segments + 1)]
    for a, b in zip(bounds, bounds[1:]):
        bars.barh(0, b - a, left=a, color=PHASE_COLOURS["recompute"], alpha=0.45, edgecolor="black", linewidth=0.6)
        bars.plot([a + 0.5], [0], "v", color="black", markersize=4)
    bars.set_xlim(0, n_layers)
    bars.set_yticks([])
    bars.set_xlabel("layer (▼ the input each segment keeps; each segment recomputed in backward)", fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- lab 05
def roofline(ceilings, records: Sequence, specs: Sequence = (), title: str = "one block on the roofline",
             also: dict | None = None) -> Figure:
    """Each op that moves data at its measured FLOP/s against FLOPs per byte, under the measured roofs.

    `ceilings` from labkit.instruments.roofline.measure_ceilings, `records` from labkit.instruments.ops.trace (timed); `specs` are
    labkit.instruments.roofline.GPUSpec whose spec-sheet roofs are drawn dashed (predictions, not measurements); `also`
    names more measured Ceilings (measure_ceilings_by_dtype: the same machine in other precisions), drawn solid in
    colour with their ridge points dotted. Points are coloured by the side of `ceilings`' ridge they sit on.
    """
    from labkit.instruments import roofline as rl  # imported here: the module has this function's name

    ops = [r for r in records if rl.moves_data(r)]
    if not ops:
        raise ValueError("roofline: no op that moves data among the records; pass labkit.instruments.ops.trace(...)'s output")
    xs = [rl.intensity(r) for r in ops]
    ys = [rl.achieved(r) for r in ops]
    also = dict(also or {})
    ridges = [ceilings.ridge] + [s.peak_flops / s.peak_bandwidth for s in specs] + [c.ridge for c in also.values()]
    lo, hi = min(xs + ridges) / 4, max(xs + ridges) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, (ax,) = _new(height=4.6)
    ax.plot(grid, [min(ceilings.peak_flops, ceilings.peak_bandwidth * x) for x in grid], color="black",
            label=f"measured, {dtype_name(ceilings.dtype)}: {ceilings.peak_bandwidth / 1e9:.3g} GB/s, "
                  f"{ceilings.peak_flops / 1e9:.3g} GFLOP/s")
    for (name, c), colour in zip(also.items(), ("tab:purple", "tab:brown", "tab:olive")):
        ax.plot(grid, [min(c.peak_flops, c.peak_bandwidth * x) for x in grid], color=colour,
                label=f"measured, {name}: {c.peak_bandwidth / 1e9:.3g} GB/s, {c.peak_flops / 1e9:.3g} GFLOP/s, "
                      f"ridge {c.ridge:.3g}")
        ax.axvline(c.ridge, color=colour, linestyle=":", linewidth=1)
    random = [r for r in ops if r.random]
    if ceilings.random_rate and random:
        per_draw = rl.flops(random[0]) / rl.random_draws(random[0])
        ax.axhline(ceilings.random_rate * per_draw, color=PHASE_COLOURS["backward"], linestyle=":",
                   label=f"measured random roof: {ceilings.random_rate / 1e6:.3g} M draws/s ({per_draw:g} FLOP/draw)")
    for spec in specs:
        ax.plot(grid, [min(spec.peak_flops, spec.peak_bandwidth * x) for x in grid], "--", linewidth=1,
                label=f"spec sheet: {spec.name} ({dtype_name(spec.dtype)})")
    for r, x, y in zip(ops, xs, ys):  # where an op sits, not its roofline time (that is lab 05's Exercise 5.1)
        colour = "backward" if r.random else "forward" if x >= ceilings.ridge else "recompute"
        ax.plot([x], [y], "o", color=PHASE_COLOURS[colour], markersize=5)
        ax.annotate(r.key, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_labels(ax.xaxis)
    _plain_log_labels(ax.yaxis)
    ax.set_xlabel("arithmetic intensity, FLOPs per byte (elementwise FLOPs estimated)")
    ax.set_ylabel("FLOP/s (points: measured)")
    ax.set_title(title + " (blue: right of the ridge, green: left of it, orange: draws random numbers)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def loss_curves(curves: Mapping[str, Sequence[float]], reference: str = "plain",
                title: str = "training loss, step by step") -> Figure:
    """Left: each run's loss per step. Right: |loss - the reference run's| per step, log scale; a run equal to
    the reference at every step is named so in the legend (a log axis cannot show 0)."""
    if reference not in curves:
        raise ValueError(f"loss_curves: reference={reference!r} is not one of the curves: {', '.join(curves)}")
    fig, (ax, gap) = _new(ncols=2, width=10.0)
    base = curves[reference]
    for name, losses in curves.items():
        steps = range(1, len(losses) + 1)
        ax.plot(steps, losses, label=name, lw=1.4, ls="-" if name == reference else "--")
        if name == reference:
            continue
        diffs = [abs(a - b) for a, b in zip(losses, base)]
        if not any(diffs):
            gap.plot([], [], label=f"{name}: equal at every step")
            continue
        gap.plot(steps, [d if d else float("nan") for d in diffs], marker=".", label=name)
    ax.set(xlabel="step", ylabel="loss", title=title)
    gap.set(xlabel="step", ylabel=f"|loss - {reference}|", yscale="log", title=f"distance from {reference}")
    ax.legend(fontsize=8)
    gap.legend(fontsize=8)
    fig.tight_layout()
    return fig


def largest_batches(rows: Sequence[Mapping[str, object]], budget: int) -> Figure:
    """Left: the largest batch each scheme fits in `budget` (rows: name, batch, seconds_per_sample). Right: the
    step time per sample at that batch; a scheme that fits no batch shows an empty bar."""
    fig, (ax, per) = _new(ncols=2, width=10.0)
    names = [str(r["name"]) for r in rows]
    ax.bar(names, [int(r["batch"]) for r in rows], color="#4c72b0")
    ax.set(ylabel="sequences per step", title=f"largest batch in {budget / MiB:.1f} MiB")
    per.bar(names, [float(r["seconds_per_sample"]) * 1e3 if r["batch"] else 0.0 for r in rows], color="#dd8452")
    per.set(ylabel="ms per sequence", title="step time per sequence at that batch")
    for a in (ax, per):
        a.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return fig


def peers(settings: Sequence[Mapping[str, object]], budgets: Sequence[int],
          title: str = "the planner against PyTorch's answers") -> Figure:
    """Every measured setting of each method (`labkit bench plan`'s "settings": measured peak, step ratio) as
    points, each method's joined in memory order, and the budgets as dotted lines: at each budget, the methods
    that fit are left of its line, and the lower the faster. Settings whose gradients were judged wrong are a
    series of their own per method ("... (gradients wrong)"): they never fit."""
    points: dict[str, list[tuple[float, float]]] = {}
    for r in settings:
        if "error" not in r:
            name = str(r["method"]) + (" (gradients wrong)" if r.get("gradients") == "wrong" else "")
            points.setdefault(name, []).append((float(r["measured_peak"]), float(r["step_ratio"])))
    fig = pareto(points, title=title, xlabel="measured peak of a training step, MiB")
    (ax,) = fig.axes
    for b in budgets:
        ax.axvline(b / MiB, color="0.6", linestyle=":", linewidth=1)
    return fig
