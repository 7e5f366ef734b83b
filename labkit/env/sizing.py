"""The `gpu` profile, sized to the memory a GPU has free.

One set of GPU shapes (GPU_SHAPES) and one integer, the scale, that multiplies
every batch: the largest scale at which each lab's predicted peak stays under
FRACTION of the memory free. Shapes stay fixed so that every ratio a lab
teaches from (5as/h against 34, the chain's length, the segment counts) is the
same on every GPU; only the amount of work per step grows with the card.

Each lab's peak is predicted from the kit's own models (korthikanti_bytes for
activations, gpt_param_count for parameters, the MLP chain's (n+1)·b·w) plus
the tensors the lab's notebook keeps alive beside its largest step; `python -m
labkit gpu-check` measures the allocator's peak of each lab against it.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

import torch

from labkit.env.sizes import FIXED, GPU_SHAPES, MEASURE_SIZES, Sizes
from labkit.models import GPTConfig, gpt_param_count, korthikanti_bytes

# each lab's predicted (allocated) peak stays under this share of the memory free; the rest is the caching
# allocator's: gpu-check holds each lab's reserved peak to RESERVE_FACTOR x the prediction (tools/gpurows.py),
# so a lab reserves at most 0.7 x 1.3 = 91% of what was free (measured on an H200: at most 1.001x the prediction)
FRACTION = 0.7
FLOOR_BYTES = 4 * 2**30  # below this much free memory the GPU is too small: the cpu sizes are used
MAX_SCALE = 4096

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

# lab 01 plots the MLP chain's activations up to this batch (2**13), whatever the profile
LAB01_LARGEST_BATCH = 2**13
# lab 06's wide MLP, the same on every profile: (layers, width, batch); tests/test_sizing.py finds it in the lab
LAB06_WIDE = (4, 1024, 4)


def parse_bytes(text: str | int) -> int:
    """"16GiB", "16 GiB", "1.5G" (decimal), "2048MiB" or a plain number of bytes -> bytes, a positive int."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"memory {text!r} is not an amount of memory; write it like 16GiB, 24GB, "
                             "2048MiB or a number of bytes")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"memory {text!r} must be a positive amount, like 16GiB")
    return value


def scaled(scale: int) -> Sizes:
    """GPU_SHAPES with every batch multiplied by `scale`."""
    if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
        raise ValueError(f"scale={scale!r} must be an int >= 1")
    s = GPU_SHAPES
    return replace(s, mlp_batch=s.mlp_batch * scale, batch=s.batch * scale, chain_batch=s.chain_batch * scale,
                   long_batch=s.long_batch * scale)


# ---------------------------------------------------------------- each lab's peak, predicted

