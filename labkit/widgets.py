"""ipywidgets explorers; each has a static twin in labkit.plots, which is what a saved notebook shows.

A widget needs a live kernel: in an executed notebook read without one (a file,
the reading site) it shows nothing, so every lab that shows a widget also shows
the figure of its current state.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from labkit.instruments.meter import MemoryMeter
from labkit.plots import segments_figure, step_moment


def segments_explorer(model: Callable[..., int], input_bytes: int, layer_bytes: int, extra_bytes: int = 0,
                      n_layers: int = 64, segments: int = 8, n_max: int = 256):  # -> ipywidgets.VBox
    """Sliders for the chain length n and the segments k; redraws segments_figure for them."""
    import ipywidgets as w
    from IPython.display import display

    if not 1 <= segments <= n_layers <= n_max:
        raise ValueError(f"segments_explorer: need 1 <= segments ({segments}) <= n_layers ({n_layers}) <= "
                         f"n_max ({n_max})")
    n = w.IntSlider(value=n_layers, min=1, max=n_max, description="layers n", continuous_update=False)
    k = w.IntSlider(value=segments, min=1, max=n_layers, description="segments k", continuous_update=False)
    out = w.Output()

    def redraw(*_: object) -> None:
        k.max = n.value
        with out:
            out.clear_output(wait=True)
            display(segments_figure(n.value, min(k.value, n.value), model, input_bytes, layer_bytes, extra_bytes))

    n.observe(redraw, names="value")
    k.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([n, k]), out])


def step_player(meters: Mapping[str, MemoryMeter], budget: int | None = None, depth: int = 2,
                frames: int = 60):  # -> ipywidgets.VBox
    """Play or scrub one measured step (meters from MemoryMeter(..., lifetimes=True), by scheme): at each moment,
    the live total against the budget and what is alive, stacked (plots.step_moment). The slider runs over
    `frames` moments spread evenly over the step's events. Its static twin is plots.step_frames."""
    import ipywidgets as w
    from IPython.display import display

    if not meters or any(not isinstance(m, MemoryMeter) or not m.timeline for m in meters.values()):
        raise ValueError("step_player: pass {scheme: MemoryMeter} of measured steps, each with lifetimes recorded")
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 2:
        raise ValueError(f"step_player: frames={frames!r} must be an int >= 2")
    scheme = w.Dropdown(options=list(meters), description="scheme")
    moment = w.IntSlider(value=0, min=0, max=frames - 1, description="moment", continuous_update=False)
    play = w.Play(value=0, min=0, max=frames - 1, interval=400, description="play")
    w.jslink((play, "value"), (moment, "value"))
    out = w.Output()

    def redraw(*_: object) -> None:
        meter = meters[scheme.value]
        i = round(moment.value * (len(meter.timeline) - 1) / (frames - 1))
        with out:
            out.clear_output(wait=True)
            display(step_moment(meter, i, budget, depth, title=scheme.value))

    scheme.observe(redraw, names="value")
    moment.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([scheme, play, moment]), out])
