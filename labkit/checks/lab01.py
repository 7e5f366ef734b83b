"""Checkers of 01_activation_memory.

Every checker holds the student's answer against a measurement, not only a
formula: labkit's saved-tensor ledger for what autograd keeps (1.1, 1.2, 1.5)
and a real Adam step for the training state (1.3, 1.4). Gradients are compared
bit for bit (torch.equal), never with a tolerance. When an answer is
wrong, the checker compares it with the values that common mistakes give and
picks the hint of the one it matches (`_hint`).
"""
from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from labkit.checks.base import CheckFailure, attempt, passed, trap
from labkit.memory import saved_tensors
from labkit.models import GPTBlock, GPTConfig, MLPChain, MLPConfig, gpt_input, mlp_input

__all__ = ["ex_1_1", "ex_1_2", "ex_1_3", "ex_1_4", "ex_1_5"]

Mistakes = Sequence[tuple[Any, str]]  # (value a mistake gives, hint for it)


# ---------------------------------------------------------------- shared
def _call_int(ex: str, fn: Callable[..., Any], args: tuple, kwargs: dict | None, call: str) -> int:
    """fn(*args, **kwargs), which must return an int; any exception becomes a CheckFailure."""
    __tracebackhide__ = True
    with trap(ex, f"calling {call}", f"run {call} in a cell of its own to see where it fails"):
        got = attempt(ex, fn, *args, **(kwargs or {}))
    if isinstance(got, bool) or not isinstance(got, int):
        raise CheckFailure(ex, f"the type {call} returns", "int", f"{type(got).__name__} {got!r:.60}",
                           "return a Python int: use // rather than /, or int(...) / .item() on the result")
    return got


def _hint(got: int, expected: int, mistakes: Mistakes, default: str) -> str:
    """The hint of the first mistake whose value is `got`, else `default`."""
    for value, hint in mistakes:
        if got == value != expected:
            return hint
    return default


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ---------------------------------------------------------------- 1.1
def ex_1_1(predict_chain_bytes: Callable[[int, int, int, torch.dtype], int]) -> None:
    """Exercise 1.1: predict_chain_bytes(n_layers, batch, width, dtype) equals the bytes the ledger measures."""
    __tracebackhide__ = True
    cases = [(1, 2, 8, torch.float32), (3, 5, 16, torch.float32), (4, 3, 12, torch.bfloat16),
             (2, 4, 6, torch.float64)]
    for n, b, w, dtype in cases:
        model = MLPChain(MLPConfig(n, w, dtype=dtype))
        expected = saved_tensors(model, mlp_input(model.cfg, b), model=model).total_bytes
        call = f"predict_chain_bytes({n}, {b}, {w}, {dtype})"
        got = _call_int("1.1", predict_chain_bytes, (n, b, w, dtype), None, call)
        if got != expected:
            e, act = _element_size(dtype), b * w
            mistakes = [
                (2 * n * act * e, "ReLU's output is the next Linear's input: one storage, count it once"),
                ((2 * n + 1) * act * e, "ReLU's output is the next Linear's input: one storage, count it once"),
                (n * act * e, "the first Linear saves the chain's input x too: count it"),
                ((n + 1) * act * 4, "use the element size of dtype: torch.empty((), dtype=dtype).element_size()"),
                ((n + 1) * act, "bytes, not elements: multiply by the element size of dtype"),
                ((n + 1) * act * e + n * (w * w + w) * e,
                 "weights and biases are parameters, not saved activations: leave them out"),
            ]
            raise CheckFailure("1.1", f"saved bytes of MLPChain({n} layers, width {w}, {dtype}) on batch {b}",
                               expected, got, _hint(got, expected, mistakes,
                                                    "each Linear saves its input and each ReLU its output; "
                                                    "they share storages, so count each once"))
    passed("1.1", f"predict_chain_bytes matches the ledger on {len(cases)} MLP chains in 3 dtypes")


# ---------------------------------------------------------------- 1.2
BLOCK_MODULES = ("ln1", "attn.qkv", "attn.core", "attn.proj", "attn.drop", "ln2", "mlp.fc1", "mlp.act", "mlp.fc2",
                 "mlp.drop")
