"""Roofline: the ceilings of the machine an op of a trace (labkit.instruments.ops) ran on, and what places the
op under them. The roofline time itself, the largest of an op's compute, memory and random terms, is Exercise
5.1 of lab 05: the kit uses it from there (labkit.labs.roofline), never writes it again here.

An op cannot run faster than its slowest resource allows. The rules this file applies:

Rule 1. Measured ceilings bound an op's time. Compute: its FLOPs over the peak matmul FLOP/s or, for an op
   that applies a transcendental per element (exp in softmax, erf in GELU), their count over the measured
   exp rate (TRANSCENDENTALS_PER_ELEMENT), whichever is longer (a CPU evaluates exp as a polynomial on its
   vector units, far below the matmul peak; a GPU has special-function units of their own). Memory: its
   bytes over the bandwidth. Random: for an op that draws random numbers, its draws (``random_draws``) over
   the generator's rate.
Rule 2. Every number is measured here or cited: the ceilings by ``measure_ceilings``, the spec sheets in
   ``GPU_SPECS`` with their source. The one exception is FLOPs of elementwise ops, which PyTorch's counter
   prices at 0: ``ELEMENTWISE_FLOPS`` gives them explicit per-element estimates (they place an op on the
   intensity axis; on every machine here they are far from the compute roof, so they barely move a prediction).
Rule 3. A spec sheet predicts, it never measures: ``GPUSpec`` holds a datasheet's figures, and its
   ``ceilings()`` are an input to a prediction, never a measurement.
Rule 4. A ceiling is measured the way the ops it bounds run, or it bounds nothing: timed as ``benchmark``
   times an op (on CUDA, many launches between one pair of events: amortised as labkit.instruments.timing says), in
   the dtype of the ceilings, and as the best rate measured (a ceiling measured slower than an op runs
   would let the op beat its bound). So the transcendental rate is the best of exp, softmax and GELU, each
   in cache and beyond it; the bandwidth is measured at several footprints (``Ceilings.bandwidths``: an op
   replayed on the same buffers runs from whatever cache its bytes fit in, ``Ceilings.hot``), the largest
   beyond every cache (``peak_bandwidth``: what a recomputation in a real step reads from); and every op
   costs at least one launch (``launch_seconds``: a one-element add called as the trace replays an op).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from labkit.env.profile import sizes
from labkit.env.sizes import MEASURE_SIZES, Sizes
from labkit.instruments.ops import OpRecord
from labkit.instruments.timing import benchmark

__all__ = ["Ceilings", "GPUSpec", "GPU_SPECS", "ELEMENTWISE_FLOPS", "RooflineError", "achieved", "flops",
           "intensity", "measure_ceilings", "measure_ceilings_by_dtype", "measure_host_bandwidth", "measure_launch", "moves_data",
           "offload_seconds", "random_draws", "TRANSCENDENTALS_PER_ELEMENT"]


class RooflineError(ValueError):
    """A value the roofline cannot use; the message names it and says what to pass instead."""

    def __init__(self, message: str) -> None:
        super().__init__(f"roofline: {message}")


@dataclass(frozen=True)
class Ceilings:
    """What a machine can do at most, per second (see Rule 1)."""

    device: str  # "cpu", "cuda:0", or a spec sheet's GPU name
    dtype: torch.dtype  # the dtype the ceilings hold for
    peak_flops: float  # FLOP/s of a large square matmul
    peak_bandwidth: float  # bytes/s read plus written by a copy far larger than any cache
    random_rate: float | None  # random draws/s of native_dropout; None: not a limit (spec sheets)
    special_rate: float | None = None  # transcendentals/s (exp, erf), the best op's; None: not a limit
    launch_seconds: float | None = None  # the least time any op takes, one launch (Rule 4); None: not known
    bandwidths: tuple[tuple[int, float], ...] = ()  # (bytes moved, bytes/s) of a copy replayed at that footprint

    def __post_init__(self) -> None:
        for name in ("peak_flops", "peak_bandwidth", "random_rate", "special_rate", "launch_seconds"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise RooflineError(f"Ceilings.{name}={value!r} must be a positive number of per-second units"
                                    if name != "launch_seconds" else
                                    f"Ceilings.launch_seconds={value!r} must be positive seconds or None")
        footprints = [nbytes for nbytes, _ in self.bandwidths]
        if footprints != sorted(set(footprints)) or any(not (n > 0 and bw > 0) for n, bw in self.bandwidths):
            raise RooflineError(f"Ceilings.bandwidths={self.bandwidths!r} must be (bytes, bytes/s) pairs, both "
                                "positive, in increasing bytes")

    def bandwidth_at(self, nbytes: float) -> float:
        """Bytes/s an op moving `nbytes` can reach replayed on the same buffers: that of the largest measured
        footprint not above `nbytes` (the smallest, below them all), or any larger one's where it is faster
        (a small copy timed by its launch is no bound on bytes); peak_bandwidth where none was measured."""
        if not self.bandwidths:
            return self.peak_bandwidth
        at = max([i for i, (n, _) in enumerate(self.bandwidths) if n <= nbytes], default=0)
        return max(bw for _, bw in self.bandwidths[at:])

    def hot(self, nbytes: float) -> Ceilings:
        """These ceilings as a replay of an op moving `nbytes` meets them: peak_bandwidth at its footprint."""
        return replace(self, peak_bandwidth=self.bandwidth_at(nbytes))

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the bandwidth roof meets the compute roof."""
        return self.peak_flops / self.peak_bandwidth


