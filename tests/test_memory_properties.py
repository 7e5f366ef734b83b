"""The instruments against their analytic models and against PyTorch, on drawn configurations (Hypothesis).

The ledger of a GPT block equals Korthikanti et al.'s terms module by module (plus the LayerNorm statistics the
paper leaves out; with dropout off, without the masks and with the dropout output merged into the softmax
output); the ledger of an MLP chain is (n_layers + 1) activations; the meter's peak over a training step equals
MemTracker's. Fixed points miss what drawn ones find.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed._tools.mem_tracker import MemTracker

from labkit.instruments import measure_peak, saved_tensors
from labkit.models import GPTBlock, GPTConfig, GPTStack, MLPChain, MLPConfig, gpt_input, korthikanti_terms, mlp_input
from labkit.planners.measuring import train_step

DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float64])
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def gpt_configs(draw, n_layers: int = 1) -> GPTConfig:
    heads = draw(st.sampled_from([1, 2, 4]))
    return GPTConfig(seq=draw(st.integers(1, 12)), batch=draw(st.integers(1, 3)),
                     hidden=heads * draw(st.sampled_from([2, 4, 8])), heads=heads, n_layers=n_layers,
                     dtype=draw(DTYPES), dropout=draw(st.sampled_from([0.0, 0.1])))


def analytic_by_module(cfg: GPTConfig) -> dict[str, int]:
    """Bytes one block keeps per module, from the formula's terms."""
    merged = ("softmax dropout mask", "attention residual dropout mask", "MLP dropout mask",
              "attention-over-V: dropout output")  # with dropout off: no masks, and the dropout returns its input
    out: dict[str, int] = {}
    for term in korthikanti_terms(cfg):
        if cfg.dropout == 0 and term.name in merged:
            continue
        out[term.module] = out.get(term.module, 0) + term.bytes
    stats = 2 * cfg.seq * cfg.batch * torch.empty((), dtype=cfg.dtype).element_size()  # mean, rstd (CPU: in dtype)
    out["ln1"] += stats
    out["ln2"] += stats
    return {m: b for m, b in out.items() if b}


def folded(by_module: dict[str, int], prefix: str = "") -> dict[str, int]:
    """Ledger bytes per top module of a block (attn.core.drop into attn.core), `prefix` stripped."""
    tops = ("ln1", "attn.qkv", "attn.core", "attn.proj", "attn.drop", "ln2", "mlp.fc1", "mlp.act", "mlp.fc2",
            "mlp.drop")
    out: dict[str, int] = {}
    for module, nbytes in by_module.items():
        name = module[len(prefix):]
        top = next(t for t in tops if name == t or name.startswith(t + "."))
        out[top] = out.get(top, 0) + nbytes
    return out


@SLOW
@given(gpt_configs())
def test_ledger_of_a_block_is_the_analytic_model_module_by_module(cfg):
    block = GPTBlock(cfg)
    with torch.random.fork_rng(devices=[]):
        ledger = saved_tensors(block, gpt_input(cfg), model=block)
    assert folded(ledger.by_module()) == analytic_by_module(cfg)


@SLOW
@given(st.integers(1, 3).flatmap(lambda n: gpt_configs(n_layers=n)))
def test_ledger_of_a_stack_is_n_blocks(cfg):
    model = GPTStack(cfg, final_norm=False)
    with torch.random.fork_rng(devices=[]):
        ledger = saved_tensors(model, gpt_input(cfg), model=model)
    for i in range(cfg.n_layers):
        mine = {m: b for m, b in ledger.by_module().items() if m.startswith(f"blocks.{i}.")}
        assert folded(mine, f"blocks.{i}.") == analytic_by_module(cfg)


@SLOW
@given(st.integers(1, 6), st.integers(1, 24), st.integers(1, 9), DTYPES)
def test_ledger_of_an_mlp_chain_is_n_plus_one_activations(n_layers, width, batch, dtype):
    model = MLPChain(MLPConfig(n_layers, width, dtype=dtype))
    ledger = saved_tensors(model, mlp_input(model.cfg, batch), model=model)
    assert ledger.total_bytes == (n_layers + 1) * batch * width * dtype.itemsize


def _train_step(model, opt, x) -> None:
    """The kit's training step (labkit.planners.measuring), once."""
    train_step(model, opt, x, lambda y: y.float().square().mean())()


def _peaks(make) -> tuple[int, int]:
    """The meter's and MemTracker's peak over one Adam step of the same fresh model."""
    model, opt, x = make()
    ours = measure_peak(_train_step, model, opt, x, track=(model, opt, x)).peak
    model, opt, x = make()
    tracker = MemTracker()
    tracker.track_external(model, opt, x)
    with tracker:
        _train_step(model, opt, x)
    return ours, tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.tuples(st.just("mlp"), st.integers(1, 4), st.integers(2, 48), st.integers(1, 16)),
                 st.tuples(st.just("gpt"), gpt_configs())))
@pytest.mark.filterwarnings("ignore")
def test_meter_peak_equals_memtracker(drawn):
    def make():
        torch.manual_seed(0)
        if drawn[0] == "mlp":
            _, n_layers, width, batch = drawn
            model = MLPChain(MLPConfig(n_layers, width))
            x = mlp_input(model.cfg, batch)
        else:
            cfg = drawn[1]
            model = GPTStack(GPTConfig(**{**cfg.__dict__, "dtype": torch.float32}))
            x = gpt_input(model.cfg)
        return model, torch.optim.Adam(model.parameters()), x

    ours, theirs = _peaks(make)
    assert ours == theirs
