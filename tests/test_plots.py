"""Figures keep their labels inside the axes and write log-axis numbers plainly."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

import labkit as lk


def _meter(peak_late: bool):
    def step():
        keep = []
        if not peak_late:
            big = torch.zeros(4096)  # the peak, at the first events
            del big
        for _ in range(20):
            keep.append(torch.zeros(64))
        if peak_late:
            keep.append(torch.zeros(4096))  # the peak, at the last event: returned, so nothing is freed after it
        return keep

    return lk.measure_peak(step)


def _drawn(fig):
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


@pytest.mark.parametrize("late", [True, False])
def test_the_peak_label_lies_inside_its_axes(late):
    for fig in (lk.plots.timeline(_meter(late)), lk.plots.timelines({"a": _meter(late), "b": _meter(late)})):
        renderer = _drawn(fig)
        for ax in fig.axes:
            box = ax.get_window_extent(renderer)
            labels = [t for t in ax.texts if t.get_text().startswith("peak")]
            assert labels
            for text in labels:
                inside = text.get_window_extent(renderer)
                assert box.x0 <= inside.x0 and inside.x1 <= box.x1 and inside.y1 <= box.y1, text.get_text()


def test_log_axes_read_as_plain_numbers():
    fig = lk.plots.crossover([1, 2, 4, 8], [3 * 2**20, 4 * 2**20, 6 * 2**20, 9 * 2**20], 5 * 2**20)  # under a decade
    _drawn(fig)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels(which="both") if t.get_text()]
    assert labels and not any("times" in label or "×" in label or "^" in label for label in labels), labels
    wide = lk.plots.crossover([1, 2, 4, 8], [2**17, 2**20, 2**23, 2**27], 2**20)  # from 0.125 to 128 MiB
    _drawn(wide)
    labels = [t.get_text() for t in wide.axes[0].get_yticklabels() if t.get_text()]
    assert {"0.1", "1", "10", "100"} <= set(labels), labels


def test_loss_curves_name_a_run_equal_at_every_step_and_refuse_an_unknown_reference():
    fig = lk.plots.loss_curves({"plain": [1.0, 0.9], "same": [1.0, 0.9], "drift": [1.0, 0.91]})
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert labels == ["same: equal at every step", "drift"]
    with pytest.raises(ValueError, match="reference='base'"):
        lk.plots.loss_curves({"plain": [1.0]}, reference="base")
