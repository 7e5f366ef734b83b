"""Tests for the checkers of 06_pitfalls: they pass the reference, in the notebook and under grading's hidden cases,
and catch each planted bug with its own hint, on the public cases and again on the hidden ones alone.

Checker strength (tools/mutants.py on labkit/reference/pitfalls.py against this file; docs/maintainers.md,
"Checker strength"): every one of the module's 39 mutants was run; all are killed but one, read and named here:
- deleting `bn.register_forward_hook(thaw)` in batchnorm_once: equivalent under the spec. The queued callback thaws
  every rerun when its backward ends, and a BatchNorm's next pre-hook thaws it first, so nothing between a rerun and
  the end of its backward reads the frozen momentum but another rerun of that module, which thaws it itself; the
  spec asks for the statistics put back "by the time that backward pass ends at the latest". No mutant of this
  module is GPU-only: it calls nothing of CUDA's.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import labkit.reference.pitfalls as R
from labkit import checks
from labkit.checks import CheckFailure, NotAttempted, base
from labkit.checks.lab06 import batchnorm, decide
from labkit.checks.lab06 import difference as diff_check
from labkit.checks.lab06 import hints as H
from labkit.instruments.harness import Difference

INF = float("inf")
SEEDS = [0, 1, 2]  # grading's hidden cases are drawn from the run's seed: a few runs of grading


def _fails(check, *args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


def _fails_hidden(monkeypatch, module, check, bug, seed: int) -> CheckFailure:
    """The failure of `bug` on the hidden cases alone (the public ones taken out), as grading draws them."""
    monkeypatch.setattr(module, "_cases", lambda: [])
    with base.hidden_cases(seed):
        return _fails(check, bug)


# ---------------------------------------------------------------- the reference passes, public and hidden
@pytest.mark.parametrize("seed", [None, *range(8)], ids=lambda s: "public" if s is None else f"hidden-{s}")
def test_the_reference_passes_every_check(seed, capsys):
    with base.hidden_cases(seed):
        checks.ex_6_1(R.difference)
        checks.ex_6_2(R.batchnorm_once)
        checks.ex_6_3(R.recommend)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["[ex 6.1] passed", "[ex 6.2] passed", "[ex 6.3] passed"]


def test_hidden_cases_are_drawn_afresh_per_seed():
    def drawn(seed):
        with base.hidden_cases(seed):
            return [what for what, *_ in diff_check._hidden_cases()], [str(s) for _, s, *_ in decide._hidden_cases()]
    assert drawn(1) != drawn(2) and drawn(1) == drawn(1)
    assert diff_check._hidden_cases() == [] and decide._hidden_cases() == [] and batchnorm._hidden() == []


# ---------------------------------------------------------------- 6.1
def _difference(equal=None, meta="all", rel="max", none_ok=True, wide="float64", masked=True, nan=True,
                zero=True, empty="or"):
    """difference with one planted bug, chosen by the argument that differs from its default."""
    def bug(name, a, b):
        if a is None or b is None:
            if none_ok:
                return Difference(name, True) if a is b else Difference(name, False, INF, INF, "missing")
            return Difference(name, False, INF, INF, "missing")
        checked = {"all": a.shape != b.shape or a.dtype != b.dtype or a.device != b.device,
                   "size": a.shape != b.shape or a.element_size() != b.element_size() or a.device != b.device,
                   "no-device": a.shape != b.shape or a.dtype != b.dtype,
                   "meta-only": a.shape != b.shape or a.dtype != b.dtype or a.is_meta != b.is_meta,
                   "none": False}[meta]
        if checked:
            return Difference(name, False, INF, INF, "metadata")
        a, b = a.detach(), b.detach()
        bits = lambda t: t.contiguous().view(R.INT_OF_SIZE[t.element_size()])  # noqa: E731
        differ = (a != b) if equal == "==" else (bits(a) != bits(b))
        same = equal(a, b) if callable(equal) else not differ.any()
        if (a.numel() == 0 or same) if empty == "or" else (a.numel() == 0 and same):
            return Difference(name, True)
        x, y = {"float64": (a.double(), b.double()), "float32": (a.float(), b.float()), "own": (a, b)}[wide]
        d = (x - y).abs()
        if masked:
            d = d[differ] if equal is None or equal == "==" else torch.where(x == y, torch.zeros_like(d), d)
        if not nan:
            d = d.nan_to_num(nan=0.0)  # to pass inf against inf, it also passes a NaN against a number
        max_abs = float(d.max().item())
        scale = float(x.abs().max().item())
        if rel == "elementwise":
            max_rel = float((d / x.abs()[differ]).max().item())
        else:
            max_rel = max_abs / scale if scale else (0.0 if max_abs == 0 and zero else INF)
        return Difference(name, False, max_abs, max_rel)
    return bug


def _mutating(name, a, b):
    if b is not None and b.is_floating_point() and not b.is_meta:
        b.detach().add_(1e-3)
    return R.difference(name, a, b)


BUGS_6_1 = {  # id: (planted bug, its hint)
    "torch.equal": (_difference(equal=torch.equal), H.DIFF_BITS),
    "values-differ": (_difference(equal="=="), H.DIFF_BITS),
    "allclose-nan": (_difference(equal=lambda a, b: torch.allclose(a, b, equal_nan=True)), H.DIFF_TOLERANCE),
    "tolerance": (_difference(equal=lambda a, b: torch.equal(a, b) or torch.allclose(a, b, rtol=1e-6, atol=0)),
                  H.DIFF_TOLERANCE),
    "rel-per-element": (_difference(rel="elementwise"), H.DIFF_REL),
    "inf-minus-inf": (_difference(masked=False), H.DIFF_ABS),
    "own-dtype": (_difference(wide="own"), H.DIFF_WIDE),
    "float32": (_difference(wide="float32"), H.DIFF_WIDE),
    "nan-as-zero": (_difference(masked=False, nan=False), H.DIFF_NAN),
    "signed-zero-inf": (_difference(zero=False), H.DIFF_ZERO),
    "and-for-or": (_difference(empty="and"), H.DIFF_EQUAL),
    "no-metadata": (_difference(meta="none"), H.DIFF_META),
    "dtype-by-size": (_difference(meta="size"), H.DIFF_DTYPE),
    "no-device": (_difference(meta="no-device"), H.DIFF_DEVICE),
    "none": (_difference(none_ok=False), H.DIFF_MISSING),
    "mutates": (_mutating, H.DIFF_INPUTS),
    "renames": (lambda name, a, b: R.difference(name.upper(), a, b), H.DIFF_SPEC),
    "tuple": (lambda name, a, b: (R.difference(name, a, b).bitwise, 0.0), H.DIFF_SPEC),
}


@pytest.mark.parametrize("bug, hint", BUGS_6_1.values(), ids=BUGS_6_1)
def test_ex_6_1_catches(bug, hint):
    assert _fails(checks.ex_6_1, bug).hint == hint


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bug, hint", BUGS_6_1.values(), ids=BUGS_6_1)
def test_ex_6_1_hidden_cases_alone_catch(bug, hint, seed, monkeypatch):
    assert _fails_hidden(monkeypatch, diff_check, checks.ex_6_1, bug, seed).hint == hint


def test_ex_6_1_planted_bugs_are_what_the_issue_names():
    f16 = lambda *v: torch.tensor(v, dtype=torch.float16)  # noqa: E731
    assert BUGS_6_1["own-dtype"][0]("x", f16(65504.0), f16(-65504.0)).max_abs == INF
    assert R.difference("x", f16(65504.0), f16(-65504.0)).max_abs == 131008
    assert BUGS_6_1["nan-as-zero"][0]("x", torch.tensor([1.0]), torch.tensor([math.nan])).max_abs == 0
    assert math.isnan(R.difference("x", torch.tensor([1.0]), torch.tensor([math.nan])).max_abs)
    t = torch.tensor([1.0, 2.0])
    assert BUGS_6_1["dtype-by-size"][0]("x", t, t.view(torch.int32)).bitwise
    assert BUGS_6_1["signed-zero-inf"][0]("x", torch.tensor([0.0]), torch.tensor([-0.0])).max_rel == INF
    with pytest.raises(RuntimeError):
        BUGS_6_1["and-for-or"][0]("x", t, t.clone())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CPU tensor against a CUDA one needs CUDA")
def test_ex_6_1_catches_an_answer_that_tells_only_the_meta_device_apart_on_cuda():
    assert _fails(checks.ex_6_1, _difference(meta="meta-only")).hint == H.DIFF_DEVICE


# ---------------------------------------------------------------- 6.2
def _batchnorm(detect=R.in_backward, restore=True, kinds=nn.modules.batchnorm._BatchNorm, always=False,
               track=False, count=True, eval_mode=False, callback=False, stash_once=False, none_is_empty=False):
    """batchnorm_once with one planted bug, chosen by the argument that differs from its default (restore by the
    forward hook only is itself a bug: callback=True, stash_once=True make the reference)."""
    def batchnorm_once(model):
        def thaw(bn, args=(), output=None):
            stash = getattr(bn, "stash", None)
            if restore and stash is not None and not (none_is_empty and stash[0] is None):
                (bn.momentum, bn.num_batches_tracked), bn.stash = stash, None
                bn.track_running_stats = True
                bn.train()

        def freeze(bn, args):
            if stash_once:
                thaw(bn)  # a rerun that stopped early left it frozen
            if (always or detect()) and bn.track_running_stats:
                bn.stash = (bn.momentum, bn.num_batches_tracked)
                if eval_mode:
                    bn.eval()
                    return
                if track:
                    bn.track_running_stats = False
                bn.momentum = 0.0
                if count:
                    bn.num_batches_tracked = None
                if callback:
                    torch.autograd.Variable._execution_engine.queue_callback(lambda: thaw(bn))
        for m in model.modules():
            if isinstance(m, kinds):
                m.register_forward_pre_hook(freeze)
                m.register_forward_hook(thaw)
        return model
    return batchnorm_once


def _momentum_for_two(model):
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is not None:
            m.momentum = 1 - math.sqrt(1 - m.momentum)
    return model


def _changes_outputs(model):
    def scale(bn, args, output):
        return output * (2.0 if R.in_backward() else 1.0)
    R.batchnorm_once(model)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.register_forward_hook(scale)
    return model


BUGS_6_2 = {
    "nothing": (lambda m: m, H.BN_TWICE),
    "grad-mode": (_batchnorm(detect=lambda: not torch.is_grad_enabled()), H.BN_DETECT),
    "no-restore": (_batchnorm(restore=False), H.BN_RESTORE),
    "hook-restore-only": (_batchnorm(), H.BN_RESTORE),  # a rerun that stops early leaves it frozen
    "only-2d": (_batchnorm(kinds=nn.BatchNorm2d, callback=True, stash_once=True), H.BN_ALL),
    "always": (_batchnorm(always=True), H.BN_ALWAYS),
    "track-off": (_batchnorm(track=True, callback=True, stash_once=True), H.BN_RERUN),
    "eval": (_batchnorm(eval_mode=True, callback=True, stash_once=True), H.BN_EVAL),
    "momentum-none-left-at-0": (_batchnorm(callback=True, stash_once=True, none_is_empty=True), H.BN_NONE),
    "shared-stashed-twice": (_batchnorm(callback=True), H.BN_SHARED),
    "momentum": (_momentum_for_two, H.BN_MOMENTUM),
    "outputs": (_changes_outputs, H.BN_OUTPUT),
    "returns-none": (lambda m: None, H.BN_SPEC),
}


def test_the_planted_batchnorm_bugs_are_one_change_from_a_right_answer(capsys):
    checks.ex_6_2(_batchnorm(callback=True, stash_once=True))
    assert "[ex 6.2] passed" in capsys.readouterr().out


@pytest.mark.parametrize("bug, hint", BUGS_6_2.values(), ids=BUGS_6_2)
def test_ex_6_2_catches(bug, hint):
    assert _fails(checks.ex_6_2, bug).hint == hint


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bug, hint", [BUGS_6_2[k] for k in ("momentum-none-left-at-0", "shared-stashed-twice",
                                                             "eval", "hook-restore-only")])
def test_ex_6_2_hidden_net_alone_catches(bug, hint, seed, monkeypatch):
    """The drawn net (one BatchNorm at least of momentum None) catches them without the public one."""
    monkeypatch.setattr(batchnorm, "_public", lambda: [])
    with base.hidden_cases(seed):
        err = _fails(checks.ex_6_2, bug)
    assert "drawn net" in str(err) and err.hint == hint


def test_a_momentum_none_batchnorm_left_at_0_drifts_from_the_right_patch():
    """The issue's figure: after 3 checkpointed steps its running mean is not the right patch's."""
    from torch.utils.checkpoint import checkpoint

    def mean_after(patch):
        torch.manual_seed(0)
        net = patch(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, momentum=None)))
        for t in range(3):
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(t)).requires_grad_()
            checkpoint(net, x, use_reentrant=False).square().sum().backward()
        return net[1].running_mean, net[1].momentum
    (right, m_right) = mean_after(R.batchnorm_once)
    (wrong, m_wrong) = mean_after(BUGS_6_2["momentum-none-left-at-0"][0])
    assert m_right is None and m_wrong == 0.0 and not torch.equal(right, wrong)


# ---------------------------------------------------------------- 6.3
def _least(s, key=lambda n, c: (c.overhead, c.peak_bytes, n), fits=lambda c, s: c.peak_bytes <= s.budget):
    found = [(key(n, c), n) for n, c in s.schemes.items() if n != "none" and fits(c, s)]
    return min(found)[1] if found else None


def _first_least(s):
    """Ties broken by dict order: the first scheme of least overhead that fits."""
    best = None
    for n, c in s.schemes.items():
        if n != "none" and c.peak_bytes <= s.budget and (best is None or c.overhead < s.schemes[best].overhead):
            best = n
    return best


def _plain(s, strict=False, training=True, fits=True):
    if training and not s.training:
        return "none"
    peak = s.schemes["none"].peak_bytes
    return "none" if fits and (peak < s.budget if strict else peak <= s.budget) else False


BUGS_6_3 = {
    "inference": (lambda s: _plain(s, training=False) or _least(s), H.REC_INFERENCE),
    "fits": (lambda s: _plain(s, fits=False) or _least(s), H.REC_FITS),
    "strict-budget": (lambda s: _plain(s, strict=True) or _least(s, fits=lambda c, s: c.peak_bytes < s.budget),
                      H.REC_EQUAL),
    "strict-plain-only": (lambda s: _plain(s, strict=True) or _least(s), H.REC_EQUAL),
    "unfit-cheapest": (lambda s: _plain(s) or _least(s, fits=lambda c, s: True), H.REC_FIT_ONLY),
    "least-peak": (lambda s: _plain(s) or _least(s, key=lambda n, c: (c.peak_bytes, n)), H.REC_LEAST),
    "none-string": (lambda s: _plain(s) or _least(s) or "none", H.REC_NONE),
    "tie-higher-peak": (lambda s: _plain(s) or _least(s, key=lambda n, c: (c.overhead, -c.peak_bytes, n)),
                        H.REC_TIE),
    "tie-by-dict-order": (lambda s: _plain(s) or _first_least(s), H.REC_TIE),
    "tie-by-name": (lambda s: _plain(s) or _least(s, key=lambda n, c: (c.overhead, n)), H.REC_TIE),
    "predicted-peak": (lambda s: _plain(s) or _least(s, fits=lambda c, s: c.predicted_bytes <= s.budget),
                       H.REC_MEASURED),
    "returns-cost": (lambda s: s.schemes["none"] if not s.training else R.recommend(s), H.REC_SPEC),
}


@pytest.mark.parametrize("bug, hint", BUGS_6_3.values(), ids=BUGS_6_3)
def test_ex_6_3_catches(bug, hint):
    assert _fails(checks.ex_6_3, bug).hint == hint


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bug, hint", BUGS_6_3.values(), ids=BUGS_6_3)
def test_ex_6_3_hidden_cases_alone_catch(bug, hint, seed, monkeypatch):
    assert _fails_hidden(monkeypatch, decide, checks.ex_6_3, bug, seed).hint == hint
