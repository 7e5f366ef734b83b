"""The gpu profile sized to a GPU's free memory (labkit.env.sizing), and `python -m labkit sizes`."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from dataclasses import asdict, fields

import pytest

from labkit.env import sizing
from labkit.__main__ import main
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes

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
        assert set(figures["labs"]) == {"01", "02", "03", "04", "05", "06", "07"}
        assert all(0 < peak <= 0.7 * gib * GIB for peak in figures["labs"].values()), (gib, figures["labs"])
        assert set(figures["sizes"]) == {f.name for f in fields(Sizes)} and figures["sizes"]["device"] == "cuda"
        chosen.append(figures)
    for smaller, larger in zip(chosen, chosen[1:]):
        assert all(larger["sizes"][k] >= smaller["sizes"][k] for k in BATCHES)
        assert larger["sizes"]["batch"] > smaller["sizes"]["batch"]  # grows at every step of the list
        assert max(larger["labs"].values()) > max(smaller["labs"].values())


def test_below_the_floor_the_cpu_sizes_are_chosen_and_said(_sizes_json):
    code, figures = _sizes_json("--profile", "gpu", "--memory", "3GiB", "--json")
    assert code == 0 and figures["profile"] == "cpu" and figures["scale"] == 0
    assert figures["sizes"] == json.loads(json.dumps(asdict(sizes("cpu"))))
    assert "below the 4 GiB floor" in figures["note"] and "cpu sizes" in figures["note"]


def test_the_largest_scale_that_fits_is_chosen():
    for gib in (4, 7, 16, 141):
        c = sizing.choose(gib * GIB)
        assert max(c.labs.values()) <= sizing.FRACTION * gib * GIB
        assert max(sizing.lab_peaks(sizing.scaled(c.scale + 1)).values()) > sizing.FRACTION * gib * GIB
    assert sizing.choose(sizing.FLOOR_BYTES).profile == "gpu"  # the floor itself fits scale 1
    for fraction in (0, -0.5, 1.01, 1.5):
        with pytest.raises(ValueError, match=f"fraction={fraction!r} must be in"):
            sizing.choose(16 * GIB, fraction)
    assert sizing.choose(16 * GIB, 1).scale >= sizing.choose(16 * GIB).scale


def test_only_batches_scale_so_every_lab_keeps_its_ratios():
    one, many = sizing.scaled(1), sizing.scaled(7)
    for f in fields(Sizes):
        a, b = getattr(one, f.name), getattr(many, f.name)
        assert b == (7 * a if f.name in BATCHES else a), f.name


@pytest.mark.parametrize("text, value", [("16GiB", 16 * GIB), ("16 GiB", 16 * GIB), ("24GB", 24 * 10**9),
                                         ("1.5G", 15 * 10**8), ("2048MiB", 2 * GIB), ("4096", 4096), (4096, 4096),
                                         ("2kb", 2000), ("3K", 3000), ("5KiB", 5 * 2**10), ("7m", 7 * 10**6),
                                         ("1tb", 10**12), ("2TiB", 2 * 2**40), ("9b", 9), ("1g", 10**9), ("3MB", 3 * 10**6),
                                         ("4t", 4 * 10**12), ("5gb", 5 * 10**9), ("1", 1), (1, 1)])
def test_memory_amounts_are_read(text, value):
    assert sizing.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["16XB", "lots", "-1GiB", "0", "", "GiB", True])
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


class _FakeCuda:
    """torch.cuda as a 141 GiB card with 140 GiB free: what gpu_choice reads, and the cap it sets."""

    def __init__(self, monkeypatch):
        import torch

        self.fraction = None
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (140 * GIB, 141 * GIB))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": 141 * GIB}))
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                            lambda f, device=None: setattr(self, "fraction", f))


@pytest.fixture
def fake_cuda(monkeypatch):
    profile = importlib.import_module("labkit.env.profile")
    profile._gpu_choice.cache_clear()  # choices made on this fake card stay out of other tests
    yield _FakeCuda(monkeypatch)
    profile._gpu_choice.cache_clear()


def test_labkit_gpu_memory_sizes_for_the_share_and_caps_the_allocator_while_it_is_set(monkeypatch, fake_cuda):
    from labkit.env.profile import gpu_choice

    cuda = fake_cuda
    monkeypatch.setenv("LABKIT_GPU_MEMORY", "12GiB")
    small = gpu_choice()
    assert small.memory_bytes == 12 * GIB and cuda.fraction == pytest.approx(12 / 141)
    monkeypatch.setenv("LABKIT_GPU_MEMORY", "24GiB")
    assert gpu_choice().scale > small.scale and cuda.fraction == pytest.approx(24 / 141)
    monkeypatch.setenv("LABKIT_GPU_MEMORY", "12GiB")
    assert gpu_choice() is small and cuda.fraction == pytest.approx(12 / 141)  # the same sizes, the same cap
    for lifted in ("", "200GiB"):  # unset, or more than the card: the whole card, no cap left behind
        monkeypatch.setenv("LABKIT_GPU_MEMORY", lifted)
        assert gpu_choice().memory_bytes == 140 * GIB and cuda.fraction == 1.0
    monkeypatch.setenv("LABKIT_GPU_MEMORY", "lots")
    with pytest.raises(ValueError, match="LABKIT_GPU_MEMORY: memory 'lots'"):
        gpu_choice()
    assert sizes("cpu").device == "cpu"


def test_a_gpu_below_the_floor_warns_and_gets_the_cpu_sizes(monkeypatch, fake_cuda):
    from labkit.env.profile import gpu_choice

    monkeypatch.setenv("LABKIT_GPU_MEMORY", "3GiB")
    with pytest.warns(UserWarning, match="below the 4 GiB floor"):
        assert gpu_choice().profile == "cpu"


def test_a_peak_is_predicted_for_every_lab_of_the_catalog_that_uses_the_device():
    from labkit.course.catalog import LABS

    assert list(sizing.lab_peaks(sizes("tiny"))) == [lab.number for lab in LABS if lab.number != "00"]


def _steady_peak(model, x, opt) -> int:
    from labkit.instruments.meter import MemoryMeter

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        opt.step()
    step()
    with MemoryMeter(model, opt, x) as meter:
        step()
    return meter.peak


@pytest.mark.parametrize("layers, seq", [(2, None), (4, None), (2, 32)])
def test_a_gpt_steps_predicted_peak_is_never_below_the_meters_and_within_half_again(layers, seq):
    """The GPU sizes rest on these predictions (a run on a GPU checks them against the allocator): on the CPU,
    a steady Adam step of the GPT stack (weights, gradients, two moments, a temporary: 5 copies)."""
    import torch
    from labkit.models import GPTStack, gpt_input

    cfg = sizes("tiny").gpt(n_layers=layers, **({"seq": seq} if seq else {}))
    torch.manual_seed(0)
    model = GPTStack(cfg)
    peak = _steady_peak(model, gpt_input(cfg, requires_grad=True), torch.optim.Adam(model.parameters()))
    assert peak <= sizing._gpt_step(cfg, 5) <= 1.6 * peak


@pytest.mark.parametrize("layers, width, batch", [(4, 64, 32), (8, 128, 16), (3, 256, 64)])
def test_a_chains_predicted_peak_is_never_below_the_meters_and_within_half_again(layers, width, batch):
    import torch
    from labkit.models.mlp import MLPChain, MLPConfig, mlp_input

    cfg = MLPConfig(n_layers=layers, width=width)
    model = MLPChain(cfg)
    peak = _steady_peak(model, mlp_input(cfg, batch, requires_grad=True), torch.optim.SGD(model.parameters(), lr=0.1))
    assert peak <= sizing._chain_step(layers, width, batch, 2) <= 1.5 * peak


@pytest.mark.parametrize("profile", ["tiny", "cpu"])
def test_the_parameter_terms_are_the_bytes_of_the_models_the_labs_build(profile):
    import torch

    import labkit as lk
    from labkit.bench.lab06 import rng_config

    size = sizes(profile)
    chains = [(size.mlp_layers, size.mlp_width), sizing.LAB06_WIDE[:2], (max(size.chain_layers), size.chain_width)]
    for n, width in chains:  # lab 01's chain, lab 06's wide MLP, lab 03's longest chain
        assert sizing._chain_params(n, width) == lk.parameter_bytes(lk.MLPChain(lk.MLPConfig(n_layers=n, width=width)))
    for cfg in (size.gpt(), size.gpt(dtype=torch.bfloat16), size.long_gpt()):
        assert sizing._gpt_params(cfg) == lk.parameter_bytes(lk.GPTStack(cfg))
    small = sizing._lab06_small(size)
    assert small.n_layers == rng_config(size).n_layers and small.batch == rng_config(size).batch
    assert sizing._gpt_params(small) == lk.parameter_bytes(lk.GPTStack(rng_config(size)))


def test_the_wide_mlp_predicted_is_the_one_lab_06_builds():
    from pathlib import Path

    import nbformat

    layers, width, batch = sizing.LAB06_WIDE
    nb = nbformat.read(Path(__file__).resolve().parent.parent / "solutions" / "06_pitfalls.ipynb", as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert f"wide = lk.MLPChain(lk.MLPConfig(n_layers={layers}, width={width})).to(dev)" in source
    assert f"wide_x = lk.mlp_input(wide.cfg, batch={batch}, requires_grad=True, device=dev)" in source


def test_a_labs_peak_is_the_largest_of_its_parts():
    parts = sizing.lab_branches(sizes("cpu"))
    assert sizing.lab_peaks(sizes("cpu")) == {lab: max(p.values()) for lab, p in parts.items()}
    assert {lab: len(p) for lab, p in parts.items()} == {"01": 2, "02": 1, "03": 1, "04": 1, "05": 2, "06": 2, "07": 3}


def test_the_choice_says_the_largest_peak_and_the_memory_in_gib():
    c = sizing.choose(16 * GIB)
    largest = max(c.labs, key=c.labs.get)
    assert f"lab {largest}'s predicted peak, {c.labs[largest] / GIB:.2f} GiB" in c.note
    assert f"is {c.labs[largest] / (16 * GIB):.0%} of the 16.0 GiB free" in c.note


def test_lab_07s_vocabulary_part_is_on_the_cpu_only():
    """Section 7.8 runs on the CPU on every profile (labkit.bench.logits): a GPU's prediction leaves it out."""
    from dataclasses import replace

    cpu = sizes("cpu")
    assert sizing.lab_branches(cpu)["07"]["vocabulary"] > sizing.lab_branches(cpu)["07"]["plans' comparison"]
    assert sizing.lab_branches(replace(cpu, device="cuda"))["07"]["vocabulary"] == 0
