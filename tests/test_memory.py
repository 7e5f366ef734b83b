"""Tests for the saved-tensor ledger and the live-memory meter (labkit.instruments.ledger, labkit.instruments.meter)."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.checkpoint import checkpoint

from labkit.instruments import Ledger, MemoryMeter, measure_peak, saved_tensors
from labkit.planners.measuring import train_step
from labkit.models import GPTConfig, GPTStack, MLPChain, MLPConfig, gpt_input, korthikanti_bytes, mlp_input

DTYPES = [torch.float32, torch.bfloat16]
B, H = 4, 8  # rows and features of the small inputs below


def _act(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """A non-leaf activation: requires grad, but is not a parameter."""
    return torch.randn(*shape, requires_grad=True).to(dtype) * 1


def _saved(fn, *args, **kwargs) -> list[tuple[str, tuple[int, ...], torch.dtype, int]]:
    return [(e.op, e.shape, e.dtype, e.bytes) for e in saved_tensors(fn, *args, **kwargs).entries]


# ---------------------------------------------------------------- ledger: exact bytes
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_saves_its_input_not_its_weight(dtype: torch.dtype) -> None:
    lin = nn.Linear(H, H, dtype=dtype)
    x = torch.randn(B, H).to(dtype)
    e = dtype.itemsize
    # addmm saves mat1 = x (B*H elements) because the weight requires grad; w.t() is a parameter view
    assert _saved(lin, x) == [("addmm", (B, H), dtype, B * H * e)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_saves_its_output_gelu_its_input(dtype: torch.dtype) -> None:
    e = dtype.itemsize
    h = _act(dtype, B, H)
    led = saved_tensors(torch.relu, h)
    # relu's backward needs only the output mask: its result, B*H elements
    assert _saved(torch.relu, h) == [("relu", (B, H), dtype, B * H * e)]
    assert led.entries[0].producer == "relu"
    # gelu's derivative is a function of its input: h itself, made outside
    led = saved_tensors(F.gelu, h)
    assert [(x.op, x.producer, x.bytes) for x in led.entries] == [("gelu", "external", B * H * e)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_saves_input_mean_rstd(dtype: torch.dtype) -> None:
    e = dtype.itemsize
    h = _act(dtype, B, H)
    ln = nn.LayerNorm(H, dtype=dtype)
    # input B*H, plus mean and rstd as (B, 1) in the input dtype (CPU keeps bf16 stats in bf16)
    assert _saved(ln, h) == [
        ("native_layer_norm", (B, H), dtype, B * H * e),
        ("native_layer_norm", (B, 1), dtype, B * e),
        ("native_layer_norm", (B, 1), dtype, B * e),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_saves_its_output(dtype: torch.dtype) -> None:
    h = _act(dtype, B, H)
    # _softmax's backward is y * (g - sum(g * y)): the output only
    assert _saved(torch.softmax, h, -1) == [("_softmax", (B, H), dtype, B * H * dtype.itemsize)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_noise_vs_native_mask(dtype: torch.dtype) -> None:
    h = _act(dtype, B, H)
    # F.dropout on CPU is x * noise with noise = bernoulli(1-p)/(1-p) in the input dtype; mul saves noise
    led = saved_tensors(F.dropout, h, 0.5)
    assert [(x.op, x.dtype, x.bytes) for x in led.entries] == [("mul", dtype, B * H * dtype.itemsize)]
    # native_dropout keeps a bool mask: one byte per element, whatever the dtype
    assert _saved(torch.native_dropout, h, 0.5, True) == [("native_dropout", (B, H), torch.bool, B * H)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_saves_both_operands(dtype: torch.dtype) -> None:
    e = dtype.itemsize
    a, b = _act(dtype, 2, 3, 4), _act(dtype, 2, 4, 5)
    # 3-d matmul is bmm; each operand is needed for the other's gradient
    assert sorted(x[3] for x in _saved(torch.matmul, a, b)) == sorted([2 * 3 * 4 * e, 2 * 4 * 5 * e])
    assert {x[0] for x in _saved(torch.matmul, a, b)} == {"bmm"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_saves_the_copy_of_a_noncontiguous_operand(dtype: torch.dtype) -> None:
    e = dtype.itemsize
    a = _act(dtype, 2, 3, 2, 4).transpose(1, 2)  # (2, 2, 3, 4), batch dims not foldable
    b = _act(dtype, 2, 2, 4, 5)
    led = saved_tensors(torch.matmul, a, b)
    # folding a to (4, 3, 4) needs a copy (clone); bmm saves that copy, not a
    rows = sorted((x.producer, x.shape, x.bytes) for x in led.entries)
    assert rows == [("clone", (4, 3, 4), 4 * 3 * 4 * e), ("external", (4, 4, 5), 4 * 4 * 5 * e)]


def test_dedupe_by_storage_and_whole_storage_bytes() -> None:
    h = _act(torch.float32, B, H)
    # mul saves both operands: the same storage, counted once
    assert _saved(lambda t: t * t, h) == [("mul", (B, H), torch.float32, B * H * 4)]
    # relu saves its output and mm saves it again as an input: one entry, attributed to relu
    w = nn.Parameter(torch.randn(H, H))
    assert [x[0] for x in _saved(lambda t: torch.relu(t) @ w, h)] == ["relu"]
    # a saved view keeps its whole storage alive: bytes are the storage's, the shape is the view's
    assert _saved(lambda t: torch.sin(t[:1]), h) == [("sin", (1, H), torch.float32, B * H * 4)]


def test_parameters_and_exclude_are_left_out() -> None:
    w = nn.Parameter(torch.randn(H, H))
    # the input is a leaf that requires grad, but not a Parameter: it is an activation, and counts
    leaf = torch.randn(B, H, requires_grad=True)
    assert _saved(lambda t: t @ w, leaf) == [("mm", (B, H), torch.float32, B * H * 4)]
    assert _saved(lambda t: t @ w, leaf, exclude=leaf) == []
    h = _act(torch.float32, B, H)
    assert _saved(F.gelu, h, exclude=h) == []
    assert _saved(F.gelu, h, exclude=[[h]]) == []


def test_linear_on_an_input_that_requires_grad_leaves_out_the_weight_view() -> None:
    lin = nn.Linear(H, 2 * H)
    x = torch.randn(B, H, requires_grad=True)
    # addmm now saves mat2 = weight.t() too (for x's gradient): a view of a Parameter, left out
    led = saved_tensors(lin, x)
    assert [(e.op, e.shape, e.bytes) for e in led.entries] == [("addmm", (B, H), B * H * 4)]


# ---------------------------------------------------------------- ledger: lifetimes and nesting (Rules B, C)
def _weak_output(run) -> "weakref.ref":
    out = run()
    ref = weakref.ref(out)
    del out
    gc.collect()
    return ref


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_a_measured_output_dies_with_its_ledger(model: str) -> None:
    if model == "mlp":
        m = MLPChain(MLPConfig(n_layers=3, width=16))
        x = mlp_input(m.cfg, batch=4)
    else:
        cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dropout=0.1)
        m = GPTStack(cfg)
        x = gpt_input(cfg)
    # reference: without the ledger, the output (and the graph it holds) is freed
    assert _weak_output(lambda: m(x))() is None
    inner: list[weakref.ref] = []  # the storage of an activation deep inside, which the graph saves
    # a ReLU saves its output; a LayerNorm's output is saved by the Linear after it
    first = next(mod for mod in m.modules() if isinstance(mod, (nn.ReLU, nn.LayerNorm)))
    handle = first.register_forward_hook(lambda mod, args, out: inner.append(weakref.ref(out.untyped_storage())))
    led = saved_tensors(m, x, model=m)
    handle.remove()
    ref = weakref.ref(led.result)
    assert inner[0]() is not None
    del led
    gc.collect()
    assert ref() is None and inner[0]() is None


def test_backward_through_a_ledger_graph_gives_the_plain_gradients() -> None:
    cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=2, dropout=0.0)
    torch.manual_seed(0)
    m = GPTStack(cfg)
    x = gpt_input(cfg, requires_grad=True)
    m(x).square().sum().backward()
    want = [p.grad.clone() for p in m.parameters()] + [x.grad.clone()]
    m.zero_grad(set_to_none=True)
    x.grad = None
    saved_tensors(m, x, model=m).result.square().sum().backward()
    got = [p.grad for p in m.parameters()] + [x.grad]
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_nested_ledgers_both_see_the_inner_region() -> None:
    a = torch.randn(B, H, requires_grad=True)
    with Ledger() as outer:
        y = torch.tanh(a)  # saves its output: B*H*4
        with Ledger() as inner:
            z = torch.exp(y)  # saves its output: another B*H*4
    assert inner.total_bytes == B * H * 4 and [e.op for e in inner.entries] == ["exp"]
    assert outer.total_bytes == 2 * B * H * 4 and [e.op for e in outer.entries] == ["tanh", "exp"]
    with Ledger() as outer:
        y = torch.tanh(a)
        with Ledger() as inner:
            z = torch.exp(y)
        w = torch.sin(z)  # saves its input z, already counted as exp's output: once
    assert outer.total_bytes == 2 * B * H * 4 and [e.op for e in outer.entries] == ["tanh", "exp"]
    del w


def test_nested_ledger_with_a_model_attributes_inside_it() -> None:
    model = nn.Sequential(nn.Linear(H, H), nn.ReLU())
    x = torch.randn(B, H)
    with Ledger() as outer:
        inner = saved_tensors(model, x, model=model)
    # the inner ledger leaves parameters out and names modules; the outer one sees the same storages
    assert inner.by_module() == {"0": B * H * 4, "1": B * H * 4}
    assert outer.total_bytes == inner.total_bytes


def test_ledger_around_checkpoints_sees_their_inputs_only() -> None:
    cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dropout=0.0)
    block = GPTStack(cfg, final_norm=False).blocks[0]
    x = gpt_input(cfg, requires_grad=True)
    led = saved_tensors(lambda t: checkpoint(block, t, use_reentrant=False), x)
    assert led.total_bytes == x.untyped_storage().nbytes()


def test_module_attribution_buffers_and_table() -> None:
    model = nn.Sequential(nn.Linear(H, H), nn.Sequential(nn.ReLU(), nn.BatchNorm1d(H)), nn.Softmax(-1))
    x = torch.randn(B, H)
    led = saved_tensors(model, x, model=model)
    # BatchNorm saves its input (relu's output, already counted for "1.0"), its running stats
    # (buffers: left out) and save_mean/save_invstd, (H,) each
    assert led.by_module() == {"0": B * H * 4, "1.0": B * H * 4, "1.1": 2 * H * 4, "2": B * H * 4}
    assert led.by_op()["addmm"] == B * H * 4
    text = str(led.table())
    assert text.splitlines()[-1].split() == ["total", str(len(led.entries)), f"{led.total_bytes:,}"]
    assert "<table>" in led.table()._repr_html_()
    assert all(len(m._forward_hooks) == 0 and len(m._forward_pre_hooks) == 0 for m in model.modules())


def test_ledger_of_gpt_block_is_the_paper_plus_layer_norm_stats() -> None:
    cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dropout=0.1)
    model = GPTStack(cfg, final_norm=False)
    led = saved_tensors(model, gpt_input(cfg), model=model)
    # Korthikanti et al.'s per-layer terms at 4-byte activations and 1-byte masks, plus what the
    # paper leaves out: mean and rstd of the two LayerNorms, (b, s, 1) fp32 each
    ln_stats = 2 * 2 * cfg.batch * cfg.seq * 4
    assert led.total_bytes == korthikanti_bytes(cfg, act_bytes=4) + ln_stats
    assert all(e.module.startswith("blocks.0.") for e in led.entries)


# ---------------------------------------------------------------- meter vs MemTracker
def _train_step(model, opt, x) -> None:
    """The kit's training step (labkit.planners.measuring), once."""
    train_step(model, opt, x, lambda y: y.float().square().mean())()