def _element(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _gpt_params(cfg: GPTConfig) -> int:
    """Bytes of a GPTStack's parameters in its dtype."""
    return gpt_param_count(cfg) * _element(cfg.dtype)


def _chain_params(n_layers: int, width: int) -> int:
    """Bytes of an MLP chain's (float32) parameters: each layer's weight and bias."""
    return n_layers * (width * width + width) * 4


def _lab06_small(size: Sizes) -> GPTConfig:
    """Lab 06's small training stack (labkit.bench.lab06.rng_config): half the depth and batch."""
    return size.gpt(n_layers=max(1, size.gpt_layers // 2), batch=max(1, size.batch // 2))


def _gpt_step(cfg: GPTConfig, param_copies: int) -> int:
    """Bytes live at the peak of a GPTStack step: every layer's activations, one more layer's worth of
    backward temporaries, input and output, and `param_copies` parameter-sized tensors (weights, gradients,
    optimizer state, clones)."""
    params = _gpt_params(cfg)
    one_layer = korthikanti_bytes(replace(cfg, n_layers=1))
    io = 2 * cfg.seq * cfg.batch * cfg.hidden * _element(cfg.dtype)
    return param_copies * params + korthikanti_bytes(cfg) + one_layer + io


def _chain_step(n_layers: int, width: int, batch: int, param_copies: int) -> int:
    """Bytes live at the peak of an MLP chain's (float32) step: the (n+1)·b·w it keeps, four activations of
    temporaries and gradients (input, output, ReLU's and Linear's in backward), and `param_copies`
    parameter-sized tensors."""
    return param_copies * _chain_params(n_layers, width) + (n_layers + 5) * batch * width * 4


def lab_branches(size: Sizes) -> dict[str, dict[str, int]]:
    """Each lab's predicted peak bytes, per part of the lab that could reach it (its largest step and what its
    notebook keeps alive beside it), at `size`: {lab: {part: bytes}}. tests/test_lab_peaks.py holds each part
    against the measured peak of the cells that run it, where a lab's parts run in cells of their own.
    Predicted as if every step ran in its model's dtype: under the gpu profile's bfloat16 autocast the
    activations are partly 16-bit (fewer bytes) and each block's bfloat16 weight casts live until the model's
    forward ends (more); the prediction is not adjusted for either, and only gpu-check has measured it."""
    mlp_params = _chain_params(size.mlp_layers, size.mlp_width)
    stack = size.gpt(dtype=torch.bfloat16)
    stack_params = _gpt_params(stack)
    sides, mib, draws, special = MEASURE_SIZES[size.name]
    long = size.long_gpt()
    deep = size.gpt()
    wide_layers, wide_width, wide_batch = LAB06_WIDE
    wide_params = _chain_params(wide_layers, wide_width)
    logits = 4 * size.batch * size.seq * 4 * size.hidden * 4  # lab 07: four (b, s, vocab = 4h) float32 tensors
    lab06_sides = 2 * (_gpt_params(deep) + wide_params + _gpt_params(_lab06_small(size)))
    return {
        "01": {
            # the MLP chain's activations at batch 2**13 (a forward), beside the chain's weights
            "chain forward": mlp_params + _chain_step(size.mlp_layers, size.mlp_width, LAB01_LARGEST_BATCH, 1),
            # the last Adam step of one_step_meter (weights, gradients, two moments and one of Adam's
            # temporaries) beside `deep` and `gpt` with its own gradients and Adam state
            "Adam step": mlp_params + 4 * stack_params + _gpt_step(stack, 5),
        },
        # the comparison's stack, twice as deep, float32: weights, gradients and one cloned set; beside it
        # the ledger `plain`, whose output holds one block's graph
        "02": {"comparison": _gpt_step(size.gpt(n_layers=2 * size.gpt_layers), 3)
               + korthikanti_bytes(size.gpt(n_layers=1))},
        # the longest chain: weights, gradients and one cloned set, beside the notebook's `long_model` (weights
        # and gradients) and the chain of the length before (the same again, at most)
        "03": {"longest chain": _chain_step(max(size.chain_layers), size.chain_width, size.chain_batch, 6)},
        # the long stack: weights, gradients and two cloned sets (policy_rows compares gradients)
        "04": {"long stack": _gpt_step(long, 4)},
        # the same stack, or the ceilings' own buffers (a matmul's three squares, a copy's two)
        "05": {"long stack": _gpt_step(long, 4),
               # transcendentals at 16 x `special` (roofline.SPECIAL_SCALE): the input, exp's output, softmax's or
               # GELU's output and a temporary, float32 at most
               "ceilings": max(3 * max(sides) ** 2 * 4, 2 * mib * 2**20, 4 * draws, 4 * 4 * 16 * special)},
        # the advisor's copy of `deep` or of the wide MLP: weights, gradients, Adam's two moments and the two
        # parameter-sized temporaries of its foreach step (measured on the MLP); beside them the notebook's deep
        # stack, wide MLP and small stack, each with its gradients
        "06": {"advisor on the deep stack": _gpt_step(deep, 6) + lab06_sides,
               "advisor on the wide MLP": _chain_step(wide_layers, wide_width, wide_batch, 6) + lab06_sides},
        # the language model's plain step (the stack's, and its logits, their float copy, log-softmax and
        # gradient) beside the notebook's model: in the plans' comparison, on one copy with gradients and Adam's
        # state; in the batch search, a step run when its predicted peak is up to OVER (1.25) times the budget
        # (itself under the plain step's peak), and measured up to 5% over its prediction (the planner's error:
        # tests/test_lab_peaks.py saw 64.0 MiB against 63.6 at 1.25 on the cpu sizes), so 1.25 x 1.05 = 21/16
        "07": {"plans' comparison": _gpt_step(deep, 5) + logits,
               "batch search": 21 * (_gpt_step(deep, 4) + logits) // 16 + _gpt_params(deep),
               "vocabulary": _vocabulary_part(size)},
    }


def _vocabulary_part(size: Sizes) -> int:
    """Lab 07's section 7.8 (labkit.bench.logits), which runs on the CPU on every profile: nothing on a GPU. On
    the CPU its largest moment is the ledger's run at Llama 3's vocabulary and twice the lab's sequence (one
    sequence): the (s, vocab) float32 logits and the log-softmax cross-entropy keeps, the head's weight and the
    randn it is scaled from; a tenth more for what the lab keeps alive beside it (measured: 5%)."""
    if size.device != "cpu":
        return 0
    from labkit.models.hugging_face import VOCABS

    vocab, positions = VOCABS["llama3"], 2 * size.seq
    return 11 * (2 * positions * vocab * 4 + 2 * vocab * size.hidden * 4) // 10


def lab_peaks(size: Sizes) -> dict[str, int]:
    """Predicted peak bytes on the device of each lab that puts tensors there (01-07), at `size`: the largest of
    its parts (lab_branches), checked against the allocator by `labkit gpu-check`."""
    return {lab: max(parts.values()) for lab, parts in lab_branches(size).items()}


# ---------------------------------------------------------------- choosing the sizes

@dataclass(frozen=True)
class Choice:
    """The sizes chosen for `memory_bytes` of free GPU memory, and why."""

    memory_bytes: int
    profile: str  # "gpu", or "cpu" when the memory is below FLOOR_BYTES
    sizes: Sizes
    scale: int  # the batch multiplier (0 when the cpu sizes were chosen)
    labs: dict[str, int]  # each lab's predicted peak bytes at these sizes
    note: str

    def as_json(self) -> dict:
        """The fields of `python -m labkit sizes --json`."""
        return {"memory_bytes": self.memory_bytes, "profile": self.profile, "scale": self.scale,
                "sizes": asdict(self.sizes), "labs": self.labs, "fraction": FRACTION, "note": self.note}


def choose(memory_bytes: int, fraction: float = FRACTION) -> Choice:
    """The largest scale whose every lab peak is at most `fraction` of `memory_bytes`; the cpu sizes,
    with a note saying so, when the memory is below FLOOR_BYTES."""
    memory_bytes = parse_bytes(memory_bytes)
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r} must be in (0, 1]")
    if memory_bytes < FLOOR_BYTES:
        cpu = FIXED["cpu"]
        return Choice(memory_bytes, "cpu", cpu, 0, lab_peaks(cpu),
                      f"{memory_bytes / 2**30:.1f} GiB free is below the {FLOOR_BYTES / 2**30:g} GiB floor: "
                      "the GPU is too small for the gpu profile, so the labs run on the CPU at the cpu sizes")
    allowed = fraction * memory_bytes
    low, high = 1, MAX_SCALE  # the peaks grow with the scale: bisect for the largest that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if max(lab_peaks(scaled(mid)).values()) <= allowed else (low, mid - 1)
    peaks = lab_peaks(scaled(low))
    if max(peaks.values()) > allowed:  # the floor is chosen so that scale 1 fits; say so if that ever breaks
        raise ValueError(f"{memory_bytes:,} B free: even scale 1 needs {max(peaks.values()):,} B, over "
                         f"{fraction:.0%} of it; raise FLOOR_BYTES")
    largest = max(peaks, key=peaks.get)
    return Choice(memory_bytes, "gpu", scaled(low), low, peaks,
                  f"batches x{low}: lab {largest}'s predicted peak, {peaks[largest] / 2**30:.2f} GiB, is "
                  f"{peaks[largest] / memory_bytes:.0%} of the {memory_bytes / 2**30:.1f} GiB free "
                  f"(at most {fraction:.0%})")
