"""Every tensor's life (MemoryMeter(lifetimes=True), labkit.instruments.lifetimes, lk.plots.lifetimes): the bands
add up to the meter's live total at every event, to the byte, on a plain step, a checkpointed one and one that
offloads; each tensor is named by the module that made it, a recomputed one too."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import labkit as lk
from labkit.instruments.lifetimes import alive_at, label, layout, top_at
from labkit.instruments.meter import Lifetime, MemoryMeter


def _stack(n_layers: int = 3):
    cfg = lk.sizes("tiny").gpt(n_layers=n_layers, dropout=0.1)
    torch.manual_seed(0)
    return lk.GPTStack(cfg), lk.gpt_input(cfg, requires_grad=True)


def _step(model, x, opt, wrap=None):
    def run() -> None:
        opt.zero_grad(set_to_none=True)
        h = x
        for block in model.blocks:
            h = block(h) if wrap is None else wrap(block, h)
        h.float().pow(2).mean().backward()
        opt.step()
    return run


def _metered(wrap=None) -> MemoryMeter:
    model, x = _stack()
    opt = torch.optim.Adam(model.parameters())
    step = _step(model, x, opt, wrap)
    step()
    with MemoryMeter(model, opt, x, lifetimes=True) as meter:
        step()
    return meter


def _stacked_top(bands, i: int) -> int:
    """The top of the stack of bands after event i: the highest bottom + height among those alive then."""
    tops = [0]
    for b in bands:
        if b.xs[0] <= i < b.xs[-1]:
            j = max(k for k in range(len(b.bottoms)) if b.xs[k] <= i)
            tops.append(b.bottoms[j] + b.nbytes)
    return max(tops)


WAYS = {"plain": None,
        "checkpoint": lambda block, h: checkpoint(block, h, use_reentrant=False),
        "offload": lambda block, h: _offloaded(block, h)}


def _offloaded(block, h):
    with torch.autograd.graph.save_on_cpu():
        return block(h)


def _floors(lives, n_events: int) -> dict[int, dict[int, int]]:
    """An independent stacking, as memory_viz draws it: after each event i (-1: before the first), the storages
    alive then, oldest first, each on the bytes of those alive below it. {life's index: {event: its floor}}."""
    order = sorted(range(len(lives)), key=lambda k: (lives[k].start, k))
    floors: dict[int, dict[int, int]] = {k: {} for k in order}
    for i in range(-1, n_events):
        height = 0
        for k in order:
            life = lives[k]
            if life.start <= i and (life.end is None or i < life.end):
                floors[k][i] = height
                height += life.nbytes
    return floors


def _floor_of(band, i: int) -> int | None:
    """The band's floor after event i, read off its steps; None outside its extent."""
    if not band.xs[0] <= i < band.xs[-1]:
        return None
    return band.bottoms[max(j for j in range(len(band.bottoms)) if band.xs[j] <= i)]


def _assert_layout(lives, n_events: int) -> None:
    """Every band spans its life (to the step's end when still alive) and sits, at every event, on exactly the
    bytes alive below it."""
    bands = layout(lives, n_events)
    assert [b.life for b in bands] == list(lives)
    floors = _floors(lives, n_events)
    for k, (life, band) in enumerate(zip(lives, bands)):
        assert band.xs[0] == life.start and band.xs[-1] == (n_events if life.end is None else life.end), (k, band.xs)
        assert len(band.bottoms) == len(band.xs) - 1, (k, band)
        for i in range(-1, n_events):
            assert _floor_of(band, i) == floors[k].get(i), (k, i, band)


def _life(start: int, end: int | None, nbytes: int) -> Lifetime:
    return Lifetime(start, end, nbytes, "empty", "forward", None)


LAYOUTS = {  # hand-made lives over n events: frees below, above, several at once, and lives past the end
    "one freed below three": ([_life(-1, None, 8), _life(0, 3, 4), _life(1, None, 2), _life(2, 5, 16),
                               _life(4, None, 1)], 6),
    "two freed at once, one between": ([_life(0, 4, 1), _life(1, 6, 2), _life(2, 4, 4), _life(3, None, 8),
                                        _life(5, 7, 32)], 8),
    "the top freed, then the bottom": ([_life(0, 3, 10), _life(1, 5, 20), _life(2, 3, 40), _life(4, None, 80)], 6),
    "freed at the last event": ([_life(-1, 2, 3), _life(0, None, 5), _life(1, 2, 7)], 3),
}


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_every_band_sits_on_exactly_what_is_alive_below_it_at_every_event(case):
    _assert_layout(*LAYOUTS[case])


@pytest.mark.parametrize("way", list(WAYS))
def test_a_steps_bands_sit_on_an_independent_stacking_of_the_meters_lives(way):
    meter = _metered(WAYS[way])
    _assert_layout(meter.lifetimes, len(meter.timeline))


@pytest.mark.parametrize("way", list(WAYS))
def test_the_bands_add_up_to_the_meters_live_total_at_every_event_to_the_byte(way):
    meter = _metered(WAYS[way])
    lives, events = meter.lifetimes, meter.timeline
    assert events and lives
    bands = layout(lives, len(events))
    assert len(bands) == len(lives)
    for i, e in enumerate(events):
        assert sum(life.nbytes for life in alive_at(lives, i)) == e.live_bytes, (way, i)
        assert _stacked_top(bands, i) == e.live_bytes, (way, i)
    assert sum(life.nbytes for life in alive_at(lives, -1)) == meter.baseline


def test_each_tensor_is_named_by_the_module_that_made_it_and_a_recomputed_one_is_recompute():
    meter = _metered(WAYS["checkpoint"])
    lives = meter.lifetimes
    forward = {label(life) for life in lives if life.phase == "forward" and life.module}
    assert {"blocks.0", "blocks.1", "blocks.2"} <= forward
    rebuilt = [life for life in lives if life.phase == "recompute"]
    assert rebuilt and all(life.module and life.module.startswith("blocks.") for life in rebuilt)
    assert any(life.phase == "track" and life.start == -1 for life in lives)  # parameters, Adam's state
    peak = max(range(len(meter.timeline)), key=lambda i: meter.timeline[i].live_bytes)
    held = top_at(lives, peak, k=3)
    assert len(held) == 3 and held == sorted(held, key=lambda kv: -kv[1])
    assert label(rebuilt[0], depth=1) == "blocks"


def test_lifetimes_are_recorded_only_when_asked_and_hold_no_module_alive():
    model, x = _stack(1)
    with MemoryMeter(model, x) as meter:
        model(x).sum().backward()
    with pytest.raises(ValueError, match="lifetimes=True"):
        meter.lifetimes
    ref = weakref.ref(model)
    with MemoryMeter(model, x, lifetimes=True) as meter:
        model(x).sum().backward()
    del model
    gc.collect()
    assert ref() is None and meter.lifetimes


def test_the_figure_draws_a_band_per_tensor_and_refuses_what_is_not_a_meter():
    meter = _metered()
    fig = lk.plots.lifetimes(meter)
    (ax,) = fig.axes
    (bands,) = ax.collections
    assert len(bands.get_paths()) == len(meter.lifetimes)
    with pytest.raises(TypeError, match="expected a MemoryMeter"):
        lk.plots.lifetimes([meter])


def test_a_cuda_snapshot_is_written_only_where_one_was_taken(tmp_path):
    meter = _metered()
    with pytest.raises(ValueError, match="no CUDA snapshot"):
        meter.dump_snapshot(str(tmp_path / "step.pickle"))
    meter.cuda_snapshot = {"segments": [], "device_traces": []}  # as torch.cuda.memory._snapshot() returns
    meter.dump_snapshot(str(tmp_path / "step.pickle"))
    import pickle

    assert pickle.loads((tmp_path / "step.pickle").read_bytes()) == meter.cuda_snapshot


def test_the_step_player_redraws_the_moment_its_slider_and_scheme_choose_and_refuses_bad_input(monkeypatch):
    import labkit.widgets as W

    meters = {"plain": _metered(), "checkpoint": _metered(WAYS["checkpoint"])}
    drawn = []
    real = W.step_moment
    monkeypatch.setattr(W, "step_moment", lambda meter, i, *a, **k: drawn.append((meter, i)) or real(meter, i, *a, **k))
    box = lk.widgets.step_player(meters, budget=10**6, frames=5)
    scheme, play, moment = box.children[0].children
    assert drawn[-1] == (meters["plain"], 0)
    moment.value = 4  # the last frame is the step's last event
    assert drawn[-1] == (meters["plain"], len(meters["plain"].timeline) - 1)
    scheme.value = "checkpoint"
    assert drawn[-1] == (meters["checkpoint"], len(meters["checkpoint"].timeline) - 1)
    moment.value = 2
    assert drawn[-1][1] == round(2 * (len(meters["checkpoint"].timeline) - 1) / 4)
    with pytest.raises(ValueError, match="frames=1 must be an int >= 2"):
        lk.widgets.step_player(meters, frames=1)
    with pytest.raises(ValueError, match="pass {scheme: MemoryMeter}"):
        lk.widgets.step_player({})
    with pytest.raises(ValueError, match="i=-1 must be an event of the step"):
        lk.plots.step_moment(meters["plain"], -1)


def test_the_static_twin_shows_the_steps_moments_in_order_each_stacked_to_its_live_total():
    meter = _metered(WAYS["checkpoint"])
    at = lk.plots.moments(meter)
    assert set(at) == {"end of forward", "peak", "mid backward", "end"}
    tl = meter.timeline
    first_backward = next(e.index for e in tl if e.phase in ("backward", "recompute"))
    assert at["end of forward"] == first_backward - 1 and tl[at["end of forward"]].phase == "forward"
    assert tl[at["mid backward"]].phase in ("backward", "recompute") and at["end"] == len(tl) - 1
    assert at["peak"] == max(range(len(meter.timeline)), key=lambda i: meter.timeline[i].live_bytes)
    fig = lk.plots.step_frames(meter, budget=10**6)
    for ax, i in zip(fig.axes, at.values()):
        stacked = sum(p.get_height() for p in ax.patches)
        assert stacked == pytest.approx(meter.timeline[i].live_bytes / 2**20)


def test_lab07s_step_meters_record_each_plans_step_and_full_recomputation_keeps_less():
    from labkit.bench import plan as bench_plan

    c = bench_plan.capstone(lk.sizes("tiny"), repeats=1)
    n = len(c.profile.blocks)
    meters = bench_plan.step_meters(c, {"none": lk.plans.scheme_plan("none", n), "full": lk.plans.scheme_plan("full", n)})
    assert set(meters) == {"none", "full"} and all(m.lifetimes for m in meters.values())
    assert any(life.phase == "recompute" for life in meters["full"].lifetimes)
    assert not any(life.phase == "recompute" for life in meters["none"].lifetimes)
    assert meters["full"].peak < meters["none"].peak


def test_a_storage_resized_to_nothing_and_back_is_counted_again():
    """FSDP frees and regathers parameters by resizing their storage (UntypedStorage.resize_): the life at 0 bytes
    ends, and a new one begins when it grows back, so the bands still add up."""
    t = torch.ones(1000)
    with MemoryMeter(t, lifetimes=True) as meter:
        t.untyped_storage().resize_(0)
        t.untyped_storage().resize_(4000)
        u = torch.ones(10)  # noqa: F841  (alive to the end)
    lives = meter.lifetimes
    for i, e in enumerate(meter.timeline):
        assert sum(life.nbytes for life in alive_at(lives, i)) == e.live_bytes, i
    assert [life.op for life in lives if life.nbytes == 4000][-1] == "resize_"