def _both_peaks(make) -> tuple[int, int]:
    model, opt, x = make()
    meter = measure_peak(_train_step, model, opt, x, track=(model, opt, x))
    model, opt, x = make()
    mt = MemTracker()
    mt.track_external(model, opt, x)
    with mt:
        _train_step(model, opt, x)
    return meter.peak, mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def _mlp():
    cfg = MLPConfig(n_layers=6, width=64)
    model = MLPChain(cfg)
    return model, torch.optim.Adam(model.parameters()), mlp_input(cfg, batch=32)


def _gpt():
    cfg = GPTConfig(seq=16, batch=2, hidden=32, heads=4, n_layers=2, dropout=0.1)
    model = GPTStack(cfg)
    return model, torch.optim.Adam(model.parameters()), gpt_input(cfg)


@pytest.mark.parametrize("make", [_mlp, _gpt], ids=["mlp", "gpt"])
def test_meter_peak_agrees_with_memtracker(make) -> None:
    ours, ref = _both_peaks(make)
    print(f"meter peak {ours} B, MemTracker peak {ref} B")
    assert abs(ours - ref) <= 0.05 * ref


def test_meter_counts_tracked_state_and_frees() -> None:
    x = torch.randn(256)  # 1 KiB, tracked from the start
    with MemoryMeter(x) as m:
        y = x * 2  # +1 KiB
        del y  # -1 KiB
        z = x + 1
    assert m.baseline == 1024 and m.peak == 2048 and m.live == 2048
    assert [(e.op, e.delta) for e in m.timeline] == [("mul", 1024), ("free", -1024), ("add", 1024)]
    del z


