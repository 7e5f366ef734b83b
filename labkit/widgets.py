"""ipywidgets explorers; each has a static twin in labkit.plots, which is what a saved notebook shows.

A widget needs a live kernel: in an executed notebook read without one (a file,
the reading site) it shows nothing, so every lab that shows a widget also shows
the figure of its current state.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from labkit.instruments.meter import MemoryMeter
from labkit.plots import roofline, segments_figure, step_moment
from labkit.plots.explorers import crossover_at, keep_at, keep_front, plan_at


def _explorer(top: object, watched: Sequence, draw: Callable[[], object]):  # -> ipywidgets.VBox
    """`top` (the controls) above an output that shows draw()'s figure, drawn now and again whenever one of the
    `watched` controls changes value."""
    import ipywidgets as w
    from IPython.display import display

    out = w.Output()

    def redraw(*_: object) -> None:
        figure = draw()
        with out:
            out.clear_output(wait=True)
            display(figure)

    for control in watched:
        control.observe(redraw, names="value")
    redraw()
    return w.VBox([top, out])


def segments_explorer(model: Callable[..., int], input_bytes: int, layer_bytes: int, extra_bytes: int = 0,
                      n_layers: int = 64, segments: int = 8, n_max: int = 256):  # -> ipywidgets.VBox
    """Sliders for the chain length n and the segments k; redraws segments_figure for them."""
    import ipywidgets as w

    if not 1 <= segments <= n_layers <= n_max:
        raise ValueError(f"segments_explorer: need 1 <= segments ({segments}) <= n_layers ({n_layers}) <= "
                         f"n_max ({n_max})")
    n = w.IntSlider(value=n_layers, min=1, max=n_max, description="layers n", continuous_update=False)
    k = w.IntSlider(value=segments, min=1, max=n_layers, description="segments k", continuous_update=False)

    def draw() -> object:
        k.max = n.value
        return segments_figure(n.value, min(k.value, n.value), model, input_bytes, layer_bytes, extra_bytes)

    return _explorer(w.HBox([n, k]), [n, k], draw)


def step_player(meters: Mapping[str, MemoryMeter], budget: int | None = None, depth: int = 2,
                frames: int = 60):  # -> ipywidgets.VBox
    """Play or scrub one measured step (meters from MemoryMeter(..., lifetimes=True), by scheme): at each moment,
    the live total against the budget and what is alive, stacked (plots.step_moment). The slider runs over
    `frames` moments spread evenly over the step's events. Its static twin is plots.step_frames."""
    import ipywidgets as w

    if not meters:
        raise ValueError("step_player: no meters; pass {scheme: MemoryMeter} of measured steps, each with lifetimes")
    for name, m in meters.items():
        if not isinstance(m, MemoryMeter) or not m.timeline:
            raise ValueError(f"step_player: meters[{name!r}] is {type(m).__name__}"
                             f"{'' if not isinstance(m, MemoryMeter) else ' with no events'}; pass {{scheme: "
                             "MemoryMeter}} of measured steps, each with lifetimes recorded")
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 2:
        raise ValueError(f"step_player: frames={frames!r} must be an int >= 2")
    scheme = w.Dropdown(options=list(meters), description="scheme")
    moment = w.IntSlider(value=0, min=0, max=frames - 1, description="moment", continuous_update=False)
    play = w.Play(value=0, min=0, max=frames - 1, interval=400, description="play")
    w.jslink((play, "value"), (moment, "value"))

    def draw() -> object:
        meter = meters[scheme.value]
        i = round(moment.value * (len(meter.timeline) - 1) / (frames - 1))
        return step_moment(meter, i, budget, depth, title=scheme.value)

    return _explorer(w.HBox([scheme, play, moment]), [scheme, moment], draw)


