"""Checkers of 01_activation_memory.

Every checker holds the student's answer against a measurement, not only a
formula: labkit's saved-tensor ledger for what autograd keeps (1.1, 1.2, 1.5)
and a real Adam step for the training state (1.3, 1.4). When an answer is
wrong, the checker compares it with the values that common mistakes give and
picks the hint of the one it matches (`_hint`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from labkit.checks.base import CheckFailure, attempt, passed, trap
from labkit.memory import saved_tensors
from labkit.models import GPTBlock, GPTConfig, MLPChain, MLPConfig, gpt_input, korthikanti_terms, mlp_input

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
def _measured_scores_bytes(s: int, b: int, a: int, dtype: torch.dtype) -> int:
    """attn.core's saved bytes (its submodules included) minus the q, k, v copies: 3·A·sbh."""
    h = 4 * a
    cfg = GPTConfig(seq=s, batch=b, hidden=h, heads=a, n_layers=1, dtype=dtype)
    block = GPTBlock(cfg)
    with torch.random.fork_rng(devices=[]):  # dropout draws from the global RNG; leave the student's alone
        ledger = saved_tensors(block, gpt_input(cfg), model=block)
    core = sum(v for m, v in ledger.by_module().items() if m == "attn.core" or m.startswith("attn.core."))
    measured = core - 3 * _element_size(dtype) * s * b * h
    formula = sum(t.bytes for t in korthikanti_terms(cfg) if t.module == "attn.core" and "s²" in t.formula)
    if measured != formula:
        raise RuntimeError(f"labkit: attn.core saved {measured} bytes of scores but Korthikanti's terms "
                           f"give {formula} for {cfg}; the kit disagrees with itself, please report this.")
    return measured


def ex_1_2(attention_scores_bytes: Callable[..., int]) -> None:
    """Exercise 1.2: attention_scores_bytes(s, b, a, act_bytes, mask_bytes) matches core attention's s² bytes."""
    __tracebackhide__ = True
    # (s, b, a, dtype of a measured block or None, act_bytes, mask_bytes); None: formula terms only
    cases = [(12, 2, 3, torch.bfloat16, 2, 1), (8, 3, 2, torch.bfloat16, 2, 1), (16, 1, 4, torch.bfloat16, 2, 1),
             (8, 3, 2, torch.float32, 4, 1), (10, 2, 5, torch.float32, 4, 1), (12, 2, 3, None, 2, 2)]
    for s, b, a, dtype, act, mask in cases:
        if dtype is None:
            cfg = GPTConfig(seq=s, batch=b, hidden=4 * a, heads=a, n_layers=1)
            terms = korthikanti_terms(cfg, act_bytes=act, mask_bytes=mask)
            expected = sum(t.bytes for t in terms if t.module == "attn.core" and "s²" in t.formula)
        else:
            expected = _measured_scores_bytes(s, b, a, dtype)
        # bfloat16 cases use the defaults, which must be act_bytes=2, mask_bytes=1
        kwargs = {} if (act, mask) == (2, 1) else {"act_bytes": act, "mask_bytes": mask}
        shown = "".join(f", {k}={v}" for k, v in kwargs.items())
        call = f"attention_scores_bytes({s}, {b}, {a}{shown})"
        got = _call_int("1.2", attention_scores_bytes, (s, b, a), kwargs, call)
        if got != expected:
            A, M, as2b = act, mask, a * s * s * b
            mistakes = [
                (2 * A * as2b, "dropout saves its mask too: add mask_bytes per element of (b, a, s, s)"),
                (3 * A * as2b, "the dropout mask is bool: mask_bytes per element, not act_bytes"),
                ((2 * 2 + M) * as2b, "use the act_bytes argument, not a fixed 2"),
                ((A + M) * as2b, "the dropout output is saved too (attention-over-V's input): two act_bytes tensors"),
                ((2 * A + M) * s * s * b, "each head has its own s × s scores: multiply by a"),
                ((2 * A + M) * a * s * s, "every sequence in the batch has its own scores: multiply by b"),
                ((2 * A + M) * a * s * b, "the scores are (b, a, s, s): s² elements per head, not s"),
                ((2 * A + 1) * as2b, "use the mask_bytes argument, not a fixed 1"),
            ]
            where = "formula terms" if dtype is None else f"a measured {dtype} GPT block"
            raise CheckFailure("1.2", f"{call} against {where}", expected, got,
                               _hint(got, expected, mistakes,
                                     "three (b, a, s, s) tensors: softmax output and dropout output at act_bytes "
                                     "each, the dropout mask at mask_bytes"))
    passed("1.2", f"attention_scores_bytes matches measured GPT blocks (bfloat16, float32) on {len(cases)} cases")


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
        return t

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
    hint = ("pack must return the tensor (or something your unpack turns back into it): "
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


def ex_1_5(saved_bytes: Callable[..., int]) -> None:
    """Exercise 1.5: saved_bytes(fn, *args) totals distinct saved storages, Parameters left out, like the ledger."""
    __tracebackhide__ = True
    cases = _hook_cases()
    with torch.random.fork_rng(devices=[]):  # GPTBlock's dropout draws from the global RNG
        # backward first: a pack that drops its tensor also lets storages be freed and reused, which spoils the count
        _check_backward(saved_bytes, cases[0][1], cases[0][0])
        for what, build in cases:
            _check_saved_bytes(saved_bytes, build, what)
    passed("1.5", f"saved_bytes matches labkit's ledger on {len(cases)} functions and backward still works")


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
