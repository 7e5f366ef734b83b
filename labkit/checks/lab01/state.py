"""Exercises 1.3 and 1.4: the training state after a real Adam step, and the crossover batch."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from labkit.checks.base import CheckFailure, hidden, passed, remote
from labkit.checks.lab01 import hints as H
from labkit.checks.lab01.common import call_int, pick_hint
from labkit.instruments import saved_tensors
from labkit.models import GPTBlock, GPTConfig, MLPChain, MLPConfig, gpt_input, mlp_input


def _tied_frozen_model() -> nn.Module:
    """float64 Linear used twice (tied), then a LayerNorm and a Linear with frozen parameters."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        shared = nn.Linear(6, 6, dtype=torch.float64)
        norm = nn.LayerNorm(6, dtype=torch.float64).requires_grad_(False)
        head = nn.Linear(6, 3, dtype=torch.float64)
    head.bias.requires_grad_(False)
    return nn.Sequential(shared, nn.ReLU(), shared, norm, head)


def _state_models() -> list[tuple[str, nn.Module, torch.Tensor]]:
    """(description, fresh model, input) for the training-state checks."""
    mlp = MLPChain(MLPConfig(2, 8))
    cfg = GPTConfig(seq=4, batch=1, hidden=8, heads=2, n_layers=1, dtype=torch.bfloat16)
    block = GPTBlock(cfg)
    block.ln1.requires_grad_(False)
    block.attn.qkv.bias.requires_grad_(False)
    return [
        ("an MLPChain(2 layers, width 8, float32)", mlp, mlp_input(mlp.cfg, 3)),
        ("a bfloat16 GPTBlock with ln1 and attn.qkv.bias frozen", block, gpt_input(cfg)),
        ("a float64 model with a tied Linear and frozen parameters", _tied_frozen_model(),
         torch.ones(2, 6, dtype=torch.float64)),
    ]


def _hidden_state_models() -> list[tuple[str, nn.Module, torch.Tensor]]:
    """labkit grade: MLP chains of sizes, dtypes and frozen parameters the student never saw (none in a notebook)."""
    rng = hidden("1.3")
    out = []
    for _ in range(3 if rng is not None else 0):
        cfg = MLPConfig(rng.randint(1, 5), rng.randint(1, 40), bias=rng.random() < 0.5,
                        dtype=rng.choice([torch.float32, torch.float64, torch.bfloat16]), seed=rng.randrange(1000))
        model = MLPChain(cfg)
        params = list(model.parameters())
        frozen = rng.sample(range(len(params)), rng.randint(0, len(params) - 1))
        for i in frozen:
            params[i].requires_grad_(False)
        out.append((f"an MLPChain({cfg.n_layers} layers, width {cfg.width}, bias={cfg.bias}, {cfg.dtype}) with "
                    f"{len(frozen)} of its {len(params)} parameters frozen", model, mlp_input(cfg, rng.randint(1, 6))))
    return out


def _adam_state_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Run one real Adam step; sum the bytes of p, p.grad, exp_avg, exp_avg_sq (step counters left out)."""
    opt = torch.optim.Adam(model.parameters())
    with torch.random.fork_rng(devices=[]):
        model(x).float().square().mean().backward()
    opt.step()
    total = 0
    for p in model.parameters():  # each shared parameter once
        if p.grad is None:
            continue  # frozen: no gradient, no Adam state
        state = opt.state[p]
        for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"]):
            total += t.numel() * t.element_size()
    return total


@remote
def ex_1_3(training_state_bytes: Callable[[nn.Module], int]) -> None:
    """Exercise 1.3: training_state_bytes(model) equals params + grads + Adam buffers after a real step."""
    __tracebackhide__ = True
    cases = _state_models() + _hidden_state_models()
    for what, model, x in cases:
        got = call_int("1.3", training_state_bytes, (model,), None, f"training_state_bytes(<{what}>)")
        params = list(model.parameters())
        expected = _adam_state_bytes(model, x)
        if got != expected:
            trainable = [p for p in params if p.requires_grad]
            P = sum(p.numel() * p.element_size() for p in trainable)
            frozen = sum(p.numel() * p.element_size() for p in params if not p.requires_grad)
            tied = sum(p.numel() * p.element_size() for _, p in model.named_parameters(remove_duplicate=False)
                       if p.requires_grad)
            numel = sum(p.numel() for p in trainable)
            mistakes = [
                (2 * P, H.ADAM_TWO),
                (3 * P, H.FOUR_TENSORS),
                (4 * (P + frozen), H.FROZEN),
                (4 * P + frozen, H.FROZEN),
                (4 * P + 4 * len(trainable), H.STEP_COUNTERS),
                (4 * tied, H.TIED),
                (16 * numel, H.PARAM_DTYPE),
                (4 * numel, H.PARAM_ELEMENTS),
            ]
            raise CheckFailure("1.3", f"training-state bytes of {what} after one Adam step", expected, got,
                               pick_hint(got, expected, mistakes,
                                     H.STATE_DEFAULT))
    passed("1.3", f"training_state_bytes matches a real Adam step on {len(cases)} models (tied, frozen, 3 dtypes)")




def _measured_crossover_inputs() -> tuple[int, int]:
    """(activation bytes per sample, training-state bytes) of a small MLPChain, both measured."""
    model = MLPChain(MLPConfig(3, 16))
    batch = 8
    per_sample = saved_tensors(model, mlp_input(model.cfg, batch), model=model).total_bytes // batch
    return per_sample, _adam_state_bytes(model, mlp_input(model.cfg, batch))


@remote
def ex_1_4(crossover_batch: Callable[[int, int], int]) -> None:
    """Exercise 1.4: crossover_batch(per_sample_bytes, state_bytes) is the smallest b >= 1 with b·per >= state."""
    __tracebackhide__ = True
    # (per_sample_bytes, state_bytes): measured, exact division, rounding up, below one sample, no state, and past
    # 2**53, where a float division no longer holds every integer ("integers in, an int out")
    cases = [_measured_crossover_inputs(), (100, 1000), (300, 1000), (4096, 100), (7, 7), (1, 1), (3, 1_000_000),
             (64, 0), (3, 3 * 2**55 + 1)]
    rng = hidden("1.4")
    if rng is not None:  # labkit grade: sizes the student never saw, large ones among them
        cases += [(rng.randint(1, 10 ** rng.randint(1, 6)), rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(6)]
        cases += [(rng.randint(3, 63), rng.randint(2**60, 2**62)) for _ in range(3)]  # quotients past 2**53
    for per, state in cases:
        got = call_int("1.4", crossover_batch, (per, state), None, f"crossover_batch({per}, {state})")
        expected = max(1, -(-state // per))  # ceil without floats
        if got != expected:
            mistakes = [  # a float's error first: past 2**53 its ceiling can be state // per
                (max(1, math.ceil(state / per)), H.FLOAT_DIVISION),
                (0 if state == 0 else None, H.SMALLEST_ONE),
                (state // per, H.ROUND_UP),
                (state // per + 1, H.GREATER_EQUAL),
            ]
            raise CheckFailure("1.4", f"crossover_batch({per}, {state})", expected, got,
                               pick_hint(got, expected, mistakes,
                                     H.CROSS_DEFAULT))
    passed("1.4", f"crossover_batch is right on {len(cases)} cases, one of them a measured MLP chain")
