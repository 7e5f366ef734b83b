"""Tests for the checkers of 06_pitfalls: they pass the reference and catch each planted bug with its own hint."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import labkit.reference.pitfalls as R
from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.checks.lab06 import hints as H
from labkit.instruments.harness import Difference

INF = float("inf")


def _fails(check, *args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


# ---------------------------------------------------------------- 6.1
def _difference(equal=None, meta=True, rel="max", none_ok=True, wide=True, masked=True):
    def bug(name, a, b):
        if a is None or b is None:
            if none_ok:
                return Difference(name, True) if a is b else Difference(name, False, INF, INF, "missing")
            return Difference(name, False, INF, INF, "missing")
        if meta and (a.shape != b.shape or a.dtype != b.dtype or a.device != b.device):
            return Difference(name, False, INF, INF, "metadata")
        a, b = a.detach(), b.detach()
        same = equal(a, b) if equal else torch.equal(a.contiguous().view(R.INT_OF_SIZE[a.element_size()]),
                                                     b.contiguous().view(R.INT_OF_SIZE[b.element_size()]))
        if a.numel() == 0 or same:
            return Difference(name, True)
        x, y = (a.double(), b.double()) if wide else (a.float(), b.float())
        d = (x - y).abs()
        if masked:
            d = torch.where(x == y, torch.zeros_like(d), d)
        max_abs = d.max().item()
        scale = x.abs().max().item()
        max_rel = (d / x.abs()).max().item() if rel == "elementwise" else (max_abs / scale if scale else INF)
        return Difference(name, False, max_abs, max_rel)
    return bug


def _mutating(name, a, b):
    if b is not None and b.is_floating_point():
        b.detach().add_(0)
        b.detach().mul_(-1).mul_(-1)
        b.detach().add_(1e-3)
    return R.difference(name, a, b)


@pytest.mark.parametrize("bug, hint", [
    (_difference(equal=torch.equal), H.DIFF_BITS),
    (_difference(equal=lambda a, b: torch.allclose(a, b, equal_nan=True)), H.DIFF_TOLERANCE),
    (_difference(equal=lambda a, b: torch.equal(a, b) or torch.allclose(a, b, rtol=1e-6, atol=0)), H.DIFF_TOLERANCE),
    (_difference(rel="elementwise"), H.DIFF_REL),
    (_difference(masked=False), H.DIFF_ABS),
    (_difference(meta=False), H.DIFF_META),
    (_difference(none_ok=False), H.DIFF_MISSING),
    (_mutating, H.DIFF_INPUTS),
    (lambda name, a, b: R.difference(name.upper(), a, b), H.DIFF_SPEC),
    (lambda name, a, b: (R.difference(name, a, b).bitwise, 0.0), H.DIFF_SPEC),
], ids=["torch.equal", "allclose-nan", "tolerance", "rel-per-element", "inf-minus-inf", "no-metadata", "none",
        "mutates", "renames", "tuple"])
def test_ex_6_1_catches(bug, hint):
    assert _fails(checks.ex_6_1, bug).hint == hint


# ---------------------------------------------------------------- 6.2
def _batchnorm(detect=R.in_backward, restore=True, kinds=nn.modules.batchnorm._BatchNorm, always=False,
               track=False, count=True):
    def batchnorm_once(model):
        def freeze(bn, args):
            if (always or detect()) and bn.track_running_stats:
                bn.stash = (bn.momentum, bn.num_batches_tracked)
                if track:
                    bn.track_running_stats = False
                bn.momentum = 0.0
                if count:
                    bn.num_batches_tracked = None

        def thaw(bn, args, output):
            if restore and getattr(bn, "stash", None) is not None:
                (bn.momentum, bn.num_batches_tracked), bn.stash = bn.stash, None
                bn.track_running_stats = True
        for m in model.modules():
            if isinstance(m, kinds):
                m.register_forward_pre_hook(freeze)
                m.register_forward_hook(thaw)
        return model
    return batchnorm_once


def _momentum_for_two(model):
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
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


@pytest.mark.parametrize("bug, hint", [
    (lambda m: m, H.BN_TWICE),
    (_batchnorm(detect=lambda: not torch.is_grad_enabled()), H.BN_DETECT),
    (_batchnorm(restore=False), H.BN_RESTORE),
    (_batchnorm(), H.BN_RESTORE),  # put back by the forward hook only: a rerun that stops early leaves it frozen
    (_batchnorm(kinds=nn.BatchNorm2d), H.BN_ALL),
    (_batchnorm(always=True), H.BN_ALWAYS),
    (_batchnorm(track=True), H.BN_RERUN),
    (_momentum_for_two, H.BN_MOMENTUM),
    (_changes_outputs, H.BN_OUTPUT),
    (lambda m: None, H.BN_SPEC),
], ids=["nothing", "grad-mode", "no-restore", "hook-restore-only", "only-2d", "always", "track-off", "momentum", "outputs", "returns-none"])
def test_ex_6_2_catches(bug, hint):
    assert _fails(checks.ex_6_2, bug).hint == hint


# ---------------------------------------------------------------- 6.3
def _least(s):
    fits = [(c.overhead, c.peak_bytes, n) for n, c in s.schemes.items() if n != "none" and c.peak_bytes <= s.budget]
    return min(fits)[2] if fits else None


@pytest.mark.parametrize("bug, hint", [
    (lambda s: "none" if s.schemes["none"].peak_bytes <= s.budget else _least(s), H.REC_INFERENCE),
    (lambda s: "none" if not s.training else _least(s), H.REC_FITS),
    (lambda s: "none" if not s.training or s.schemes["none"].peak_bytes < s.budget else
     min([(c.overhead, c.peak_bytes, n) for n, c in s.schemes.items() if n != "none" and c.peak_bytes < s.budget],
         default=(0, 0, None))[2], H.REC_EQUAL),
    (lambda s: "none" if not s.training or s.schemes["none"].peak_bytes <= s.budget else
     min((c.overhead, c.peak_bytes, n) for n, c in s.schemes.items() if n != "none")[2], H.REC_FIT_ONLY),
    (lambda s: "none" if not s.training or s.schemes["none"].peak_bytes <= s.budget else
     min([(c.peak_bytes, n) for n, c in s.schemes.items() if n != "none" and c.peak_bytes <= s.budget],
         default=(0, None))[1], H.REC_LEAST),
    (lambda s: "none" if not s.training or s.schemes["none"].peak_bytes <= s.budget else (_least(s) or "none"),
     H.REC_NONE),
    (lambda s: "none" if not s.training or s.schemes["none"].peak_bytes <= s.budget else
     min([(c.overhead, -c.peak_bytes, n) for n, c in s.schemes.items() if n != "none" and c.peak_bytes <= s.budget],
         default=(0, 0, None))[2], H.REC_TIE),
    (lambda s: s.schemes["none"] if not s.training else R.recommend(s), H.REC_SPEC),
], ids=["inference", "fits", "strict-budget", "unfit-cheapest", "least-peak", "none-string", "tie-higher-peak",
        "returns-cost"])
def test_ex_6_3_catches(bug, hint):
    assert _fails(checks.ex_6_3, bug).hint == hint
