"""The gpu profile sized to a GPU's free memory (labkit.sizing), and `python -m labkit sizes`."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, fields

import pytest

from labkit import sizing
from labkit.__main__ import main
from labkit.profile import Sizes, sizes

GIB = 2**30
HUB_CARDS = (10, 16, 24, 40, 80, 141)  # a MIG slice, a T4, an L4/A10, an A100 40 GB, an A100/H100 80 GB, an H200
BATCHES = ("mlp_batch", "batch", "chain_batch", "long_batch")


@pytest.fixture
def _sizes_json(capsys):
    """`python -m labkit sizes ARGS` in this process: (exit status, the JSON printed or stderr)."""
    def run(*args: str) -> tuple[int, dict | str]:
        code = main(["sizes", *args])
        out, err = capsys.readouterr()
        return code, json.loads(out) if code == 0 and "--json" in args else err
    return run


def test_the_command_runs_as_a_program():
    run = subprocess.run([sys.executable, "-m", "labkit", "sizes", "--profile", "gpu", "--memory", "16GiB"],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("profile gpu: batches x") and "lab 05" in run.stdout


def test_sizes_command_at_each_hub_card_fits_and_grows(_sizes_json):
    chosen = []
    for gib in HUB_CARDS:
        code, figures = _sizes_json("--profile", "gpu", "--memory", f"{gib}GiB", "--json")
        assert code == 0, figures
        assert figures["memory_bytes"] == gib * GIB and figures["profile"] == "gpu"
        assert set(figures["labs"]) == {"01", "02", "03", "04", "05"}
        assert all(0 < peak <= 0.7 * gib * GIB for peak in figures["labs"].values()), (gib, figures["labs"])
        assert set(figures["sizes"]) == {f.name for f in fields(Sizes)} and figures["sizes"]["device"] == "cuda"
        chosen.append(figures)
    for smaller, larger in zip(chosen, chosen[1:]):
        assert all(larger["sizes"][k] >= smaller["sizes"][k] for k in BATCHES)
        assert larger["sizes"]["batch"] > smaller["sizes"]["batch"]  # grows at every step of the list
        assert max(larger["labs"].values()) > max(smaller["labs"].values())


def test_below_the_floor_the_cpu_sizes_are_chosen_and_said(_sizes_json):
    code, figures = _sizes_json("--profile", "gpu", "--memory", "3GiB", "--json")
    assert code == 0 and figures["profile"] == "cpu"
    assert figures["sizes"] == json.loads(json.dumps(asdict(sizes("cpu"))))
    assert "below the 4 GiB floor" in figures["note"] and "cpu sizes" in figures["note"]


def test_the_largest_scale_that_fits_is_chosen():
    for gib in (4, 7, 16, 141):
        c = sizing.choose(gib * GIB)
        assert max(c.labs.values()) <= sizing.FRACTION * gib * GIB
        assert max(sizing.lab_peaks(sizing.scaled(c.scale + 1)).values()) > sizing.FRACTION * gib * GIB
    assert sizing.choose(sizing.FLOOR_BYTES).profile == "gpu"  # the floor itself fits scale 1


def test_only_batches_scale_so_every_lab_keeps_its_ratios():
    one, many = sizing.scaled(1), sizing.scaled(7)
    for f in fields(Sizes):
        a, b = getattr(one, f.name), getattr(many, f.name)
        assert b == (7 * a if f.name in BATCHES else a), f.name


@pytest.mark.parametrize("text, value", [("16GiB", 16 * GIB), ("16 GiB", 16 * GIB), ("24GB", 24 * 10**9),
                                         ("1.5G", 15 * 10**8), ("2048MiB", 2 * GIB), ("4096", 4096), (4096, 4096)])
def test_memory_amounts_are_read(text, value):
    assert sizing.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["16XB", "lots", "-1GiB", "0", "", "GiB"])
def test_a_memory_amount_that_is_not_one_is_refused_by_name(text, _sizes_json):
    with pytest.raises(ValueError, match="memory"):
        sizing.parse_bytes(text)
    code, err = _sizes_json("--profile", "gpu", f"--memory={text}")
    assert code == 2 and repr(text) in err and "16GiB" in err


def test_memory_is_only_for_the_gpu_profile_and_the_gpu_profile_needs_a_gpu_or_memory(_sizes_json):
    code, err = _sizes_json("--profile", "cpu", "--memory", "16GiB")
    assert code == 2 and "--memory sizes the gpu profile" in err
    code, figures = _sizes_json("--profile", "tiny", "--json")
    assert code == 0 and figures["profile"] == "tiny" and figures["memory_bytes"] is None
    import torch
    if not torch.cuda.is_available():
        code, err = _sizes_json("--profile", "gpu")
        assert code == 2 and "--memory" in err and "no CUDA device" in err