BLOCK_CASES = [(12, 2, 16, 4, torch.bfloat16), (12, 1, 24, 3, torch.float32), (16, 2, 48, 4, torch.bfloat16),
               (6, 3, 12, 3, torch.float64)]  # (s, b, h, a, dtype), dropout 0.1; a·s/h is no small power of 2, so mistakes differ


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
    e, sbh, as2b = _element_size(cfg.dtype), s * b * h, a * s * s * b
    elements = "bytes, not elements: multiply by the element size of cfg.dtype"
    if module.endswith("drop"):
        return [(e * sbh, "a dropout mask is bool: one byte per element, whatever the activation dtype"),
                (0, "dropout saves its mask for backward (which elements it kept)")]
    if module in ("mlp.act", "mlp.fc2"):
        return [(e * sbh, "the MLP is 4h wide in the middle: GeLU saves its input, fc1's output, and fc2 saves "
                          "its input, GeLU's output, each 4·s·b·h elements"), (4 * sbh, elements)]
    if module == "attn.core":
        full = 3 * e * sbh + (2 * e + 1) * as2b
        return [(full - e * sbh, "the ·v matmul saves v too (to get the scores' gradient)"),
                (full - 2 * e * sbh, "q·kᵀ saves both q and k (each is needed for the other's gradient)"),
                (full - as2b, "dropout saves its mask: one byte per (b, a, s, s) element"),
                (full + (e - 1) * as2b, "a dropout mask is bool: one byte per element, whatever the activation dtype"),
                (full - e * as2b, "the ·v matmul saves its other operand too, the dropout output: a second "
                                  "(b, a, s, s) tensor in the activation dtype"),
                (3 * e * sbh + (2 * e + 1) * s * s * b, "each head has its own s × s scores: multiply by a"),
                (3 * e * sbh, "core attention saves (b, a, s, s) tensors too: softmax output, dropout mask, "
                              "dropout output")]
    return [(sbh, elements), (0, "every Linear and LayerNorm saves its input"),
            (e * sbh + 2 * s * b * e, "leave out LayerNorm's per-row mean and rstd, as the spec says")]


def _call_dict(predict_block_bytes: Callable[..., Any], cfg: GPTConfig, call: str) -> dict[str, int]:
    """predict_block_bytes(cfg), which must return {module: int} with exactly BLOCK_MODULES as keys."""
    __tracebackhide__ = True
    with trap("1.2", f"calling {call}", f"run {call} in a cell of its own to see where it fails"):
        got = attempt("1.2", predict_block_bytes, cfg)
    if not isinstance(got, dict):
        raise CheckFailure("1.2", f"the type {call} returns", "a dict {module name: bytes}",
                           f"{type(got).__name__} {got!r:.60}", "return a dict keyed by module name, as the spec shows")
    if set(got) != set(BLOCK_MODULES):
        missing, extra = sorted(set(BLOCK_MODULES) - set(got)), sorted(set(got) - set(BLOCK_MODULES))
        raise CheckFailure("1.2", f"the keys of {call}", ", ".join(BLOCK_MODULES),
                           f"missing {missing or 'none'}, extra {extra or 'none'}",
                           "one key per module the spec lists; attn.core includes its dropout (attn.core.drop)")
    bad = [m for m, v in got.items() if isinstance(v, bool) or not isinstance(v, int)]
    if bad:
        raise CheckFailure("1.2", f"the value for {bad[0]!r} in {call}", "int", type(got[bad[0]]).__name__,
                           "return Python ints: use // rather than /, or int(...) on the result")
    return got