def test_meter_peak_is_exact_at_every_event() -> None:
    with MemoryMeter() as m:
        y = torch.ones(10)  # 40 B, the first event: the peak must not lag it
    assert m.peak == 40 and m.timeline[-1].live_bytes == 40
    with MemoryMeter() as m:
        a = torch.ones(10)
        del a
        b = torch.ones(20)  # 80 B after a free: the peak is the largest live total, 80
    assert m.peak == 80 and [e.live_bytes for e in m.timeline] == [40, 0, 80]
    del y, b


def test_optimizer_phase_ends_with_the_step() -> None:
    w = nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = torch.ones(4)
    with MemoryMeter(w, opt) as m:
        opt.step()
        after = torch.ones(3)
    assert m.timeline[-1].op == "ones" and m.timeline[-1].phase == "forward"
    assert "optimizer" in {e.phase for e in m.timeline[:-1]}
    del after


# ---------------------------------------------------------------- phases
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recompute_is_tagged_only_during_backward(reentrant: bool) -> None:
    model = nn.Sequential(nn.Linear(H, H), nn.Tanh(), nn.Linear(H, H), nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(B, H, requires_grad=True)
    with MemoryMeter(model, opt, x) as m:
        loss = checkpoint(model, x, use_reentrant=reentrant).sum()
        start = len(m.timeline)
        loss.backward()
        stop = len(m.timeline)
        opt.step()
        with m.phase("mine"):
            torch.ones(3)
    phases = [e.phase for e in m.timeline]
    recompute = [i for i, p in enumerate(phases) if p == "recompute"]
    assert recompute and all(start <= i < stop for i in recompute)
    last_bw = len(phases) - 1 - phases[::-1].index("backward")
    assert phases.index("optimizer") > last_bw and "mine" in m.phase_peaks
    assert set(m.phase_peaks) == {"forward", "backward", "recompute", "optimizer", "mine"}


def test_no_recompute_without_checkpoint() -> None:
    model = nn.Sequential(nn.Linear(H, H), nn.Tanh())
    m = measure_peak(lambda: model(torch.randn(B, H)).sum().backward(), track=model)
    assert {e.phase for e in m.timeline} == {"forward", "backward"}
    assert m.peak == max(m.phase_peaks.values()) and m.phase_peaks[m.peak_phase] == m.peak


# ---------------------------------------------------------------- errors and cleanup
def test_errors() -> None:
    m = MemoryMeter()
    with m:
        with pytest.raises(RuntimeError, match="create a new MemoryMeter"):
            m.__enter__()
    with pytest.raises(RuntimeError, match="one region"):
        with m:
            pass
    with pytest.raises(TypeError, match="got int"):
        measure_peak(3)
    with pytest.raises(TypeError, match="got str"):
        saved_tensors("model")
    with pytest.raises(TypeError, match="cannot track dict.*nn.Module"):
        MemoryMeter({"a": 1})
    with torch.device("meta"):
        meta_model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"meta device: materialise it with .to_empty\(device=...\)"):
        MemoryMeter(meta_model)