# FLOPs per output element (OpRecord.elements) for ops torch.utils.flop_counter counts as 0. ESTIMATES,
# counting a transcendental (exp, erf) as one FLOP; matmuls keep PyTorch's count. See Rule 2.
ELEMENTWISE_FLOPS: dict[str, float] = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "rsub": 1, "neg": 1, "where": 1,
    "masked_fill": 1,  # a select per element
    "_softmax": 5, "_log_softmax": 5,  # max, subtract, exp, sum, divide
    "native_layer_norm": 8,  # mean 1, variance 3 (subtract, square, add), normalise 2, affine 2
    "gelu": 5,  # x * 0.5 * (1 + erf(x / sqrt 2)): scale, erf, add, two multiplies
    "native_dropout": 1,  # output and mask count as elements: compare the draw (mask), scale (output)
    "clone": 1, "copy_": 1, "_to_copy": 1,  # a copy does no arithmetic: one per element places it on the axis
}
DEFAULT_ELEMENTWISE_FLOPS = 1.0  # any other op without a count

# Transcendentals per output element (see Rule 1): counts, not estimates; LayerNorm's rsqrt is one per row.
TRANSCENDENTALS_PER_ELEMENT: dict[str, float] = {"_softmax": 1, "_log_softmax": 1, "gelu": 1}

# Random draws per output element: native_dropout returns the output and its mask, one draw per pair.
DRAWS_PER_ELEMENT: dict[str, float] = {"native_dropout": 0.5}

def moves_data(record: OpRecord) -> bool:
    """True for an op that runs a kernel: not a view, and it creates a storage or writes one in place.

    `_unsafe_view` has no alias annotation in its schema, so the trace does not mark it a view, but it
    creates no storage: it is a view in all but name.
    """
    return not record.is_view and (record.output_bytes > 0 or record.in_place)


def _check_record(record: OpRecord, where: str) -> None:
    if not isinstance(record, OpRecord):
        raise RooflineError(f"{where}: expected an OpRecord (from labkit.instruments.ops.trace), got {type(record).__name__}")
    if not moves_data(record):
        raise RooflineError(f"{where}: {record.key} is a view (it moves no data) and has no place on a roofline; "
                            "keep only ops with roofline.moves_data(record)")


def flops(record: OpRecord) -> float:
    """The op's FLOPs: PyTorch's count, else the per-element estimate of ELEMENTWISE_FLOPS (Rule 2)."""
    _check_record(record, "flops")
    if record.flops > 0:
        return float(record.flops)
    return ELEMENTWISE_FLOPS.get(record.op, DEFAULT_ELEMENTWISE_FLOPS) * record.elements


