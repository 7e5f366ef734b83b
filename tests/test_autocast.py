"""The gpu profile's bfloat16 path, on the CPU: GPT models whose forwards run under torch.autocast (GPTConfig's
autocast), the time labs' configs taking the profile's autocast, $LABKIT_AUTOCAST, and a recomputation under
autocast giving the plain step's gradients bit for bit. Every lab run whole on this path:
tests/test_autocast_labs.py (marker `long`)."""
from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import labkit as lk
from labkit.bench import lab02, lab04, lab06
from labkit.bench import plan as bench_plan
from labkit.env.profile import sizes
from labkit.env.sizes import FIXED, GPU_SHAPES

BF16 = replace(FIXED["tiny"], autocast="bfloat16")


def test_the_gpu_profile_trains_in_bfloat16_and_the_cpu_profiles_in_float32():
    assert GPU_SHAPES.autocast == "bfloat16" and GPU_SHAPES.amp is torch.bfloat16
    assert FIXED["tiny"].amp is None and FIXED["cpu"].amp is None
    for bad in ("float64", "float16"):  # float16 would need loss scaling, which the labs do not do
        with pytest.raises(ValueError, match=f"Sizes.autocast='{bad}' must be None or 'bfloat16'"):
            replace(FIXED["tiny"], autocast=bad)


@pytest.mark.parametrize("value, on_cpu, on_gpu", [("bfloat16", "bfloat16", "bfloat16"), (" BFloat16 ", "bfloat16", "bfloat16"),
                                                   ("none", None, None), ("", None, "bfloat16")])
def test_labkit_autocast_sets_the_profiles_autocast(monkeypatch, value, on_cpu, on_gpu):
    from labkit.env import profile

    monkeypatch.setenv("LABKIT_AUTOCAST", value)
    assert sizes("tiny").autocast == on_cpu
    assert profile._autocast(GPU_SHAPES).autocast == on_gpu  # what sizes("gpu") returns, on a GPU
    assert replace(sizes("tiny"), autocast=None) == FIXED["tiny"]  # nothing else changes


def test_a_bad_labkit_autocast_is_named(monkeypatch):
    for bad in ("fp8", " Float16"):
        monkeypatch.setenv("LABKIT_AUTOCAST", bad)
        with pytest.raises(ValueError, match=f"LABKIT_AUTOCAST={bad!r} is not an autocast; choose bfloat16 or none"):
            sizes("tiny")


@pytest.mark.parametrize("config", [lab02.recompute_config, lab04.long_config, lab06.rng_config,
                                    lambda size: bench_plan.capstone_config(size)[0]],
                         ids=["02", "04-05", "06", "07"])
def test_the_time_labs_models_take_the_profiles_autocast(config):
    assert config(BF16).autocast is torch.bfloat16
    assert config(FIXED["tiny"]).autocast is None


@pytest.mark.parametrize("autocast, dtype, words", [
    (torch.float64, torch.float32, "must be None, torch.bfloat16 or torch.float16"),
    ("bfloat16", torch.float32, "must be None, torch.bfloat16 or torch.float16"),
    (torch.bfloat16, torch.bfloat16, "needs float32 weights"),
])
def test_an_autocast_that_cannot_be_is_refused_by_name(autocast, dtype, words):
    with pytest.raises(TypeError, match=words):
        FIXED["tiny"].gpt(autocast=autocast, dtype=dtype)


def test_a_model_under_autocast_on_a_device_autocast_does_not_run_on_is_refused():
    cfg = BF16.gpt(autocast=torch.bfloat16)
    with torch.device("meta"):
        block = lk.GPTBlock(cfg)
        x = torch.empty(cfg.batch, cfg.seq, cfg.hidden)
    with pytest.raises(ValueError, match="torch.autocast does not run on 'meta'.*autocast=None"):
        block(x)


def test_a_selective_policy_traced_plainly_is_not_reused_under_an_autocast_the_trace_did_not_have():
    """`applied` keys each block's selective policy on the autocast around it: a float32 model stepped plainly,
    then under the caller's torch.autocast, inside one `applied`, trains as it does without a plan."""
    from labkit.planners import applied
    from labkit.plans import scheme_plan

    cfg = FIXED["tiny"].gpt(n_layers=2)
    runs = []
    for plan in (None, scheme_plan("selective", 2)):
        model, x = lk.GPTStack(cfg), lk.gpt_input(cfg, requires_grad=True)
        with applied(model, plan) if plan else contextlib.nullcontext():
            for amp in (False, True, False):
                model.zero_grad(set_to_none=True)
                x.grad = None
                torch.manual_seed(0)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    loss = model(x).square().mean()
                loss.backward()
                runs.append([loss.detach()] + [p.grad for p in model.parameters()] + [x.grad])
    assert all(torch.equal(a, b) for plain, planned in zip(runs[:3], runs[3:]) for a, b in zip(plain, planned))


