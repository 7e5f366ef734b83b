"""What every figure of labkit.plots shares: the phases' colours, the MiB unit, a new closed figure, the meter's
phase spans and plain log-axis labels."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from labkit.instruments.meter import MemoryMeter

__all__ = ["PHASE_COLOURS", "MiB"]

PHASE_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "recompute": "#55a868", "optimizer": "#8172b3"}
MiB = 2 ** 20


def _new(ncols: int = 1, width: float = 7.0, height: float = 3.6, sharey: bool = False) -> tuple[Figure, list]:
    """A figure with `ncols` axes, closed for pyplot so cells show it once (as the returned value)."""
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), sharey=sharey, squeeze=False)
    plt.close(fig)
    return fig, list(axes[0])


def _phase_spans(meter: MemoryMeter) -> list[tuple[str, int, int]]:
    """Runs of consecutive events in one phase: (phase, first index, last index)."""
    spans: list[tuple[str, int, int]] = []
    for e in meter.timeline:
        if spans and spans[-1][0] == e.phase:
            spans[-1] = (e.phase, spans[-1][1], e.index)
        else:
            spans.append((e.phase, e.index, e.index))
    return spans


class _PlainLog(LogFormatter):
    """matplotlib's choice of which log ticks to label, each written plainly: 0.1, 6, 20, 1e+06."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:g}"


def _plain_log_labels(axis) -> None:
    """A base-10 log axis labelled 0.1, 6, 20 rather than 10⁻¹ or 6×10⁰."""
    axis.set_major_formatter(_PlainLog())
    axis.set_minor_formatter(_PlainLog(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