def _clean() -> bool:
    return (
        torch._C._len_torch_dispatch_stack() == 0
        and torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    )


@pytest.mark.parametrize("kind", ["ledger", "meter"])
def test_exception_leaves_nothing_installed(kind: str) -> None:
    resize = torch.UntypedStorage.resize_
    model = nn.Sequential(nn.Linear(H, H))

    def boom(t: torch.Tensor) -> None:
        model(t)
        raise KeyError("inside")

    x = torch.randn(B, H)
    with pytest.raises(KeyError):
        if kind == "ledger":
            saved_tensors(boom, x, model=model)
        else:
            measure_peak(boom, x, track=model)
    assert _clean() and torch.UntypedStorage.resize_ is resize
    assert all(len(m._forward_hooks) == 0 for m in model.modules())
    # the next measurement is unaffected
    assert _saved(model, x) == [("addmm", (B, H), torch.float32, B * H * 4)]
    with MemoryMeter(x) as m:
        torch.ones(10)
    assert m.peak == B * H * 4 + 40 and _clean()


# ---------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_meter_and_allocator_agree() -> None:
    cfg = MLPConfig(n_layers=4, width=1024)
    model = MLPChain(cfg).cuda()
    opt = torch.optim.Adam(model.parameters())
    x = mlp_input(cfg, batch=512).cuda()
    _train_step(model, opt, x)  # warm-up: cuBLAS workspace and Adam state exist before entry
    torch.cuda.synchronize()
    m = measure_peak(_train_step, model, opt, x, track=(model, opt, x))
    assert m.allocator_peak is not None
    # both are growth over entry; the allocator rounds blocks up to 512 B
    grown = m.peak - m.baseline
    print(f"meter peak growth {grown} B, allocator peak growth {m.allocator_peak} B")
    assert abs(m.allocator_peak - grown) <= 0.05 * grown


