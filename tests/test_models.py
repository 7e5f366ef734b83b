"""Tests for labkit.models: configs, determinism, Dropout, and the measured vs analytic activation memory."""
from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint_sequential

from labkit.instruments import saved_tensors
from labkit.models import (
    ActivationTerm, Dropout, GPTBlock, GPTConfig, GPTStack, MLPChain, MLPConfig, gpt_input,
    gpt_param_count, korthikanti_bytes, korthikanti_terms, mlp_input, parameter_bytes,
)

SMALL = dict(seq=8, batch=2, hidden=16, heads=2, n_layers=2)


# ---------------------------------------------------------------- configs

@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(heads=3), ValueError, ["hidden=16", "heads=3"]),
    (dict(dropout=1.0), ValueError, ["dropout=1.0", "0 <= dropout < 1"]),
    (dict(dropout=-0.1), ValueError, ["dropout=-0.1"]),
    (dict(dtype=torch.int64), TypeError, ["torch.int64", "floating"]),
    (dict(seq=0), ValueError, ["seq=0", "positive"]),
    (dict(batch=2.0), TypeError, ["batch=2.0", "int"]),
    (dict(n_layers=True), TypeError, ["n_layers=True"]),
])
def test_gpt_config_rejects_bad_values(kwargs, exc, words):
    with pytest.raises(exc) as info:
        GPTConfig(**{**SMALL, **kwargs})
    for word in words:
        assert word in str(info.value)


def test_mlp_config_rejects_bad_values():
    with pytest.raises(ValueError, match="width=0"):
        MLPConfig(n_layers=2, width=0)
    with pytest.raises(TypeError, match="torch.int32"):
        MLPConfig(n_layers=2, width=4, dtype=torch.int32)


# ---------------------------------------------------------------- determinism

def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_mlp_same_seed_same_model_and_global_rng_untouched():
    state = torch.get_rng_state()
    cfg = MLPConfig(n_layers=3, width=8, seed=7)
    a, b = MLPChain(cfg), MLPChain(cfg)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(_params(a), _params(b)))
    x = mlp_input(cfg, batch=4)
    assert torch.equal(a(x), b(x))
    c = MLPChain(MLPConfig(n_layers=3, width=8, seed=8))
    assert not torch.equal(a.layers[0][0].weight, c.layers[0][0].weight)


def test_mlp_layout_works_with_checkpoint_sequential():
    cfg = MLPConfig(n_layers=4, width=8)
    model = MLPChain(cfg)
    assert isinstance(model.layers[2][0], torch.nn.Linear) and isinstance(model.layers[2][1], torch.nn.ReLU)
    x = mlp_input(cfg, batch=3, requires_grad=True)
    y = checkpoint_sequential(model.layers, 2, x, use_reentrant=False)
    assert torch.allclose(y, model(x))


def test_gpt_same_seed_same_params_and_outputs():
    state = torch.get_rng_state()
    cfg = GPTConfig(**SMALL, seed=3)
    a, b = GPTStack(cfg).eval(), GPTStack(cfg).eval()
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(_params(a), _params(b)))
    x = gpt_input(cfg)
    assert torch.equal(x, gpt_input(cfg))
    assert torch.equal(a(x), b(x))
    # Blocks of one stack differ; another seed differs.
    assert not torch.equal(a.blocks[0].attn.qkv.weight, a.blocks[1].attn.qkv.weight)
    c = GPTStack(GPTConfig(**SMALL, seed=4)).eval()
    assert not torch.equal(a.blocks[0].attn.qkv.weight, c.blocks[0].attn.qkv.weight)
    assert not torch.equal(a(x), c(x))
    assert not torch.equal(x, gpt_input(GPTConfig(**SMALL, seed=4)))


# ---------------------------------------------------------------- GPT block

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_block_shape_and_gradient_reaches_every_parameter(dtype, bias):
    cfg = GPTConfig(**SMALL, dtype=dtype, bias=bias)
    block = GPTBlock(cfg).train()
    x = gpt_input(cfg, requires_grad=True)
    y = block(x)
    assert y.shape == (cfg.batch, cfg.seq, cfg.hidden) and y.dtype == dtype
    y.float().square().sum().backward()
    assert x.grad is not None
    for name, p in block.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_attention_is_causal():
    cfg = GPTConfig(**SMALL, dropout=0.0)
    block = GPTBlock(cfg).eval()
    x = gpt_input(cfg)
    x2 = x.clone()
    x2[:, -1] += 1.0  # change only the last position
    y, y2 = block(x), block(x2)
    assert torch.equal(y[:, :-1], y2[:, :-1])
    assert not torch.equal(y[:, -1], y2[:, -1])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("final_norm", [True, False])
