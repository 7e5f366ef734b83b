"""Exercises 2.2 and 2.3: the recompute replays the forward's RNG and re-enters its autocast."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from labkit.checks.base import CheckFailure, need_callable, passed
from labkit.checks.lab02 import hints as H
from labkit.checks.lab02.common import lab_trap, need_function, prerequisites_first, same_step
from labkit.checks.lab02.recompute import ex_2_1
from labkit.checks.lab02.rig import P_DROP, Net, dropout_label, loss_of, plain_step


# ---------------------------------------------------------------- Exercise 2.2
def _check_replay(stash_rng: Callable[..., Any], restored_rng: Callable[..., Any]) -> None:
    """s = stash_rng(); a = rand; with restored_rng(s): b = rand  gives a == b, and rand continues after a."""
    __tracebackhide__ = True
    torch.manual_seed(0)
    torch.rand(3)
    after_a = torch.rand(3)
    what = "s = stash_rng(x); a = torch.rand(3); with restored_rng(s): b = torch.rand(3)"
    torch.manual_seed(0)
    with lab_trap("2.2", what, H.RNG_SPEC, (("context manager", H.RNG_CONTEXT),)):
        state = stash_rng(torch.zeros(2))
        a = torch.rand(3)
        with restored_rng(state):
            b = torch.rand(3)
            torch.rand(7)  # more draws than a's, so a generator left where the block ended shows in c
        c = torch.rand(3)
        with restored_rng(state):
            b2 = torch.rand(3)
    for name, got in (("b", b), ("b from a second restored_rng(s)", b2)):
        if not torch.equal(got, a):
            raise CheckFailure("2.2", f"{what}: {name}", a.tolist(), got.tolist(), H.RNG_SNAPSHOT)
    if not torch.equal(c, after_a):
        raise CheckFailure("2.2", f"{what}: torch.rand(3) after the with-block", after_a.tolist(), c.tolist(),
                           H.RNG_CONTINUE)


def _check_cuda_replay(stash_rng: Callable[..., Any], restored_rng: Callable[..., Any]) -> None:
    """The same replay for a CUDA input and its own device's generator: the first device's, and the last's where
    there are several (only where CUDA is present)."""
    __tracebackhide__ = True
    for device in sorted({0, torch.cuda.device_count() - 1}):
        what = (f"s = stash_rng(x on cuda:{device}); a = torch.rand(3, device='cuda:{device}'); "
                "with restored_rng(s): b = torch.rand(3, ...)")
        with lab_trap("2.2", what, H.RNG_SPEC):
            state = stash_rng(torch.zeros(2, device=f"cuda:{device}"))
            a = torch.rand(3, device=f"cuda:{device}")
            with restored_rng(state):
                b = torch.rand(3, device=f"cuda:{device}")
        if not torch.equal(a, b):
            raise CheckFailure("2.2", f"{what}: b", a.tolist(), b.tolist(), H.RNG_CUDA)


def _rng_step(RecomputeRNG: type, p: float) -> None:
    """One step through RecomputeRNG.apply with dropout p inside fn and after it, against the plain one."""
    __tracebackhide__ = True
    what = f"RecomputeRNG.apply(fn, h, s), {dropout_label(p)}"
    want, want_next = plain_step(torch.float32, p)
    net = Net(torch.float32, p)
    with lab_trap("2.2", what, H.RECOMPUTE_RNG_SPEC):
        torch.manual_seed(1)
        loss_of(RecomputeRNG.apply(net.fn, net.pre(net.x), net.s), p).backward()
        got_next = torch.rand(4)
    same_step("2.2", what, (want, want_next), (net.grads(), got_next),
              H.RNG_RESTORED if p else H.RNG_ON_RECOMPUTE, H.RNG_AFTER_STEP)


def ex_2_2(stash_rng: Callable[..., Any], restored_rng: Callable[..., Any], RecomputeRNG: type) -> None:
    """Exercise 2.2: the RNG is replayed for the recompute, and continues afterwards as if it had not been."""
    __tracebackhide__ = True
    need_callable("2.2", "stash_rng", stash_rng)
    need_callable("2.2", "restored_rng", restored_rng)
    need_function("2.2", "RecomputeRNG", RecomputeRNG)
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        _check_replay(stash_rng, restored_rng)
        if cuda:
            _check_cuda_replay(stash_rng, restored_rng)
        with prerequisites_first("2.2", "RecomputeRNG", RecomputeRNG, (("2.1", ex_2_1, ("Recompute",)),)):
            _rng_step(RecomputeRNG, 0.0)
        _rng_step(RecomputeRNG, P_DROP)
    passed("2.2", "restored_rng replays stash_rng's state; RecomputeRNG gives bitwise gradients with dropout "
                  "and the generator continues as without recomputation")


# ---------------------------------------------------------------- Exercise 2.3
def _matmul_dtype(restored_autocast: Callable[..., Any], state: Any, what: str) -> torch.dtype:
    """The dtype of a float32 matmul run under restored_autocast(state)."""
    __tracebackhide__ = True
    with lab_trap("2.3", what, H.AMP_SPEC, (("context manager", H.AMP_CONTEXT),)):
        with restored_autocast(state):
            return torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype


def _check_autocast_on(stash_autocast: Callable[..., Any], restored_autocast: Callable[..., Any]) -> None:
    """Stashed inside autocast(dtype), restored outside it: a matmul runs in dtype; afterwards in float32."""
    __tracebackhide__ = True
    for dtype in (torch.bfloat16, torch.float16):
        what = (f"s = stash_autocast(x) under torch.autocast('cpu', dtype={dtype}); then, outside it, "
                "with restored_autocast(s): torch.mm(a, b)")
        with lab_trap("2.3", what, H.AMP_SPEC), torch.autocast("cpu", dtype=dtype):
            state = stash_autocast(torch.zeros(2))
        got = _matmul_dtype(restored_autocast, state, what)
        if got != dtype:
            hint = H.AMP_DTYPE if got in (torch.bfloat16, torch.float16) else H.AMP_NOT_SET
            raise CheckFailure("2.3", f"{what}: its dtype", dtype, got, hint)
        after = torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype
        if after != torch.float32 or torch.is_autocast_enabled("cpu"):
            raise CheckFailure("2.3", f"{what}: a matmul after the with-block", torch.float32, after, H.AMP_LEAVE)


def _check_autocast_cache(stash_autocast: Callable[..., Any], restored_autocast: Callable[..., Any]) -> None:
    """Stashed with autocast's weight-cast cache off, restored: the cache is off inside, as before after."""
    __tracebackhide__ = True
    what = ("s = stash_autocast(x) under torch.autocast('cpu', dtype=torch.bfloat16, cache_enabled=False); then, "
            "outside it, with restored_autocast(s): torch.is_autocast_cache_enabled()")
    with lab_trap("2.3", what, H.AMP_SPEC), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        state = stash_autocast(torch.zeros(2))
    before = torch.is_autocast_cache_enabled()
    with lab_trap("2.3", what, H.AMP_SPEC, (("context manager", H.AMP_CONTEXT),)), restored_autocast(state):
        inside = torch.is_autocast_cache_enabled()
    if inside:
        raise CheckFailure("2.3", what, False, inside, H.AMP_CACHE)
    if torch.is_autocast_cache_enabled() != before:
        raise CheckFailure("2.3", f"{what}, after the with-block", before, torch.is_autocast_cache_enabled(),
                           H.AMP_LEAVE)


