"""Exercise 1.1: the bytes an MLP chain keeps, against the ledger."""
from __future__ import annotations

from collections.abc import Callable

import torch

from labkit.checks.base import CheckFailure, hidden, passed, remote
from labkit.checks.lab01 import hints as H
from labkit.checks.lab01.common import call_int, element_size, pick_hint
from labkit.instruments import saved_tensors
from labkit.models import MLPChain, MLPConfig, mlp_input


@remote
def ex_1_1(predict_chain_bytes: Callable[[int, int, int, torch.dtype], int]) -> None:
    """Exercise 1.1: predict_chain_bytes(n_layers, batch, width, dtype) equals the bytes the ledger measures."""
    __tracebackhide__ = True
    cases = [(1, 2, 8, torch.float32), (3, 5, 16, torch.float32), (4, 3, 12, torch.bfloat16),
             (2, 4, 6, torch.float64)]
    rng = hidden("1.1")
    if rng is not None:  # labkit grade: chains the student never saw
        cases += [(rng.randint(1, 6), rng.randint(1, 7), rng.randint(2, 24),
                   rng.choice([torch.float32, torch.bfloat16, torch.float64, torch.float16])) for _ in range(4)]
    for n, b, w, dtype in cases:
        model = MLPChain(MLPConfig(n, w, dtype=dtype))
        expected = saved_tensors(model, mlp_input(model.cfg, b), model=model).total_bytes
        call = f"predict_chain_bytes({n}, {b}, {w}, {dtype})"
        got = call_int("1.1", predict_chain_bytes, (n, b, w, dtype), None, call)
        if got != expected:
            e, act = element_size(dtype), b * w
            mistakes = [
                (2 * n * act * e, H.CHAIN_SHARED),
                ((2 * n + 1) * act * e, H.CHAIN_SHARED),
                (n * act * e, H.CHAIN_INPUT),
                ((n + 1) * act * 4, H.CHAIN_DTYPE),
                ((n + 1) * act, H.CHAIN_ELEMENTS),
                ((n + 1) * act * e + n * (w * w + w) * e,
                 H.CHAIN_PARAMS),
            ]
            raise CheckFailure("1.1", f"saved bytes of MLPChain({n} layers, width {w}, {dtype}) on batch {b}",
                               expected, got, pick_hint(got, expected, mistakes,
                                                    H.CHAIN_DEFAULT))
    passed("1.1", f"predict_chain_bytes matches the ledger on {len(cases)} MLP chains in "
                  f"{len({c[3] for c in cases})} dtypes")