def ex_1_2(predict_block_bytes: Callable[[GPTConfig], dict[str, int]]) -> None:
    """Exercise 1.2: predict_block_bytes(cfg) equals the ledger of a GPTBlock, module by module."""
    __tracebackhide__ = True
    for s, b, h, a, dtype in BLOCK_CASES:
        cfg = GPTConfig(seq=s, batch=b, hidden=h, heads=a, n_layers=1, dtype=dtype, dropout=0.1)
        call = f"predict_block_bytes(GPTConfig(seq={s}, batch={b}, hidden={h}, heads={a}, dtype={dtype}))"
        got = _call_dict(predict_block_bytes, cfg, call)
        expected = measured_block_bytes(cfg)
        for module in BLOCK_MODULES:
            if got[module] != expected[module]:
                raise CheckFailure("1.2", f"{call}[{module!r}] against the ledger of that block", expected[module],
                                   got[module], _hint(got[module], expected[module], _block_mistakes(module, cfg),
                                                      f"list what each op in {module} saves (the rules above) "
                                                      "and count each storage once, in the module that saves it "
                                                      "first"))
    passed("1.2", f"predict_block_bytes matches the ledger module by module on {len(BLOCK_CASES)} GPT blocks "
                  "(bfloat16, float32, float64)")


# ---------------------------------------------------------------- 1.3
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


def ex_1_3(training_state_bytes: Callable[[nn.Module], int]) -> None:
    """Exercise 1.3: training_state_bytes(model) equals params + grads + Adam buffers after a real step."""
    __tracebackhide__ = True
    cases = _state_models()
    for what, model, x in cases:
        got = _call_int("1.3", training_state_bytes, (model,), None, f"training_state_bytes(<{what}>)")
        params = list(model.parameters())
        expected = _adam_state_bytes(model, x)
        if got != expected:
            trainable = [p for p in params if p.requires_grad]
            P = sum(p.numel() * p.element_size() for p in trainable)
            frozen = sum(p.numel() * p.element_size() for p in params if not p.requires_grad)
            tied = sum(p.numel() * p.element_size() for _, p in model.named_parameters(remove_duplicate=False)
                       if p.requires_grad)
            numel = sum(p.numel() for p in trainable)
            frozen_hint = "frozen parameters (requires_grad=False) get no gradient and no Adam state: leave them out"
            mistakes = [
                (2 * P, "Adam keeps two buffers per parameter (exp_avg, exp_avg_sq), each the parameter's size"),
                (3 * P, "four tensors per parameter: the parameter, its gradient, exp_avg and exp_avg_sq"),
                (4 * (P + frozen), frozen_hint),
                (4 * P + frozen, frozen_hint),
                (4 * P + 4 * len(trainable), "leave out Adam's scalar step counters, as the exercise says"),
                (4 * tied, "a shared parameter is one tensor: count it once (model.parameters() lists it once)"),
                (16 * numel, "use each parameter's element size (p.element_size()), not 4 bytes"),
                (4 * numel, "bytes, not elements: multiply by p.element_size()"),
            ]
            raise CheckFailure("1.3", f"training-state bytes of {what} after one Adam step", expected, got,
                               _hint(got, expected, mistakes,
                                     "for each trainable parameter: itself, its gradient, exp_avg and exp_avg_sq, "
                                     "all of its size and dtype"))
    passed("1.3", f"training_state_bytes matches a real Adam step on {len(cases)} models (tied, frozen, 3 dtypes)")


# ---------------------------------------------------------------- 1.4
def _measured_crossover_inputs() -> tuple[int, int]:
    """(activation bytes per sample, training-state bytes) of a small MLPChain, both measured."""
    model = MLPChain(MLPConfig(3, 16))
    batch = 8
    per_sample = saved_tensors(model, mlp_input(model.cfg, batch), model=model).total_bytes // batch
    return per_sample, _adam_state_bytes(model, mlp_input(model.cfg, batch))


