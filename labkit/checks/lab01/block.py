"""Exercise 1.2: a GPT block's ledger, predicted module by module."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from labkit.checks.base import CheckFailure, attempt, hidden, passed, remote, trap
from labkit.checks.lab01 import hints as H
from labkit.checks.lab01.common import Mistakes, element_size, pick_hint
from labkit.instruments import saved_tensors
from labkit.models import GPTBlock, GPTConfig, gpt_input


BLOCK_MODULES = ("ln1", "attn.qkv", "attn.core", "attn.proj", "attn.drop", "ln2", "mlp.fc1", "mlp.act", "mlp.fc2",
                 "mlp.drop")
BLOCK_CASES = [(12, 2, 16, 4, torch.bfloat16), (12, 1, 24, 3, torch.float32), (16, 2, 48, 4, torch.bfloat16),
               (6, 3, 12, 3, torch.float64)]  # (s, b, h, a, dtype), dropout 0.1; a·s/h no small power of 2: mistakes differ


def measured_block_bytes(cfg: GPTConfig) -> dict[str, int]:
    """The ledger of one GPTBlock, per module of BLOCK_MODULES (submodules folded in), LayerNorm mean/rstd left out."""
    block = GPTBlock(cfg)
    with torch.random.fork_rng(devices=[]):  # dropout draws from the global RNG; leave the student's alone
        ledger = saved_tensors(block, gpt_input(cfg), model=block)
    out = dict.fromkeys(BLOCK_MODULES, 0)
    for e in ledger.entries:
        if e.module.startswith("ln") and e.shape[-1] == 1:
            continue  # LayerNorm's per-row mean and rstd, (b, s, 1): the exercise leaves them out
        owner = next(m for m in BLOCK_MODULES if e.module == m or e.module.startswith(m + "."))
        out[owner] += e.bytes
    return out


def _block_mistakes(module: str, cfg: GPTConfig) -> Mistakes:
    """Values common mistakes give for one module's bytes, with the hint for each."""
    s, b, h, a = cfg.seq, cfg.batch, cfg.hidden, cfg.heads
    e, sbh, as2b = element_size(cfg.dtype), s * b * h, a * s * s * b
    if module.endswith("drop"):
        return [(e * sbh, H.MASK_BOOL),
                (0, H.MASK_SAVED)]
    if module in ("mlp.act", "mlp.fc2"):
        return [(e * sbh, H.MLP_WIDE), (4 * sbh, H.BLOCK_ELEMENTS)]
    if module == "attn.core":
        full = 3 * e * sbh + (2 * e + 1) * as2b
        return [(full - e * sbh, H.CORE_V),
                (full - 2 * e * sbh, H.CORE_QK),
                (full - as2b, H.CORE_MASK),
                (full + (e - 1) * as2b, H.MASK_BOOL),
                (full - e * as2b, H.CORE_DROP_OUT),
                (3 * e * sbh + (2 * e + 1) * s * s * b, H.CORE_HEADS),
                (3 * e * sbh, H.CORE_SCORES)]
    return [(sbh, H.BLOCK_ELEMENTS), (0, H.SAVES_INPUT),
            (e * sbh + 2 * s * b * e, H.LN_STATS)]


def _call_dict(predict_block_bytes: Callable[..., Any], cfg: GPTConfig, call: str) -> dict[str, int]:
    """predict_block_bytes(cfg), which must return {module: int} with exactly BLOCK_MODULES as keys."""
    __tracebackhide__ = True
    with trap("1.2", f"calling {call}", H.RUN_ALONE.format(call=call)):
        got = attempt("1.2", predict_block_bytes, cfg)
    if not isinstance(got, dict):
        raise CheckFailure("1.2", f"the type {call} returns", "a dict {module name: bytes}",
                           f"{type(got).__name__} {got!r:.60}", H.BLOCK_DICT)
    if set(got) != set(BLOCK_MODULES):
        missing, extra = sorted(set(BLOCK_MODULES) - set(got)), sorted(set(got) - set(BLOCK_MODULES))
        raise CheckFailure("1.2", f"the keys of {call}", ", ".join(BLOCK_MODULES),
                           f"missing {missing or 'none'}, extra {extra or 'none'}",
                           H.BLOCK_KEYS)
    bad = [m for m, v in got.items() if isinstance(v, bool) or not isinstance(v, int)]
    if bad:
        raise CheckFailure("1.2", f"the value for {bad[0]!r} in {call}", "int", type(got[bad[0]]).__name__,
                           H.BLOCK_INTS)
    return got


@remote
def ex_1_2(predict_block_bytes: Callable[[GPTConfig], dict[str, int]]) -> None:
    """Exercise 1.2: predict_block_bytes(cfg) equals the ledger of a GPTBlock, module by module."""
    __tracebackhide__ = True
    cases = list(BLOCK_CASES)
    rng = hidden("1.2")
    if rng is not None:  # labkit grade: blocks the student never saw
        for _ in range(3):
            a = rng.randint(1, 4)
            cases.append((rng.randint(2, 10), rng.randint(1, 3), a * rng.randint(2, 6), a,
                          rng.choice([torch.float32, torch.bfloat16, torch.float64])))
    for s, b, h, a, dtype in cases:
        cfg = GPTConfig(seq=s, batch=b, hidden=h, heads=a, n_layers=1, dtype=dtype, dropout=0.1)
        call = f"predict_block_bytes(GPTConfig(seq={s}, batch={b}, hidden={h}, heads={a}, dtype={dtype}))"
        got = _call_dict(predict_block_bytes, cfg, call)
        expected = measured_block_bytes(cfg)
        for module in BLOCK_MODULES:
            if got[module] != expected[module]:
                raise CheckFailure("1.2", f"{call}[{module!r}] against the ledger of that block", expected[module],
                                   got[module], pick_hint(got[module], expected[module], _block_mistakes(module, cfg),
                                                      H.BLOCK_DEFAULT.format(module=module)))
    passed("1.2", f"predict_block_bytes matches the ledger module by module on {len(cases)} GPT blocks "
                  "(bfloat16, float32, float64)")