def intensity(record: OpRecord) -> float:
    """FLOPs (with the elementwise estimates) per byte moved."""
    return flops(record) / record.bytes_moved


def random_draws(record: OpRecord) -> float:
    """Random numbers the op draws: 0 unless it is random (see DRAWS_PER_ELEMENT)."""
    return DRAWS_PER_ELEMENT.get(record.op, 1.0) * record.elements if record.random else 0.0


def achieved(record: OpRecord) -> float:
    """FLOP/s the op reached when timed: flops / measured seconds."""
    if record.seconds is None or not record.seconds > 0:
        raise RooflineError(f"achieved: {record.key} has seconds={record.seconds!r}; trace with time=True")
    return flops(record) / record.seconds


# ---------------------------------------------------------------- measuring the ceilings
def _peak_flops(device: torch.device, dtype: torch.dtype, sides: tuple[int, ...], repeats: int) -> float:
    best = 0.0
    for n in sides:
        a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
        seconds = benchmark(torch.mm, a, b, warmup=1, repeats=repeats, device=device).median
        best = max(best, 2 * n ** 3 / seconds)
    return best


FOOTPRINTS = 6  # the bandwidth is measured at the copy's size and at 1/4, 1/16, ... 1/1024 of it (Rule 4)
SPECIAL_SCALE = 16  # the transcendental rate is measured in cache and at this many times more elements
LAUNCH_OP = torch.ops.aten.add.Tensor  # a one-element add, called as the trace replays an op (OpOverload)