def ex_1_4(crossover_batch: Callable[[int, int], int]) -> None:
    """Exercise 1.4: crossover_batch(per_sample_bytes, state_bytes) is the smallest b >= 1 with b·per >= state."""
    __tracebackhide__ = True
    # (per_sample_bytes, state_bytes): measured, exact division, rounding up, below one sample, no state
    cases = [_measured_crossover_inputs(), (100, 1000), (300, 1000), (4096, 100), (7, 7), (1, 1), (3, 1_000_000),
             (64, 0)]
    for per, state in cases:
        got = _call_int("1.4", crossover_batch, (per, state), None, f"crossover_batch({per}, {state})")
        expected = max(1, -(-state // per))  # ceil without floats
        if got != expected:
            mistakes = [
                (0 if state == 0 else None, "the smallest batch is 1"),
                (state // per, "round up: a batch whose activations fall short of the state has not crossed it"),
                (state // per + 1, "b · per_sample_bytes == state_bytes already counts (>=): the smallest such b"),
            ]
            raise CheckFailure("1.4", f"crossover_batch({per}, {state})", expected, got,
                               _hint(got, expected, mistakes,
                                     "the smallest b >= 1 with b * per_sample_bytes >= state_bytes: "
                                     "ceil(state_bytes / per_sample_bytes)"))
    passed("1.4", f"crossover_batch is right on {len(cases)} cases, one of them a measured MLP chain")


# ---------------------------------------------------------------- 1.5
def _pack_variants(fn: Callable[..., Any], args: tuple) -> dict[str, int]:
    """Totals that some mistaken hooks would return for fn(*args), keyed by mistake."""
    packs: list[tuple[bool, bool, int, int, int, int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        packs.append((isinstance(t, nn.Parameter), isinstance(t._base, nn.Parameter),
                      st.data_ptr(), st.nbytes(), t.data_ptr(), t.numel() * t.element_size()))
        return t.detach()

    with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)

    def total(skip: Callable[[bool, bool], bool], key: int | None, size: int) -> int:
        """Bytes of packs not skipped, deduplicated on field `key` (None: not at all), sized by field `size`."""
        seen: set[int] = set()
        out = 0
        for rec in packs:
            if skip(rec[0], rec[1]) or (key is not None and rec[key] in seen):
                continue
            if key is not None:
                seen.add(rec[key])
            out += rec[size]
        return out

    param_or_view = lambda param, view: param or view  # noqa: E731
    return {
        "no_dedupe": total(param_or_view, None, 3),
        "no_dedupe_elements": total(param_or_view, None, 5),
        "params": total(lambda param, view: False, 2, 3),
        "param_views": total(lambda param, view: param, 2, 3),
        "elements": total(param_or_view, 4, 5),
        "elements_per_storage": total(param_or_view, 2, 5),
    }


def _hook_cases() -> list[tuple[str, Callable[[], tuple[nn.Module | None, Callable[..., Any], tuple]]]]:
    """(description, builder) pairs; a builder returns fresh (model or None, fn, args) each call."""
    def mlp():
        model = MLPChain(MLPConfig(3, 8))
        return model, model, (mlp_input(model.cfg, 4),)

    def shifted():
        x = torch.arange(15.0).reshape(5, 3).requires_grad_()
        return None, lambda x: (x[1:] * x[:-1]).sum(), (x,)

    def param_arg():
        x = torch.linspace(-1, 1, 15).reshape(5, 3).requires_grad_()
        w = nn.Parameter(torch.linspace(-1, 1, 12).reshape(3, 4))
        return None, lambda x, w: torch.tanh(x @ w), (x, w)

    def block():
        cfg = GPTConfig(seq=8, batch=2, hidden=16, heads=2, n_layers=1, dtype=torch.bfloat16)
        model = GPTBlock(cfg)
        return model, model, (gpt_input(cfg),)

    return [("an MLPChain (3 layers, width 8)", mlp), ("x[1:] * x[:-1] (two views of x)", shifted),
            ("tanh(x @ w) with w an nn.Parameter", param_arg), ("a bfloat16 GPTBlock", block)]


def _check_backward(saved_bytes: Callable[..., int], build: Callable[[], tuple], what: str) -> None:
    """Backward through a graph recorded under the student's hooks must give the same gradients."""
    __tracebackhide__ = True
    _, fn, args = build()
    outputs: list[Any] = []
    _call_int("1.5", saved_bytes, (lambda *a: outputs.append(fn(*a)) or outputs[-1], *args), None,
              f"saved_bytes(<{what}>, ...)")
    hint = ("pack must return t.detach() (or something your unpack turns back into the tensor): "
            "backward unpacks what pack returned")
    if not outputs:
        raise CheckFailure("1.5", f"saved_bytes on {what}", "fn(*args) called once", "fn never called",
                           "call fn(*args) inside `with torch.autograd.graph.saved_tensors_hooks(pack, unpack):`")
    try:
        outputs[-1].float().sum().backward()
    except Exception as e:
        raise CheckFailure("1.5", f"backward through {what} run under your hooks", "gradients",
                           f"{type(e).__name__}: {e}", hint) from None
    _, ref_fn, ref_args = build()
    ref_fn(*ref_args).float().sum().backward()
    leaves = lambda f, a: [*(f.parameters() if isinstance(f, nn.Module) else ()), *a]  # noqa: E731
    for got, want in zip(leaves(fn, args), leaves(ref_fn, ref_args)):
        if want.grad is not None and (got.grad is None or not torch.equal(got.grad, want.grad)):
            raise CheckFailure("1.5", f"gradients of {what} run under your hooks", "the same as without hooks",
                               "different gradients", hint)


def _check_no_cycle(saved_bytes: Callable[..., int]) -> None:
    """Once saved_bytes has returned, nothing may keep fn's output alive: no reference cycle through the graph."""
    __tracebackhide__ = True
    model = MLPChain(MLPConfig(3, 8))
    x = mlp_input(model.cfg, 4)
    refs: list[weakref.ref] = []

    def fn(t: torch.Tensor) -> torch.Tensor:
        out = model(t)  # ends in a ReLU, which saves its own output
        refs.append(weakref.ref(out.untyped_storage()))
        return out

    _call_int("1.5", saved_bytes, (fn, x), None, "saved_bytes(<an MLPChain>, x)")
    gc.collect()
    if refs and refs[0]() is not None:
        raise CheckFailure("1.5", "fn's output once saved_bytes(fn, x) has returned and nothing refers to it",
                           "freed", "still alive",
                           "return t.detach() from pack, not t: a node that keeps the very tensor whose grad_fn "
                           "it is makes a reference cycle through C++ that Python's collector cannot free, so "
                           "every graph you measure would stay in memory")


def ex_1_5(saved_bytes: Callable[..., int]) -> None:
    """Exercise 1.5: saved_bytes(fn, *args) totals distinct saved storages, Parameters left out, like the ledger."""
    __tracebackhide__ = True
    cases = _hook_cases()
    with torch.random.fork_rng(devices=[]):  # GPTBlock's dropout draws from the global RNG
        # backward first: a pack that drops its tensor also lets storages be freed and reused, which spoils the count
        _check_backward(saved_bytes, cases[0][1], cases[0][0])
        for what, build in cases:
            _check_saved_bytes(saved_bytes, build, what)
        _check_no_cycle(saved_bytes)
    passed("1.5", f"saved_bytes matches labkit's ledger on {len(cases)} functions, backward still works, and "
                  "nothing outlives the measurement")


def _check_saved_bytes(saved_bytes: Callable[..., int], build: Callable[[], tuple], what: str) -> None:
    """saved_bytes on one case against the ledger; on a mismatch, the hint of the mistake it matches."""
    __tracebackhide__ = True
    _, fn, args = build()
    expected = saved_tensors(fn, *args).total_bytes
    _, fn, args = build()
    got = _call_int("1.5", saved_bytes, (fn, *args), None, f"saved_bytes(<{what}>, ...)")
    if got == expected:
        return
    _, fn, args = build()
    v = _pack_variants(fn, args)
    dedupe = "count each storage once: remember t.untyped_storage().data_ptr() of what you counted"
    params = "leave out nn.Parameters and their views: a Linear saves weight.t(), whose _base is the weight"
    storage = "a saved view keeps its whole storage alive: count t.untyped_storage().nbytes()"
    mistakes = [
        (0, "register the hooks with `with torch.autograd.graph.saved_tensors_hooks(pack, unpack):` "
            "and call fn(*args) inside that block"),
        (v["no_dedupe"], dedupe),
        (v["no_dedupe_elements"], dedupe),
        (v["param_views"], params),
        (v["params"], params),
        (v["elements"], storage),
        (v["elements_per_storage"], storage),
    ]
    raise CheckFailure("1.5", f"saved bytes of {what}, against labkit's ledger", expected, got,
                       _hint(got, expected, mistakes, "in pack: skip Parameters and their views, add "
                                                      "untyped_storage().nbytes() once per storage, and return t"))
