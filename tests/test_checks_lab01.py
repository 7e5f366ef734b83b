"""Lab 01 checkers: pass on the notebook's solutions, fail with the right hint on planted bugs."""
from __future__ import annotations

import math

import pytest
import torch

from labkit.checks import CheckFailure, NotAttempted
from labkit.checks.lab01 import ex_1_1, ex_1_2, ex_1_3, ex_1_4, ex_1_5
# the reference answers: the very text of the solution notebook's exercise cells
from labkit.reference.activation_memory import (
    crossover_batch, predict_block_bytes, predict_chain_bytes, saved_bytes, training_state_bytes,
)

# Checker strength (docs/maintainers.md, "Checker strength"): tools/mutants.py labkit/reference/activation_memory.py
# tests/test_checks_lab01.py, --sample 10 --seed 1 and --sample 30 --seed 2: every mutant killed, none survives.


def make_hook(skip_params: bool = True, skip_views: bool = True, dedupe: bool = True,
              storage_bytes: bool = True, return_tensor: bool = True, detach: bool = True, leaves: bool = False):
    """saved_bytes with one of its parts switched off."""
    def hook_bytes(fn, *args) -> int:
        seen: set[int] = set()
        total = 0

        def pack(t: torch.Tensor):
            nonlocal total
            param = isinstance(t, torch.nn.Parameter) if not skip_views else (
                isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter))
            if leaves:  # skips every leaf that requires grad, Parameters and inputs alike
                base = t if t._base is None else t._base
                param = base.is_leaf and base.requires_grad
            key = t.untyped_storage().data_ptr()
            if not (skip_params and param) and not (dedupe and key in seen):
                seen.add(key)
                total += t.untyped_storage().nbytes() if storage_bytes else t.numel() * t.element_size()
            return (t.detach() if detach else t) if return_tensor else None

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(*args)
        return total
    return hook_bytes


SOLUTIONS = [(ex_1_1, predict_chain_bytes), (ex_1_2, predict_block_bytes), (ex_1_3, training_state_bytes),
             (ex_1_4, crossover_batch), (ex_1_5, saved_bytes)]


def fails_with(check, fn, hint: str) -> CheckFailure:
    """Run check(fn), expect a CheckFailure (not NotAttempted) whose hint contains `hint`."""
    with pytest.raises(CheckFailure) as info:
        check(fn)
    assert not isinstance(info.value, NotAttempted)
    assert hint in info.value.hint, info.value
    return info.value


# ---------------------------------------------------------------- the reference passes
@pytest.mark.parametrize("seed", [None, 7], ids=["notebook", "graded"])
@pytest.mark.parametrize("check, solution", SOLUTIONS, ids=lambda v: getattr(v, "__name__", ""))
def test_the_reference_passes(check, solution, seed, capsys):
    """In the notebook (public cases) and as `labkit grade` runs it (its hidden cases too)."""
    from labkit.checks.base import hidden_cases

    with hidden_cases(seed):
        check(solution)
    assert capsys.readouterr().out.startswith(f"[ex {check.__name__[3:].replace('_', '.')}] passed")


# ---------------------------------------------------------------- shared behaviour


@pytest.mark.parametrize("check", [c for c, _ in SOLUTIONS], ids=lambda c: c.__name__)
def test_student_exception_becomes_check_failure(check):
    def broken(*args, **kwargs):
        raise TypeError("unsupported operand")

    err = fails_with(check, broken, "in a cell of its own")
    assert "TypeError: unsupported operand" in str(err)


@pytest.mark.parametrize("check, solution", [c for c in SOLUTIONS if c[0] is not ex_1_2],
                         ids=lambda v: getattr(v, "__name__", ""))
def test_non_int_return_fails(check, solution):
    fails_with(check, lambda *a, **k: float(solution(*a, **k)), "return a Python int")


def test_failure_message_names_exercise_expected_and_got():
    err = fails_with(ex_1_1, lambda n, b, w, dtype: 2 * n * b * w * dtype.itemsize, "count it once")
    assert str(err).startswith("[ex 1.1] saved bytes of MLPChain(") and "expected " in str(err)
    assert err.expected != err.got


# ---------------------------------------------------------------- 1.1
@pytest.mark.parametrize("bug, hint", [
    (lambda n, b, w, dtype: 2 * n * b * w * dtype.itemsize, "ReLU's output is the next Linear's input"),
    (lambda n, b, w, dtype: n * b * w * dtype.itemsize, "saves the chain's input x"),
    (lambda n, b, w, dtype: (n + 1) * b * w * 4, "use the element size of dtype"),
    (lambda n, b, w, dtype: (n + 1) * b * w, "bytes, not elements"),
    (lambda n, b, w, dtype: ((n + 1) * b * w + n * (w * w + w)) * dtype.itemsize, "weights and biases"),
])
def test_ex_1_1_planted_bugs(bug, hint):
    fails_with(ex_1_1, bug, hint)