# ---------------------------------------------------------------- found by tools/mutants.py
def test_ledger_table_text_exactly() -> None:
    x = torch.randn(B, H, requires_grad=True)
    led = saved_tensors(lambda t: torch.relu(torch.tanh(t)), x)  # outside any module: module "-"
    assert str(led.table()).splitlines() == [
        "module  op    count  bytes",
        "--------------------------",
        "-       tanh      1    128",
        "-       relu      1    128",
        "--------------------------",
        "total             2    256",
    ]


def test_ledger_refuses_a_meta_model_and_a_string_exclude() -> None:
    with torch.device("meta"):
        meta_model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="meta device"):
        Ledger(model=meta_model)
    with pytest.raises(TypeError, match=r"Ledger\(exclude=...\): expected tensors or iterables of tensors, got str"):
        saved_tensors(torch.sin, torch.ones(2), exclude="x")


def test_ledger_holds_no_storage_once_its_op_is_settled() -> None:
    a = torch.randn(B, H, requires_grad=True)
    with Ledger() as led:
        y = torch.tanh(a)  # tanh's node saves y
        ref = weakref.ref(y.untyped_storage())
        del y  # the graph goes with y
        torch.sin(a.detach())  # the next op settles the pending pack
        gc.collect()
        assert ref() is None
    assert led.total_bytes == B * H * 4


def test_meter_follows_storage_resize_as_fsdp_does_it() -> None:
    t = torch.empty(100)  # 400 B
    with MemoryMeter(t) as m:
        t.untyped_storage().resize_(0)  # FSDP frees unsharded parameters this way, outside dispatch
        t.untyped_storage().resize_(200)
    assert [(e.op, e.delta) for e in m.timeline] == [("resize_", -400), ("resize_", 200)]
    assert m.baseline == 400 and m.live == 200 and m.peak == 400