def _check_autocast_off(stash_autocast: Callable[..., Any], restored_autocast: Callable[..., Any]) -> None:
    """Stashed outside autocast, restored inside an autocast region: the matmul runs in float32."""
    __tracebackhide__ = True
    what = ("s = stash_autocast(x) without autocast; then, inside torch.autocast('cpu', dtype=torch.bfloat16), "
            "with restored_autocast(s): torch.mm(a, b)")
    with lab_trap("2.3", what, H.AMP_SPEC):
        state = stash_autocast(torch.zeros(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _matmul_dtype(restored_autocast, state, what)
        after = torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype
    if got != torch.float32:
        raise CheckFailure("2.3", f"{what}: its dtype", torch.float32, got, H.AMP_ENABLED)
    if after != torch.bfloat16:
        raise CheckFailure("2.3", f"{what}: a matmul after the with-block, still inside autocast", torch.bfloat16,
                           after, H.AMP_LEAVE)


@contextlib.contextmanager
def _autocast_kept() -> Iterator[None]:
    """Put the CPU autocast settings back afterwards, whatever a wrong answer left behind."""
    enabled, dtype, cache = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                             torch.is_autocast_cache_enabled())
    try:
        yield
    finally:
        torch.set_autocast_enabled("cpu", enabled)
        torch.set_autocast_dtype("cpu", dtype)
        torch.set_autocast_cache_enabled(cache)


def _check_autocast_cuda(stash_autocast: Callable[..., Any], restored_autocast: Callable[..., Any]) -> None:
    """Stashed for a CUDA input under CUDA autocast, restored outside it: a CUDA matmul runs in float16."""
    __tracebackhide__ = True
    what = ("s = stash_autocast(x_cuda) under torch.autocast('cuda', dtype=torch.float16); then, outside it, "
            "with restored_autocast(s): a CUDA matmul")
    with lab_trap("2.3", what, H.AMP_SPEC), torch.autocast("cuda", dtype=torch.float16):
        state = stash_autocast(torch.zeros(2, device="cuda"))
    with lab_trap("2.3", what, H.AMP_SPEC, (("context manager", H.AMP_CONTEXT),)), restored_autocast(state):
        got = torch.mm(torch.ones(2, 2, device="cuda"), torch.ones(2, 2, device="cuda")).dtype
    if got != torch.float16:
        raise CheckFailure("2.3", f"{what}: its dtype", torch.float16, got, H.AMP_CUDA)


def ex_2_3(stash_autocast: Callable[..., Any], restored_autocast: Callable[..., Any]) -> None:
    """Exercise 2.3: restored_autocast(stash_autocast(...)) runs its block under the stashed autocast settings."""
    __tracebackhide__ = True
    need_callable("2.3", "stash_autocast", stash_autocast)
    need_callable("2.3", "restored_autocast", restored_autocast)
    with _autocast_kept():
        _check_autocast_on(stash_autocast, restored_autocast)
        _check_autocast_off(stash_autocast, restored_autocast)
        _check_autocast_cache(stash_autocast, restored_autocast)
        if torch.cuda.is_available():
            _check_autocast_cuda(stash_autocast, restored_autocast)
    passed("2.3", "restored_autocast re-enters the stashed autocast (bfloat16, float16, or off; its cache on or off) "
                  "and restores the settings after its block")