# ---------------------------------------------------------------- 1.2
def block_bug(module: str, change):
    """predict_block_bytes with one module's value replaced by change(cfg, e, sbh, as2b, right)."""
    def bug(cfg):
        out = predict_block_bytes(cfg)
        e = torch.empty((), dtype=cfg.dtype).element_size()
        s, b, h, a = cfg.seq, cfg.batch, cfg.hidden, cfg.heads
        out[module] = change(cfg, e, s * b * h, a * s * s * b, out[module])
        return out
    return bug


@pytest.mark.parametrize("bug, hint", [
    (block_bug("attn.drop", lambda c, e, sbh, as2b, r: e * sbh), "a dropout mask is bool"),
    (block_bug("mlp.drop", lambda c, e, sbh, as2b, r: 0), "dropout saves its mask"),
    (block_bug("mlp.act", lambda c, e, sbh, as2b, r: e * sbh), "4h wide in the middle"),
    (block_bug("mlp.fc2", lambda c, e, sbh, as2b, r: e * sbh), "4h wide in the middle"),
    (block_bug("attn.core", lambda c, e, sbh, as2b, r: r - e * sbh), "saves v too"),
    (block_bug("attn.core", lambda c, e, sbh, as2b, r: r - 2 * e * sbh), "saves both q and k"),
    (block_bug("attn.core", lambda c, e, sbh, as2b, r: r - as2b), "dropout saves its mask: one byte per (b, a, s, s)"),
    (block_bug("attn.core", lambda c, e, sbh, as2b, r: r + (e - 1) * as2b), "a dropout mask is bool"),
    (block_bug("attn.core", lambda c, e, sbh, as2b, r: r - e * as2b), "the dropout output"),
    (block_bug("attn.core", lambda c, e, sbh, as2b, r: r - (2 * e + 1) * (as2b - as2b // c.heads)), "multiply by a"),
    (block_bug("attn.core", lambda c, e, sbh, as2b, r: 3 * e * sbh), "(b, a, s, s) tensors too"),
    (block_bug("ln1", lambda c, e, sbh, as2b, r: r + 2 * c.seq * c.batch * e), "mean and rstd"),
    (block_bug("attn.qkv", lambda c, e, sbh, as2b, r: sbh), "bytes, not elements"),
    (block_bug("attn.proj", lambda c, e, sbh, as2b, r: 0), "saves its input"),
    (block_bug("ln2", lambda c, e, sbh, as2b, r: r + 1), "list what each op in ln2 saves"),
])
def test_ex_1_2_planted_bugs(bug, hint):
    err = fails_with(ex_1_2, bug, hint)
    assert str(err).startswith("[ex 1.2] predict_block_bytes(GPTConfig(")


def test_ex_1_2_wrong_keys_and_types_fail():
    def dropped(cfg):
        out = predict_block_bytes(cfg)
        out["attn.core"] += out.pop("attn.core.drop", 0)
        del out["mlp.drop"]
        return out

    fails_with(ex_1_2, dropped, "one key per module")
    fails_with(ex_1_2, lambda cfg: list(predict_block_bytes(cfg).values()), "return a dict")
    fails_with(ex_1_2, lambda cfg: {k: float(v) for k, v in predict_block_bytes(cfg).items()}, "return Python ints")


def test_ex_1_2_measured_block_is_the_korthikanti_terms():
    """The checker's measurement (LayerNorm statistics left out) equals the formula's terms, module by module."""
    from labkit.checks.lab01 import BLOCK_CASES, measured_block_bytes
    from labkit.models import GPTConfig, korthikanti_terms

    for s_, b_, h_, a_, dtype in BLOCK_CASES:
        cfg = GPTConfig(seq=s_, batch=b_, hidden=h_, heads=a_, n_layers=1, dtype=dtype, dropout=0.1)
        terms: dict[str, int] = {}
        for t in korthikanti_terms(cfg):
            terms[t.module] = terms.get(t.module, 0) + t.bytes
        assert measured_block_bytes(cfg) == terms


# ---------------------------------------------------------------- 1.3
def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("bug, hint", [
    (lambda m: 2 * sum(p.numel() * p.element_size() for p in trainable(m)), "Adam keeps two buffers"),
    (lambda m: 3 * sum(p.numel() * p.element_size() for p in trainable(m)), "four tensors per parameter"),
    (lambda m: 4 * sum(p.numel() * p.element_size() for p in m.parameters()), "frozen parameters"),
    (lambda m: 4 * sum(p.numel() * 4 for p in trainable(m)), "element size"),
    (lambda m: 4 * sum(p.numel() * p.element_size() + 1 for p in trainable(m)), "step counters"),
    (lambda m: 4 * sum(p.numel() * p.element_size() for _, p in m.named_parameters(remove_duplicate=False)
                       if p.requires_grad), "a shared parameter is one tensor"),
])
def test_ex_1_3_planted_bugs(bug, hint):
    fails_with(ex_1_3, bug, hint)


# ---------------------------------------------------------------- 1.4
@pytest.mark.parametrize("bug, hint", [
    (lambda per, state: state // per, "round up"),
    (lambda per, state: state // per + 1, "already counts (>=)"),
    (lambda per, state: math.ceil(state / per), "the smallest batch is 1"),
    (lambda per, state: max(1, math.ceil(state / per)), "stay in integers"),  # one off past 2**53
])
def test_ex_1_4_planted_bugs(bug, hint):
    fails_with(ex_1_4, bug, hint)


def crossover_tuned(per, state_bytes):
    """A float division, right on the public cases (as an answer written against them would be)."""
    if (per, state_bytes) == (3, 3 * 2**55 + 1):
        return -(-state_bytes // per)
    return max(1, math.ceil(state_bytes / per))


@pytest.mark.parametrize("seed", range(3))
def test_ex_1_4_a_float_division_fails_the_hidden_cases(seed):
    """Under `labkit grade` the drawn cases past 2**53 catch it, whatever the seed; the notebook's cases do not."""
    from labkit.checks.base import hidden_cases

    ex_1_4(crossover_tuned)
    with hidden_cases(seed):
        fails_with(ex_1_4, crossover_tuned, "stay in integers")


def test_ex_1_4_float_return_fails():
    fails_with(ex_1_4, lambda per, state: max(1, state / per), "return a Python int")


# ---------------------------------------------------------------- 1.5
@pytest.mark.parametrize("bug, hint", [
    (make_hook(dedupe=False), "count each storage once"),
    (make_hook(skip_params=False), "leave out nn.Parameters and their views"),
    (make_hook(skip_views=False), "whose _base is the weight"),
    (make_hook(storage_bytes=False), "keeps its whole storage alive"),
    (make_hook(return_tensor=False), "pack must return something your unpack turns back"),
    (make_hook(detach=False), "reference cycle"),
    (make_hook(leaves=True), "an input that requires grad is a leaf too"),
])
def test_ex_1_5_planted_bugs(bug, hint):
    fails_with(ex_1_5, bug, hint)


def test_ex_1_5_hooks_not_installed():
    def no_hooks(fn, *args) -> int:
        fn(*args)
        return 0

    fails_with(ex_1_5, no_hooks, "saved-tensors hooks")


def test_ex_1_5_pack_returning_other_tensor_breaks_gradients():
    def zeroing(fn, *args) -> int:
        total = saved_bytes(fn, *args)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: torch.zeros_like(t)):
            fn(*args)  # the graph the checker runs backward through: its saved tensors unpack as zeros
        return total

    fails_with(ex_1_5, zeroing, "pack must return something your unpack turns back")


def test_ex_1_5_gradients_off_in_the_last_bits_fail():
    """Bitwise, not allclose: an unpack that rounds through float16 changes gradients only in the last bits."""
    def rounding(fn, *args) -> int:
        total = saved_bytes(fn, *args)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t.half().to(t.dtype)):
            fn(*args)
        return total

    fails_with(ex_1_5, rounding, "pack must return something your unpack turns back")


def test_ex_1_5_fn_never_called():
    fails_with(ex_1_5, lambda fn, *args: 0, "call fn(*args) inside")


def test_ex_1_2_first_case_tells_every_mistake_apart():
    """The first block checked decides the hint: there, no two mistakes give the same bytes."""
    from labkit.checks.lab01.block import BLOCK_CASES, BLOCK_MODULES, _block_mistakes
    from labkit.models import GPTConfig

    s_, b_, h_, a_, dtype = BLOCK_CASES[0]
    cfg = GPTConfig(seq=s_, batch=b_, hidden=h_, heads=a_, n_layers=1, dtype=dtype)
    for module in BLOCK_MODULES:
        values = [v for v, _ in _block_mistakes(module, cfg)]
        assert len(set(values)) == len(values), module


# ---------------------------------------------------------------- every checker: its message, never its source
def test_a_failing_checker_raises_without_its_frames_or_prints_in_jupyterlab(monkeypatch, capsys):
    import traceback

    import labkit as lk

    monkeypatch.setenv("LABKIT_CHECKS", "raise")
    with pytest.raises(CheckFailure) as info:
        lk.checks.ex_0_1(lambda t: 1)
    files = {f.filename for f in traceback.extract_tb(info.value.__traceback__)}
    assert not any("checks/lab00" in f for f in files), files
    assert "Hint:" in str(info.value)

    def broken(t):
        return t.no_such_attribute

    with pytest.raises(CheckFailure, match="AttributeError.*no_such_attribute"):
        lk.checks.ex_0_1(broken)
    monkeypatch.setenv("LABKIT_CHECKS", "show")
    assert lk.checks.ex_0_1(lambda t: 1) is None
    assert "[ex 0.1]" in capsys.readouterr().err