def _copy_bandwidth(device: torch.device, dtype: torch.dtype, nbytes: int, repeats: int) -> float:
    src = torch.ones(max(nbytes // dtype.itemsize, 1), device=device, dtype=dtype)
    dst = torch.empty_like(src)  # allocated once: a fresh output would add page faults on cpu
    seconds = benchmark(dst.copy_, src, warmup=1, repeats=repeats, device=device).median
    return 2 * src.nbytes / seconds  # read src, write dst


def _bandwidth(device: torch.device, dtype: torch.dtype, mib: int, repeats: int) -> tuple[tuple[int, float], ...]:
    """(bytes moved, bytes/s) of a copy of `mib` MiB and of 1/4, 1/16, ... of it, smallest first."""
    sizes = [mib * 2 ** 20 // 4 ** k for k in reversed(range(FOOTPRINTS))]
    return tuple((2 * n, _copy_bandwidth(device, dtype, n, repeats)) for n in sizes)


def _random_rate(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    x = torch.ones(n, device=device, dtype=dtype)
    seconds = benchmark(torch.native_dropout, x, 0.1, True, warmup=1, repeats=repeats, device=device).median
    return n / seconds


def _transcendental_ops(x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """The ops of TRANSCENDENTALS_PER_ELEMENT and exp itself, each one transcendental per element of `x`."""
    out = torch.empty_like(x)  # preallocated: exp's own cost, not the allocator's
    rows = x.view(-1, min(x.numel(), 1024))  # softmax runs along rows, as the block's does
    return {"exp": lambda: torch.exp(x, out=out), "softmax": lambda: torch.softmax(rows, -1),
            "gelu": lambda: torch.nn.functional.gelu(x)}


def _special_rate(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    """Transcendentals/s: the best of exp, softmax and GELU on `n` elements (in cache) and SPECIAL_SCALE x n."""
    best = 0.0
    for elements in (n, SPECIAL_SCALE * n):
        x = torch.ones(elements, device=device, dtype=dtype)
        for call in _transcendental_ops(x).values():
            best = max(best, elements / benchmark(call, warmup=1, repeats=repeats, device=device).median)
    return best


def measure_launch(device: str | torch.device = "cpu", repeats: int = 21) -> tuple[float, float]:
    """Seconds of one launch of a one-element add called as the trace replays an op: (timed alone, timed as
    `benchmark` times on `device`). On CUDA the first is one launch between two events (their latency with
    it), the second many back to back (as labkit.instruments.timing amortises them): the least a replayed op can take.
    On a CPU both are the clock around one call."""
    device = torch.device(device)
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    alone = benchmark(LAUNCH_OP, a, b, warmup=1, repeats=repeats, device=device, calls=1).median
    return alone, benchmark(LAUNCH_OP, a, b, warmup=1, repeats=repeats, device=device).median


def measure_ceilings(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                     size: Sizes | None = None) -> Ceilings:
    """Measure the ceilings of Rules 1 and 4 on `device` in `dtype`, at the profile's measuring sizes.

    peak_flops: 2n³ over the median time of an n×n matmul, best of a few n. peak_bandwidth: bytes read plus
    written by a copy between two preallocated buffers (256 MiB on the cpu profile, beyond the caches), and
    bandwidths: the same at smaller footprints. random_rate: elements per second native_dropout draws on a
    large tensor. On a GPU the generator is Philox, counter-based and parallel, and is rarely the limit; on a
    CPU it draws one number after another (about 14-20 ns each on a 2-core machine) and is the limit of every
    dropout. special_rate: transcendentals per second, the best of exp, softmax and GELU, on a tensor small
    enough to stay in cache and on a larger one. launch_seconds: measure_launch's, as benchmark times.
    """
    device = torch.device(device)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise RooflineError(f"measure_ceilings: dtype={dtype!r} must be a floating torch.dtype")
    size = size or sizes()
    sides, mib, draws, special = MEASURE_SIZES[size.name]
    repeats = min(size.repeats, 5)
    bandwidths = _bandwidth(device, dtype, mib, repeats)
    return Ceilings(str(device), dtype, _peak_flops(device, dtype, sides, repeats), bandwidths[-1][1],
                    _random_rate(device, dtype, draws, repeats), _special_rate(device, dtype, special, 2 * repeats + 1),
                    measure_launch(device, 2 * repeats + 1)[1], bandwidths)


@contextlib.contextmanager
def _tf32(on: bool) -> Iterator[None]:
    """torch.backends.cuda.matmul.allow_tf32 set to `on` inside, put back as it was after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def measure_ceilings_by_dtype(device: str | torch.device = "cpu", size: Sizes | None = None) -> dict[str, Ceilings]:
    """measure_ceilings in each precision a matmul can run in on `device`: "float32" and "bfloat16", and on CUDA
    "tf32" (float32 tensors multiplied on tensor cores, with allow_tf32 on; "float32" is measured with it off,
    and the setting is put back after). On a GPU the bfloat16 and TF32 peaks are its tensor cores'."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    with _tf32(False) if cuda else contextlib.nullcontext():
        found = {"float32": measure_ceilings(device, torch.float32, size)}
    found["bfloat16"] = measure_ceilings(device, torch.bfloat16, size)
    if cuda:
        with _tf32(True):
            found["tf32"] = measure_ceilings(device, torch.float32, size)
    return found


# ---------------------------------------------------------------- spec sheets (Rule 3)
@dataclass(frozen=True)
class GPUSpec:
    """A GPU's ceilings as its vendor's datasheet states them: a prediction's input, never a measurement."""

    name: str
    peak_flops: float  # dense tensor-core FLOP/s in `dtype`; the datasheets' "with sparsity" figure halved
    dtype: torch.dtype  # what peak_flops is for: bfloat16, or float16 on a card without bfloat16 tensor cores
    peak_bandwidth: float  # memory bandwidth, bytes/s
    source: str  # the datasheet it is read from
    host_bandwidth: float = 0.0  # host link, bytes/s each way: the datasheet's bidirectional PCIe figure halved
    float32_flops: float = 0.0  # FP32 FLOP/s of its CUDA cores (no tensor cores), from the same datasheet

    def ceilings(self) -> Ceilings:
        """These figures as Ceilings in their dtype (random draws: not a limit, see measure_ceilings)."""
        return Ceilings(self.name, self.dtype, self.peak_flops, self.peak_bandwidth, None)

    def float32_ceilings(self) -> Ceilings:
        """The same card multiplying float32 on its CUDA cores: float32_flops, the same memory bandwidth."""
        if not self.float32_flops > 0:
            raise RooflineError(f"GPUSpec {self.name!r}: no float32 FLOP/s given (float32_flops)")
        return Ceilings(self.name, torch.float32, self.float32_flops, self.peak_bandwidth, None)


GPU_SPECS: dict[str, GPUSpec] = {
    # NVIDIA T4 Tensor Core GPU datasheet: mixed precision (FP16/FP32) 65 TFLOPS (Turing: no sparsity, and no
    # bfloat16 tensor cores: the figure is float16's), 320 GB/s; single precision (FP32) 8.1 TFLOPS
    # host link: "x16 PCIe Gen3", 32 GB/s both ways together (PCIe 3.0 x16: 15.75 GB/s each way)
    "T4": GPUSpec("T4", 65e12, torch.float16, 320e9, "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/"
                  "en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf", 16e9, 8.1e12),
    # NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 tensor 312 TFLOPS (624 with sparsity); 80GB SXM 2,039 GB/s;
    # FP32 19.5 TFLOPS
    "A100": GPUSpec("A100 SXM 80GB", 312e12, torch.bfloat16, 2039e9, "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/"
                    "content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
                    32e9, 19.5e12),  # "PCIe Gen4: 64GB/s" (both ways together)
    # NVIDIA H100 Tensor Core GPU datasheet: BF16/FP16 tensor 1,979 TFLOPS with sparsity (989 dense); SXM 3.35 TB/s;
    # FP32 67 TFLOPS (SXM)
    "H100": GPUSpec("H100 SXM", 989e12, torch.bfloat16, 3.35e12, "NVIDIA H100 Tensor Core GPU datasheet, "
                    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet", 64e9,  # "PCIe Gen5: 128GB/s"
                    67e12),
    # NVIDIA H200 Tensor Core GPU datasheet: BF16/FP16 tensor 1,979 TFLOPS with sparsity (989 dense); SXM 4.8 TB/s;
    # FP32 67 TFLOPS (SXM)
    "H200": GPUSpec("H200 SXM", 989e12, torch.bfloat16, 4.8e12, "NVIDIA H200 Tensor Core GPU datasheet, "
                    "https://www.nvidia.com/en-us/data-center/h200/", 64e9, 67e12),  # "PCIe Gen5: 128GB/s"
}


# ---------------------------------------------------------------- offload against recompute
def offload_seconds(nbytes: int, host_bandwidth: float) -> float:
    """Seconds to copy `nbytes` to host memory in forward and back in backward, at `host_bandwidth` bytes/s."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise RooflineError(f"offload_seconds: nbytes={nbytes!r} must be an int >= 0")
    if not host_bandwidth > 0:
        raise RooflineError(f"offload_seconds: host_bandwidth={host_bandwidth!r} must be positive bytes/s; "
                            "measure it with measure_host_bandwidth('cuda')")
    return 2 * nbytes / host_bandwidth


def measure_host_bandwidth(device: str | torch.device = "cuda", mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a round trip device -> pinned host -> device: 2 × bytes over the median time."""
    device = torch.device(device)
    if device.type != "cuda":
        raise RooflineError(f"measure_host_bandwidth: device={str(device)!r} is host memory already; offloading "
                            "from host memory to host memory is moot. Pass a CUDA device.")
    if not torch.cuda.is_available():
        raise RooflineError("measure_host_bandwidth: torch sees no CUDA device")
    src = torch.ones(mib * 2 ** 20, dtype=torch.uint8, device=device)
    host = torch.empty(src.shape, dtype=torch.uint8, pin_memory=True)

    def round_trip() -> None:
        host.copy_(src, non_blocking=True)
        src.copy_(host, non_blocking=True)

    return 2 * src.nbytes / benchmark(round_trip, warmup=1, repeats=repeats, device=device).median