def test_param_count_matches_model(bias, final_norm):
    cfg = GPTConfig(**SMALL, bias=bias, dtype=torch.bfloat16)
    model = GPTStack(cfg, final_norm=final_norm)
    n = sum(p.numel() for p in model.parameters())
    assert n == gpt_param_count(cfg, final_norm=final_norm)
    assert parameter_bytes(model) == 2 * n
    if bias:
        h = cfg.hidden
        assert sum(p.numel() for p in model.blocks[0].parameters()) == 12 * h * h + 13 * h


# ---------------------------------------------------------------- Dropout

def _saved(fn, x):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t), t)[1], lambda t: t):
        y = fn(x)
    return y, saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_saves_a_bool_mask(dtype):
    x = torch.randn(4, 32, dtype=dtype, requires_grad=True)
    y, saved = _saved(Dropout(0.5).train(), x)
    assert [(t.dtype, t.shape) for t in saved] == [(torch.bool, x.shape)]
    kept = saved[0]
    assert torch.equal(y, torch.where(kept, x * 2, torch.zeros_like(x)))


def test_dropout_identity_in_eval_and_at_p0():
    x = torch.randn(4, 32, requires_grad=True)
    for drop in (Dropout(0.5).eval(), Dropout(0.0).train()):
        y, saved = _saved(drop, x)
        assert y is x and saved == []
    with pytest.raises(ValueError, match="p=1.0"):
        Dropout(1.0)


# ---------------------------------------------------------------- analytic model

@settings(max_examples=200, deadline=None)
@given(s=st.integers(1, 4096), b=st.integers(1, 64), hd=st.integers(1, 256), a=st.integers(1, 64))
def test_korthikanti_closed_form_equals_term_sum(s, b, hd, a):
    h = hd * a
    cfg = GPTConfig(seq=s, batch=b, hidden=h, heads=a, n_layers=1)
    per_layer = korthikanti_bytes(cfg, act_bytes=2, mask_bytes=1)
    assert per_layer * h == s * b * h * (34 * h + 5 * a * s)  # s·b·h·(34 + 5·a·s/h), kept in integers
    assert per_layer == 34 * s * b * h + 5 * a * s * s * b


@settings(max_examples=50, deadline=None)
@given(n_layers=st.integers(1, 8), act=st.sampled_from([1, 2, 4]), mask=st.sampled_from([1, 2, 4]))
def test_korthikanti_general_element_sizes(n_layers, act, mask):
    cfg = GPTConfig(seq=16, batch=3, hidden=24, heads=4, n_layers=n_layers)
    sbh, as2b = 16 * 3 * 24, 4 * 16 * 16 * 3
    expected = (16 * act + 2 * mask) * sbh + (2 * act + mask) * as2b
    assert korthikanti_bytes(cfg, act_bytes=act, mask_bytes=mask) == n_layers * expected


def test_korthikanti_terms_per_module_and_default_element_size():
    cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dtype=torch.bfloat16)
    terms = korthikanti_terms(cfg)
    assert all(isinstance(t, ActivationTerm) for t in terms)
    sbh, as2b = 8 * 2 * 16, 2 * 8 * 8 * 2
    by_module = defaultdict(int)
    for t in terms:
        by_module[t.module] += t.bytes
    assert dict(by_module) == {
        "ln1": 2 * sbh, "attn.qkv": 2 * sbh, "attn.core": 6 * sbh + 5 * as2b, "attn.proj": 2 * sbh,
        "attn.drop": sbh, "ln2": 2 * sbh, "mlp.fc1": 2 * sbh, "mlp.act": 8 * sbh, "mlp.fc2": 8 * sbh,
        "mlp.drop": sbh,
    }
    assert {t.name: t.formula for t in terms}["Q and K"] == "4·sbh"
    # Default act_bytes is the element size of cfg.dtype: float32 doubles the activation terms.
    f32 = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1)
    assert korthikanti_bytes(f32) == (16 * 4 + 2) * sbh + (2 * 4 + 1) * as2b
    with pytest.raises(ValueError, match="act_bytes=0"):
        korthikanti_terms(cfg, act_bytes=0)


