"""`lk.use(profile=..., gpu_memory=...)`: a hub's student sets the profile or the GPU share from a notebook, before
anything chooses sizes; afterwards a change is refused, naming why."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import labkit as lk
from labkit.env import profile as prof
from labkit.env import variables


@contextlib.contextmanager
def fresh_kernel() -> Iterator[None]:
    """A kernel that has chosen nothing yet, its profile and GPU share unset; afterwards every LABKIT_* variable
    as it was, set or unset. (monkeypatch.delenv of an unset variable records nothing, so what lk.use set in the
    test stayed set for every later test of the session.)"""
    saved, chosen = {k: os.environ.get(k) for k in variables.NAMES}, prof._chosen
    prof._chosen = None
    for name in (variables.PROFILE, variables.GPU_MEMORY):
        os.environ.pop(name, None)
    try:
        yield
    finally:
        prof._chosen = chosen
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def fresh():
    with fresh_kernel():
        yield


@pytest.mark.parametrize("before", [None, "cpu"])
def test_a_fresh_kernel_puts_back_what_lk_use_set(monkeypatch, before):
    monkeypatch.delenv(variables.GPU_MEMORY, raising=False)
    if before is None:
        monkeypatch.delenv(variables.PROFILE, raising=False)
    else:
        monkeypatch.setenv(variables.PROFILE, before)
    with fresh_kernel():
        lk.use(profile="tiny", gpu_memory="12GiB")
        lk.sizes()
    assert os.environ.get(variables.PROFILE) == before and variables.GPU_MEMORY not in os.environ


def test_use_before_the_first_sizes_sets_this_kernel_s_profile(fresh):
    lk.use(profile="tiny")
    assert lk.profile() == "tiny" and lk.sizes().name == "tiny"
    lk.use(profile="tiny")  # the first cell run again: the same settings are fine
    with pytest.raises(RuntimeError, match=r"already chose its sizes \(profile tiny\).*restart the kernel"):
        lk.use(profile="cpu")
    assert lk.profile() == "tiny"


def test_a_gpu_share_is_set_and_held(fresh):
    lk.use(gpu_memory="12GiB")
    import os
    assert os.environ["LABKIT_GPU_MEMORY"] == "12GiB"
    lk.sizes()
    with pytest.raises(RuntimeError, match="already chose its sizes"):
        lk.use(gpu_memory="8GiB")
    lk.use(gpu_memory="12 GiB")  # the same share, written another way: not a change
    lk.use(gpu_memory="12288MiB")


@pytest.mark.parametrize("kwargs, words", [({"profile": "huge"}, "not a profile"),
                                           ({"gpu_memory": "lots"}, "gpu_memory='lots'")])
def test_bad_values_are_refused_naming_them(fresh, kwargs, words):
    with pytest.raises(ValueError, match=words):
        lk.use(**kwargs)


def test_gpu_without_cuda_is_refused(fresh, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device"):
        lk.use(profile="gpu")


def test_in_a_new_kernel_use_then_doctor_reports_the_profile():
    """As lab 00 says: `lk.use` right after the import, then the doctor shows it."""
    code = ("import labkit as lk\nlk.use(profile='tiny')\nr = lk.doctor(verbose=False)\nprint(r.profile)\n"
            "try:\n    lk.sizes(); lk.use(profile='cpu')\nexcept RuntimeError as e:\n    print('refused')\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "LABKIT_PROFILE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["tiny", "refused"]