def test_meter_tracks_nested_lists() -> None:
    a, b, c = torch.ones(10), torch.ones(20), torch.ones(30)
    with MemoryMeter([a, [b, (c,)]]) as m:
        pass
    assert m.baseline == 4 * (10 + 20 + 30)


def test_meter_ignores_the_resize_of_a_storage_it_does_not_track() -> None:
    outside = torch.empty(50)  # made before the meter, not tracked
    with MemoryMeter() as m:
        outside.untyped_storage().resize_(0)
        y = torch.ones(3)
    assert [(e.op, e.delta) for e in m.timeline] == [("ones", 12)]
    del y


def test_a_meter_kept_after_its_region_holds_nothing_it_tracked() -> None:
    # a notebook keeps meters in variables; the model, optimizer and input they tracked must still be freed
    model = MLPChain(MLPConfig(n_layers=2, width=16))
    opt = torch.optim.Adam(model.parameters())
    x = mlp_input(model.cfg, batch=4)
    m = measure_peak(_train_step, model, opt, x, track=(model, opt, x))
    refs = [weakref.ref(model), weakref.ref(opt), weakref.ref(x)]
    del model, opt, x
    gc.collect()
    assert m.peak > m.baseline > 0 and all(r() is None for r in refs)


def test_a_meter_on_one_device_leaves_the_others_out():
    import labkit as lk

    a = torch.randn(64, 64)
    with lk.MemoryMeter(device="meta") as none_here:  # no storage on the meta device is ever counted
        b = a @ a
    with lk.MemoryMeter(device="cpu") as here:
        c = a @ a
    assert none_here.peak == 0 and here.peak == c.untyped_storage().nbytes() == b.untyped_storage().nbytes()
    with lk.MemoryMeter(device="cuda:0") as on_a_gpu:  # a step offloading to the host: host bytes are not counted
        d = a @ a
    assert on_a_gpu.peak == 0 and d.device.type == "cpu"
    with pytest.raises(RuntimeError):
        lk.MemoryMeter(device="nowhere")


def test_a_higher_order_operator_with_a_subgraph_is_refused_by_name_not_half_counted():
    """The meter counts the one-op rng wrappers a compiled checkpoint calls; a subgraph it could not see into
    (torch.cond's branches) is refused, naming the operator, rather than counted by its outputs alone."""
    from torch._higher_order_ops.cond import cond_op

    x = torch.randn(4)
    with MemoryMeter(), pytest.raises(NotImplementedError, match="higher-order operator cond"):
        cond_op(torch.tensor(True), lambda t: t.sin(), lambda t: t.cos(), (x,))


def test_a_saved_wrapper_subclass_is_counted_by_the_tensors_it_holds_and_one_it_cannot_read_is_refused():
    """Rule D, one function for the ledger and the storages every instrument reads (tensors.plain_tensors)."""
    from torch.testing._internal.two_tensor import TwoTensor

    from labkit.instruments.tensors import plain_tensors, tensor_storages

    a, b = torch.randn(8), torch.randn(8)
    pair = TwoTensor(a, b)
    assert [t is a or t is b for t in plain_tensors(pair)] == [True, True] and len(tensor_storages(pair)) == 2
    x = torch.randn(8, requires_grad=True)
    with Ledger() as ledger:
        TwoTensor(x * 1, x * 2).sin().sum()  # sin saves its input: the pair, two 8-float tensors
    assert ledger.total_bytes == 2 * 8 * 4

    class Opaque(torch.Tensor):  # a wrapper with no __tensor_flatten__: its storage is a stand-in
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return NotImplemented  # never reached: only its storage is asked for

    opaque = Opaque(a)
    assert list(plain_tensors(opaque)) == [opaque]
    from labkit.instruments.ledger import _storage
    with pytest.raises(TypeError, match="a subclass whose bytes cannot be read"):
        _storage(opaque)
