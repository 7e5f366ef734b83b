"""ipywidgets explorers; each has a static twin in labkit.plots, which is what a saved notebook shows.

A widget needs a live kernel: in an executed notebook read without one (a file,
the reading site) it shows nothing, so every lab that shows a widget also shows
the figure of its current state.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit.plots import segments_figure


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