def crossover_explorer(alpha: float, beta: float, measured_batch: int, states: Mapping[str, int], batch: int,
                       seq: int, max_batch: int | None = None, max_seq: int | None = None):  # -> ipywidgets.VBox
    """Sliders for the batch and the sequence length; redraws plots.crossover_at, the activations of lab 01's
    GPT stack from its measured model (alpha·s + beta·s² at measured_batch) against each training state. The
    sliders reach max_batch and max_seq, by default 4x the batch and sequence given (at least 64 and 8192): the
    gpu profile's batch grows with the card."""
    import ipywidgets as w

    max_batch = max(64, 4 * batch) if max_batch is None else max_batch
    max_seq = max(8192, 4 * seq) if max_seq is None else max_seq
    if not 1 <= batch <= max_batch or not 1 <= seq <= max_seq:
        raise ValueError(f"crossover_explorer: need 1 <= batch ({batch}) <= max_batch ({max_batch}) and 1 <= seq "
                         f"({seq}) <= max_seq ({max_seq})")
    b = w.IntSlider(value=batch, min=1, max=max_batch, description="batch", continuous_update=False)
    s = w.IntSlider(value=seq, min=1, max=max_seq, description="sequence", continuous_update=False)

    def draw() -> object:
        return crossover_at(alpha, beta, measured_batch, states, b.value, s.value, max_seq)

    return _explorer(w.HBox([b, s]), [b, s], draw)


def keep_explorer(ops: Sequence, keep: Callable, kept_bytes: Callable, cost: Callable, budget: int,
                  points: int = 24):  # -> ipywidgets.VBox
    """A budget slider over lab 04's policy (`keep(ops, budget)`, priced by its `kept_bytes` and recompute
    `cost`): redraws plots.keep_at, the ops it keeps and its point on the front of every budget."""
    import ipywidgets as w

    front = keep_front(ops, keep, kept_bytes, cost, points)
    most = front[-1][0]
    if not 0 <= budget <= most:
        raise ValueError(f"keep_explorer: budget={budget:,} B must be from 0 to {most:,} (keeping every candidate)")
    step = max(1, most // 200)
    slider = w.IntSlider(value=budget, min=0, max=most, step=step, description="budget B", continuous_update=False,
                         layout=w.Layout(width="60%"))

    def draw() -> object:
        chosen = keep(ops, slider.value)
        return keep_at(ops, front, slider.value, chosen, kept_bytes(ops, chosen), cost(ops, chosen))

    return _explorer(slider, [slider], draw)


def roofline_explorer(roofs: Mapping[str, object], ops: Sequence):  # -> ipywidgets.VBox
    """A slider over roofs (this machine's, per dtype, and spec sheets' Ceilings): redraws plots.roofline of the
    block's measured ops under the roof chosen, saying how many ops fall left of its ridge (memory-bound)."""
    import ipywidgets as w

    from labkit.instruments.roofline import intensity, moves_data

    if not roofs:
        raise ValueError("roofline_explorer: pass {name: Ceilings}, at least one")
    data = [r for r in ops if moves_data(r)]
    pick = w.SelectionSlider(options=list(roofs), description="roof", continuous_update=False,
                             layout=w.Layout(width="70%"))

    def draw() -> object:
        roof = roofs[pick.value]
        below = sum(intensity(r) < roof.ridge for r in data)
        return roofline(roof, ops, title=f"{pick.value}: ridge {roof.ridge:.1f} FLOP/byte; {below} of {len(data)} "
                                         "ops left of it (memory-bound)")

    return _explorer(pick, [pick], draw)


def plan_explorer(profile, planner: Callable, budget: int, peak_of: Callable, step_ratio: Callable,
                  batch_of: Callable[[int], int] | None = None):  # -> ipywidgets.VBox
    """A budget slider over lab 07's planner (`planner(profile, budget)`, the plan or None): redraws
    plots.plan_at, the plan, its predicted peak (peak_of) and step time (step_ratio), and, where batch_of is
    given, the largest batch it predicts fits the budget."""
    import ipywidgets as w

    low, high = profile.floor, sum(b.act for b in profile.blocks) + profile.base
    if budget < low:
        raise ValueError(f"plan_explorer: budget={budget:,} B is below the profile's floor, {low:,} B, which no plan "
                         "goes under; start at or above it")
    high = max(high, budget)
    slider = w.FloatSlider(value=budget / 2**20, min=low / 2**20, max=high * 1.05 / 2**20, step=0.05,
                           description="budget MiB", continuous_update=False, layout=w.Layout(width="60%"))

    def draw() -> object:
        b = int(slider.value * 2**20)
        plan = planner(profile, b)
        return plan_at(profile, plan, b, peak_of(plan, profile) if plan else None,
                       step_ratio(plan, profile) if plan else None, batch_of(b) if batch_of is not None else None)

    return _explorer(slider, [slider], draw)
