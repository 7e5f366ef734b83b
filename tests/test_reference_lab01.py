"""Lab 01's reference code (labkit.reference.activation_memory) against what PyTorch really keeps.

predict_chain_bytes is held against an independent counter built here on torch.autograd.graph.saved_tensors_hooks
(each storage once, Parameters and their views left out); predict_block_bytes against Korthikanti's terms grouped by
module and against labkit's ledger (its LayerNorm mean/rstd taken out); training_state_bytes against the bytes of
parameters, their .grad and Adam's moment buffers after a real torch.optim.Adam step; crossover_batch against brute
force; saved_bytes against the counter and the ledger, and for freeing the graph it measured (no reference cycle).
"""
from __future__ import annotations

import gc
import weakref

import torch
from hypothesis import example, given, settings, strategies as st
from torch import nn

import labkit as lk
import labkit.reference.activation_memory as R

FLOATS = st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64])


def hook_bytes(fn, *args) -> int:
    """The oracle: collect every pack, then count each storage once, leaving out Parameters and views of them."""
    packed: list[tuple[bool, torch.Tensor]] = []

    def pack(t):
        base = t
        while base._base is not None:
            base = base._base
        packed.append((isinstance(base, nn.Parameter), t.detach()))
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for param, t in packed if not param}
    return sum(storages.values())


@st.composite
def gpt_cfgs(draw):
    heads, head_dim = draw(st.integers(1, 4)), draw(st.integers(2, 4))  # hidden >= 2: mean/rstd (b, s, 1) stand out
    return lk.GPTConfig(seq=draw(st.integers(1, 8)), batch=draw(st.integers(1, 3)), hidden=heads * head_dim,
                        heads=heads, n_layers=1, dropout=0.1, dtype=draw(FLOATS))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), batch=st.integers(1, 8), width=st.integers(1, 16), dtype=FLOATS, grad=st.booleans())
def test_predict_chain_bytes_is_what_autograd_saves(n, batch, width, dtype, grad):
    m = lk.MLPChain(lk.MLPConfig(n_layers=n, width=width, dtype=dtype))
    x = lk.mlp_input(m.cfg, batch, requires_grad=grad)
    want = R.predict_chain_bytes(n, batch, width, dtype)
    assert type(want) is int and want == hook_bytes(m, x)
    assert R.saved_bytes(m, x) == want == lk.saved_tensors(m, x).total_bytes  # the ledger, a third way


@settings(max_examples=25, deadline=None)
@given(cfg=gpt_cfgs(), grad=st.booleans())
def test_predict_block_bytes_is_the_paper_and_the_ledger_and_saved_bytes_the_counter(cfg, grad):
    got = R.predict_block_bytes(cfg)
    terms: dict[str, int] = {}
    for t in lk.korthikanti_terms(cfg):
        terms[t.module] = terms.get(t.module, 0) + t.bytes
    assert got == terms

    block = lk.GPTBlock(cfg)
    led = lk.saved_tensors(block, lk.gpt_input(cfg), model=block)
    measured = dict.fromkeys(got, 0)
    for module, nbytes in led.by_module().items():  # fold submodules (attn.core.drop) into the predicted module
        owner = [m for m in got if module == m or module.startswith(m + ".")]
        assert len(owner) == 1, f"the ledger saw {module!r}, which the prediction does not name"
        measured[owner[0]] += nbytes
    # LayerNorm's mean and rstd, (b, s, 1) each: two per LayerNorm, which the prediction leaves out
    stats = [e for e in led.entries if e.module in ("ln1", "ln2") and e.shape == (cfg.batch, cfg.seq, 1)]
    assert sorted(e.module for e in stats) == ["ln1", "ln1", "ln2", "ln2"]
    assert all(e.op == "native_layer_norm" and e.bytes == cfg.batch * cfg.seq * e.dtype.itemsize for e in stats)
    for e in stats:
        measured[e.module] -= e.bytes
    assert measured == got
    x = lk.gpt_input(cfg, requires_grad=grad)  # saved_bytes, ledger without model=: both count the causal mask
    assert R.saved_bytes(block, x) == hook_bytes(block, x) == lk.saved_tensors(block, x).total_bytes