# ---------------------------------------------------------------- measured vs analytic

def saved_bytes_by_module(block: GPTBlock, x: torch.Tensor, modules: set[str]) -> dict[str, int]:
    """Bytes autograd saves in one forward of `block`, attributed to the innermost enclosing module in `modules`.

    Tensors are deduplicated by storage; parameters, views of them and
    buffers (the causal mask) are skipped.
    """
    skip = {t.untyped_storage().data_ptr() for t in [*block.parameters(), *block.buffers()]}
    names = {m: n for n, m in block.named_modules()}
    stack: list[str] = []
    hooks = []
    for m in block.modules():
        hooks.append(m.register_forward_pre_hook(lambda m, args: stack.append(names[m])))
        hooks.append(m.register_forward_hook(lambda m, args, out: stack.pop() and None))
    seen: set[int] = set()
    out: dict[str, int] = defaultdict(int)

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip and ptr not in seen:
            seen.add(ptr)
            owner = next(n for n in reversed(stack) if n in modules)
            out[owner] += t.untyped_storage().nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x)
    finally:
        for h in hooks:
            h.remove()
    return dict(out)


@pytest.mark.parametrize("dims", [
    dict(seq=8, batch=2, hidden=16, heads=2),
    dict(seq=12, batch=3, hidden=40, heads=5),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_measured_saved_bytes_equal_formula_term_by_term(dims, dtype):
    cfg = GPTConfig(**dims, n_layers=1, dtype=dtype, dropout=0.1)
    terms = korthikanti_terms(cfg)
    expected = defaultdict(int)
    for t in terms:
        expected[t.module] += t.bytes
    block = GPTBlock(cfg).train()
    measured = saved_bytes_by_module(block, gpt_input(cfg, requires_grad=True), set(expected))
    # The only extra: LayerNorm mean and rstd, (b, s, 1) each. On CPU they
    # have the activation dtype (CUDA keeps them in float32).
    stats = 2 * cfg.batch * cfg.seq * torch.empty((), dtype=dtype).element_size()
    expected["ln1"] += stats
    expected["ln2"] += stats
    assert measured == dict(expected)


def test_korthikanti_terms_name_their_modules():
    """Each term sits in the module that saves it (two masks of equal size must not swap unseen)."""
    cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1)
    assert {t.name: t.module for t in korthikanti_terms(cfg)} == {
        "LayerNorm 1 input": "ln1", "QKV input": "attn.qkv", "Q and K": "attn.core",
        "softmax output": "attn.core", "softmax dropout mask": "attn.core",
        "attention-over-V: dropout output": "attn.core", "attention-over-V: V": "attn.core",
        "output-projection input": "attn.proj", "attention residual dropout mask": "attn.drop",
        "LayerNorm 2 input": "ln2", "fc1 input": "mlp.fc1", "GeLU input": "mlp.act", "fc2 input": "mlp.fc2",
        "MLP dropout mask": "mlp.drop",
    }
    # and the ledger puts the bytes of each mask where its term says
    model = GPTBlock(cfg)
    led = saved_tensors(model, gpt_input(cfg), model=model)
    masks = {e.module: e.bytes for e in led.entries if e.dtype == torch.bool}
    assert masks == {"attn.core.drop": cfg.heads * cfg.seq ** 2 * cfg.batch,
                     "attn.drop": cfg.seq * cfg.batch * cfg.hidden, "mlp.drop": cfg.seq * cfg.batch * cfg.hidden}


def test_seeded_linear_draws_pytorchs_default_bound_or_a_normal_of_std_with_zero_bias():
    import math

    from labkit.models.layers import seeded_linear

    gen = torch.Generator().manual_seed(0)
    layer, bound = seeded_linear(400, 300, True, torch.float32, gen, std=None), 1 / math.sqrt(400)
    for t in (layer.weight, layer.bias):  # nn.Linear's own default: uniform within ±1/sqrt(fan_in)
        assert 0.95 * bound < t.abs().max() <= bound
    layer = seeded_linear(400, 300, True, torch.float32, gen, std=0.02)
    assert abs(layer.weight.mean()) < 0.001 and abs(layer.weight.std() - 0.02) < 0.001
    assert torch.equal(layer.bias, torch.zeros(300))