def test_korthikanti_refuses_a_config_that_runs_in_two_dtypes():
    cfg = BF16.gpt(autocast=BF16.amp)
    with pytest.raises(ValueError, match="runs the ops in two dtypes"):
        lk.korthikanti_bytes(cfg)
    assert lk.korthikanti_bytes(cfg, act_bytes=2) == lk.korthikanti_bytes(replace(cfg, autocast=None), act_bytes=2)


def _matmul_dtypes(model: torch.nn.Module, *args: torch.Tensor) -> set[torch.dtype]:
    seen: set[torch.dtype] = set()
    hooks = [m.register_forward_hook(lambda m, i, out: seen.add(out.dtype)) for m in model.modules()
             if isinstance(m, torch.nn.Linear)]
    model(*args)
    for h in hooks:
        h.remove()
    return seen


def test_a_models_matmuls_run_in_its_autocast_over_float32_weights():
    cfg = BF16.gpt(autocast=torch.bfloat16)
    stack, x = lk.GPTStack(cfg), lk.gpt_input(cfg)
    assert _matmul_dtypes(stack, x) == {torch.bfloat16} and stack(x).dtype == torch.float32
    assert _matmul_dtypes(stack.blocks[0], x) == {torch.bfloat16}  # a block called alone, as a checkpoint does
    assert {p.dtype for p in stack.parameters()} == {torch.float32}
    gpt = lk.GPT(cfg, vocab=64)
    assert _matmul_dtypes(gpt, lk.gpt_tokens(cfg, 64)) == {torch.bfloat16}
    assert _matmul_dtypes(lk.GPTStack(FIXED["tiny"].gpt()), x) == {torch.float32}
    assert not torch.is_autocast_enabled("cpu")  # left as it was


def _grads(cfg, run):
    model, x = lk.GPTStack(cfg), lk.gpt_input(cfg, requires_grad=True)
    torch.manual_seed(0)
    h = x
    for block in model.blocks:
        h = run(block, h)
    h.square().mean().backward()
    return [p.grad for p in model.parameters() if p.grad is not None] + [x.grad]


def test_a_block_recomputed_under_autocast_gives_the_plain_gradients_bit_for_bit():
    cfg = BF16.gpt(autocast=torch.bfloat16, dropout=0.1)
    plain = _grads(cfg, lambda block, h: block(h))
    recomputed = _grads(cfg, lambda block, h: checkpoint(block, h, use_reentrant=False))
    assert all(torch.equal(a, b) for a, b in zip(plain, recomputed))
    in_float32 = _grads(replace(cfg, autocast=None), lambda block, h: block(h))
    assert not all(torch.equal(a, b) for a, b in zip(plain, in_float32))  # bfloat16 did run


def test_lab02s_comparison_under_autocast_is_bitwise_and_says_its_autocast():
    from labkit.labs.recompute import checkpoint as yours

    figures = lab02.recompute_comparison(yours, BF16).figures()
    assert figures["grads_bitwise_equal"] is True and figures["config"]["autocast"] == "bfloat16"
    assert lab02.recompute_comparison(yours, FIXED["tiny"]).figures()["config"]["autocast"] is None


def test_lab07s_planner_under_autocast_predicts_every_scheme_and_its_plan_fits():
    """Autocast caches a cast weight until its outermost region ends: a selective block whose policy is traced
    inside the model's forward must not leave the trace's casts for the forward it was traced for."""
    from test_planning import every_scheme_and_the_plan_within_a_kibibyte_above_the_meter

    c = bench_plan.capstone(BF16, repeats=1)
    plans = every_scheme_and_the_plan_within_a_kibibyte_above_the_meter(c)
    for plan in plans.values():  # training under each is the plain training, bit for bit
        assert bench_plan.train_losses(c, plan, steps=2) == bench_plan.train_losses(c, None, steps=2)