def _adam_state(model) -> int:
    """Bytes after one Adam step: trainable parameters, their .grad, every tensor in opt.state except `step`."""
    if not any(p.requires_grad for p in model.parameters()):
        return 0  # Adam refuses an empty parameter list; there is nothing to train
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(3, model[0].in_features, dtype=model[0].weight.dtype)).float().square().mean().backward()
    opt.step()
    total = 0
    for p in model.parameters():
        if not p.requires_grad:
            assert p.grad is None and p not in opt.state  # frozen: no gradient, no Adam state
            continue
        state = opt.state[p]
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"} and state["step"].numel() == 1
        total += sum(t.untyped_storage().nbytes() for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"]))
    return total  # the scalar `step` tensor (4 bytes) is left out, as the exercise says


@settings(max_examples=25, deadline=None)
@given(w=st.integers(1, 8), w2=st.integers(1, 8), bias=st.booleans(), tie=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]), frozen=st.lists(st.booleans(), min_size=6))
@example(w=3, w2=2, bias=True, tie=True, dtype=torch.float32, frozen=[True] + [False] * 5)  # a frozen weight
def test_training_state_bytes_is_what_adam_keeps(w, w2, bias, tie, dtype, frozen):
    shared = nn.Linear(w, w, bias=bias, dtype=dtype)
    layers = [shared, nn.Tanh(), nn.Linear(w, w2, bias=bias, dtype=dtype), nn.Tanh(), nn.Linear(w2, w, dtype=dtype)]
    model = nn.Sequential(*layers, *([shared] if tie else []))  # a tied Linear is one set of parameters
    for p, off in zip(model.parameters(), frozen):
        p.requires_grad_(not off)
    want = R.training_state_bytes(model)
    assert type(want) is int and want == _adam_state(model)


@settings(max_examples=200, deadline=None)
@given(per=st.integers(1, 500), state=st.integers(0, 20_000), big=st.integers(0, 10**40))
def test_crossover_batch_is_the_brute_force_smallest(per, state, big):
    b = 1
    while b * per < state:
        b += 1
    got = R.crossover_batch(per, state)
    assert type(got) is int and got == b
    c = R.crossover_batch(per * 10**20 + 1, big)  # beyond floats' 53 bits: the defining property, exactly
    assert c >= 1 and c * (per * 10**20 + 1) >= big and (c == 1 or (c - 1) * (per * 10**20 + 1) < big)


def test_saved_bytes_counts_whole_storages_once_and_no_parameter_views():
    h = torch.randn(8, 4, requires_grad=True) * 1  # a non-leaf activation
    w = nn.Parameter(torch.randn(3, 4))
    assert R.saved_bytes(lambda t: t[:2] * t[2:4], h) == h.untyped_storage().nbytes() == 8 * 4 * 4
    assert R.saved_bytes(lambda t: t @ w.t(), h) == h.untyped_storage().nbytes()  # mm keeps w.t(): not counted
    assert R.saved_bytes(lambda t: t.exp().sum(), torch.randn(5, requires_grad=True)) == 5 * 4


def test_saved_bytes_leaves_no_reference_cycle_and_gradients_as_they_were():
    m = lk.MLPChain(lk.MLPConfig(n_layers=3, width=8))
    x = lk.mlp_input(m.cfg, 4, requires_grad=True)
    outs: list[torch.Tensor] = []
    R.saved_bytes(lambda t: outs.append(m(t)), x)  # the output is ReLU's, which ReLU's own node keeps
    ref = weakref.ref(outs[0])
    del outs[:]
    gc.collect()
    assert ref() is None, "the measured graph outlived its output: a pack returning t, not t.detach()?"
    # the probe can fail: a pack returning t itself makes the cycle, and the collector cannot free it
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        kept = weakref.ref(m(x))
    gc.collect()
    assert kept() is not None
    # backward through a graph recorded under saved_bytes gives the plain gradients, bitwise
    plain = torch.autograd.grad(m(x).sum(), [x, *m.parameters()])
    got: list = []
    R.saved_bytes(lambda t: got.extend(torch.autograd.grad(m(t).sum(), [t, *m.parameters()])), x)
    assert all(torch.equal(a, b) for a, b in zip(plain, got)) and len(got) == len(plain)
