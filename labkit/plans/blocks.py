"""Lab 07's plan for a memory budget: what each block costs, what a plan predicts, and the plan applied.

A *profile* says, for each block of a model, what running it each way costs: bytes it keeps from its forward
until its backward, bytes alive while its backward runs, and the seconds it adds to a step. The ways:

- ``keep``: run plainly; it keeps everything it saves (``act``, its input included);
- ``selective``: core attention recomputed (lab 04's policy, PyTorch's selective checkpoint API);
- ``offload``: on a GPU, saved tensors moved to pinned host memory in forward and back in backward (its input
  counted as kept on the device all the same: a selective block before it keeps that tensor);
- ``recompute``: a *segment* of blocks [start, stop) under one checkpoint (lab 02's ``checkpoint_hooks``): it
  keeps the first block's input, and backward rebuilds all its blocks' activations at once.

A *plan* is a list of ``Step(start, stop, how)`` covering the blocks in order. ``peak_of`` predicts its peak the
way lab 03's did, per block, with the two moments a step's peak can fall at:

- the top of the step, between the blocks' forward and their backward: every byte the blocks keep, plus ``base``
  (everything else then: parameters, the optimizer's state, the embedding's and the head's activations, the
  logits and their gradient);
- a block's backward: what the blocks before it keep, what it holds (a segment: its blocks' act, rebuilt at
  once, then freed block by block from the last), plus the block's ``beside`` (everything else then:
  parameters, the optimizer's state, the gradients made so far, its own and every later block's included, the
  gradient flowing back).

Nothing falls below ``floor``, the peak of the moments no plan changes: the optimizer step, and what comes before
the blocks (an embedding, say) running its forward or, after theirs, its backward.

``profile_model`` measures a profile (labkit's meter, ledger and stopwatch, lab 04's op trace); ``applied`` runs
a plan for real; ``largest_batch`` finds by bisection, measuring, the largest batch whose step fits a budget.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from labkit.instruments.harness import blocks_of
from labkit.instruments.ledger import Ledger
from labkit.instruments.meter import MemoryMeter
from labkit.instruments.ops import trace
from labkit.instruments.tensors import cuda_devices, inputs_of, tensor_storages
from labkit.instruments.timing import benchmark, compare

__all__ = ["KEEP", "SELECTIVE", "OFFLOAD", "RECOMPUTE", "Option", "BlockCosts", "Profile", "Step", "check_plan",
           "peak_of", "seconds_of", "step_ratio", "scheme_plan", "SCHEMES", "profile_model", "applied",
           "measure_step", "largest_batch", "describe"]

KEEP, SELECTIVE, OFFLOAD, RECOMPUTE = "keep", "selective", "offload", "recompute"
SCHEMES = ("none", "full", "sqrt_n", "selective")  # the fixed schemes of labs 02-04, as plans


def _check_bytes(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what}={value!r} must be a whole number of bytes, 0 or more")


def _check_seconds(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise ValueError(f"{what}={value!r} must be a finite number of seconds, 0 or more")


@dataclass(frozen=True)
class Option:
    """One way to run a single block: the bytes it keeps from its forward until its backward, the bytes alive
    while its backward runs (what it keeps and what it rebuilds: at least `kept`), the seconds it adds."""

    kept: int
    held: int
    seconds: float

    def __post_init__(self) -> None:
        _check_bytes(self.kept, "Option: kept")
        _check_bytes(self.held, "Option: held")
        _check_seconds(self.seconds, "Option: seconds")
        if self.held < self.kept:
            raise ValueError(f"Option: held={self.held:,} B is less than kept={self.kept:,} B; backward holds at "
                             "least what forward kept")


@dataclass(frozen=True)
class BlockCosts:
    """What a plan knows of one block: its saved bytes, its input's, its forward's seconds, and its other ways."""

    act: int  # bytes the block saves when run plainly, its input included
    inp: int  # bytes of its input: what a recomputed segment starting at this block keeps
    fwd: float  # seconds of its forward recording a graph: what recomputing it costs
    options: Mapping[str, Option] = field(default_factory=dict)  # its single-block ways besides keep
    beside: int = 0  # bytes alive beside the blocks' activations while its backward runs (see the module's doc)

    def __post_init__(self) -> None:
        _check_bytes(self.act, "BlockCosts: act")
        _check_bytes(self.beside, "BlockCosts: beside")
        _check_bytes(self.inp, "BlockCosts: inp")
        _check_seconds(self.fwd, "BlockCosts: fwd")
        for name, o in self.options.items():
            if name in (KEEP, RECOMPUTE) or not isinstance(o, Option):
                raise ValueError(f"BlockCosts: options[{name!r}] must be an Option named other than "
                                 f"{KEEP!r} and {RECOMPUTE!r} (those two every block has)")

    def ways(self) -> dict[str, Option]:
        """Every single-block way, keep first."""
        return {KEEP: Option(self.act, self.act, 0.0), **self.options}


@dataclass(frozen=True)
class Profile:
    """A model's blocks' costs, and what no plan changes."""

    blocks: tuple[BlockCosts, ...]
    base: int  # bytes beside what the blocks keep at the step's top, between their forward and their backward
    floor: int  # the peak of the moments no plan changes (the optimizer step's, say): no plan goes below it
    step: float  # seconds of the plain step

    def __post_init__(self) -> None:
        if not isinstance(self.blocks, tuple) or not self.blocks or \
                not all(isinstance(b, BlockCosts) for b in self.blocks):
            raise ValueError(f"Profile: blocks must be a non-empty tuple of BlockCosts, got {self.blocks!r:.80}")
        _check_bytes(self.base, "Profile: base")
        _check_bytes(self.floor, "Profile: floor")
        _check_seconds(self.step, "Profile: step")
        if self.step <= 0:
            raise ValueError(f"Profile: step={self.step!r} seconds must be more than 0")


@dataclass(frozen=True)
class Step:
    """Blocks [start, stop) run one way: `how` is "recompute" (one segment) or a block's way (one block)."""

    start: int
    stop: int
    how: str


def check_plan(plan: object, profile: Profile) -> list[Step]:
    """The plan as a list, or a ValueError naming what is wrong: the steps must cover the blocks in order, each
    non-empty; a way other than recompute covers one block, and that block must have it."""
    n = len(profile.blocks)
    if not isinstance(plan, (list, tuple)) or not all(isinstance(s, Step) for s in plan):
        raise ValueError(f"a plan must be a list of Step, got {plan!r:.100}")
    at = 0
    for s in plan:
        if s.start != at or s.stop <= s.start or s.stop > n:
            raise ValueError(f"plan: {s} does not continue at block {at} (the steps must cover blocks 0..{n} in "
                             "order, each non-empty)")
        if s.how != RECOMPUTE and (s.stop != s.start + 1 or s.how not in profile.blocks[s.start].ways()):
            raise ValueError(f"plan: {s}: {s.how!r} runs one block that has it; block {s.start} has "
                             f"{', '.join([*profile.blocks[s.start].ways(), RECOMPUTE])}")
        at = s.stop
    if at != n:
        raise ValueError(f"plan: the steps stop at block {at}, not at the last block's end ({n})")
    return list(plan)


def _costs(s: Step, profile: Profile) -> tuple[int, int, float]:
    """(kept, need, seconds) of one step of a plan: need is the most its backward has alive besides what the
    steps before it keep (a segment's backward runs its blocks' from the last, each freeing its act)."""
    blocks = profile.blocks[s.start:s.stop]
    if s.how == RECOMPUTE:
        rebuilt, need = 0, 0
        for b in blocks:
            rebuilt += b.act
            need = max(need, rebuilt + b.beside)
        return blocks[0].inp, need, sum(b.fwd for b in blocks)
    o = blocks[0].ways()[s.how]
    return o.kept, o.held + blocks[0].beside, o.seconds


def peak_of(plan: Sequence[Step], profile: Profile) -> int:
    """Predicted peak bytes of a step under the plan (see the module's doc)."""
    kept, worst = 0, 0  # bytes the steps so far keep; the worst backward so far
    for s in check_plan(plan, profile):
        kept_here, need, _ = _costs(s, profile)
        worst = max(worst, kept + need)  # its backward: what the blocks before it keep, and what it needs
        kept += kept_here
    return max(profile.floor, profile.base + kept, worst)


def seconds_of(plan: Sequence[Step], profile: Profile) -> float:
    """Predicted seconds the plan adds to a step."""
    return sum(_costs(s, profile)[2] for s in check_plan(plan, profile))


def step_ratio(plan: Sequence[Step], profile: Profile) -> float:
    """Predicted step time under the plan over the plain step's."""
    return 1 + seconds_of(plan, profile) / profile.step


def scheme_plan(name: str, n: int) -> list[Step]:
    """A fixed scheme as a plan of n blocks: none (keep all), full (each block its own segment), sqrt_n
    (round(sqrt(n)) segments of n // k blocks, the last plain, as checkpoint_sequential), selective."""
    if name == "none":
        return [Step(i, i + 1, KEEP) for i in range(n)]
    if name == "full":
        return [Step(i, i + 1, RECOMPUTE) for i in range(n)]
    if name == "selective":
        return [Step(i, i + 1, SELECTIVE) for i in range(n)]
    if name == "sqrt_n":
        k = max(1, round(math.sqrt(n)))
        size = n // k
        segments = [Step(i * size, (i + 1) * size, RECOMPUTE) for i in range(k - 1)]
        return segments + [Step(i, i + 1, KEEP) for i in range((k - 1) * size, n)]
    raise ValueError(f"scheme_plan: {name!r} is not a scheme; choose one of {', '.join(SCHEMES)}")


def describe(plan: Sequence[Step]) -> str:
    """A plan in one line: "keep 0-1 | recompute 2-3" (block ranges, inclusive)."""
    parts: list[tuple[str, int, int]] = []
    for s in plan:
        if parts and parts[-1][0] == s.how and s.how != RECOMPUTE and parts[-1][2] == s.start:
            parts[-1] = (s.how, parts[-1][1], s.stop)
        else:
            parts.append((s.how, s.start, s.stop))
    return " | ".join(f"{how} {a}" + (f"-{b - 1}" if b - 1 > a else "") for how, a, b in parts)


# ---------------------------------------------------------------- measuring a profile
def _nbytes(*trees: Any) -> int:
    return sum(st.nbytes() for st in tensor_storages(*trees))


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                loss_fn: Callable[[Any], torch.Tensor]) -> Callable[[], None]:
    def run() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x)).backward()
        opt.step()
    return run


def _forward_seconds(module: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of the module's forward recording a graph, as a recomputation runs it."""
    def run() -> None:
        with torch.enable_grad():
            module(x.detach().requires_grad_(x.is_floating_point()))
    return benchmark(run, warmup=1, repeats=repeats).median


def _selective(keep: frozenset[str]) -> Callable[..., Any]:
    """Lab 04's policy as PyTorch's selective checkpoint of a block: wrap(block, x)."""
    from labkit.labs.selective import torch_policy  # lab 04

    context_fn = torch_policy(keep)
    return lambda block, x: torch_checkpoint(block, x, use_reentrant=False, context_fn=context_fn)


def _offloaded(block: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
    """block(x) with its saved tensors moved to (pinned, from a GPU) host memory and back in backward: offload."""
    with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
        return block(x)


def _extra_seconds(block: nn.Module, x: torch.Tensor, wrap: Callable[..., Any], repeats: int) -> float:
    """Median seconds a forward and backward of `block` take longer under wrap(block, x) than plainly (alternating
    runs): what the way costs, its bookkeeping included."""
    def step(run: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def go() -> None:
            run(x.detach().requires_grad_()).float().sum().backward()
        return go
    c = compare(step(block), step(lambda h: wrap(block, h)), repeats=repeats, warmup=1, device=x.device)
    return max(0.0, (c.ratio - 1) * c.a.median)


def _extra_held(block: nn.Module, x: torch.Tensor, wrap: Callable[..., Any]) -> int:
    """Bytes more that a forward and backward of `block` has alive at its peak under wrap(block, x) than plainly
    (the meter, on x's device, each from no gradients and the same random draws): what the way rebuilds or
    stages beyond what the block holds plainly. PyTorch's selective checkpoint, for one, runs the whole forward
    again in backward, and the outputs it recomputes meet the ones it kept."""
    def peak(run: Callable[[torch.Tensor], torch.Tensor]) -> int:
        for p in block.parameters():
            p.grad = None
        with torch.random.fork_rng(devices=cuda_devices(x)), MemoryMeter(device=x.device) as meter:
            run(x.detach().requires_grad_()).float().sum().backward()
        return meter.peak
    return max(0, peak(lambda h: wrap(block, h)) - peak(block))


def _h2d_seconds_per_byte(device: torch.device) -> float:
    """Seconds per byte of a device -> pinned host -> device round trip (offload's price), measured."""
    t = torch.empty(16 * 2**20, dtype=torch.uint8, device=device)
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)

    def run() -> None:
        host.copy_(t, non_blocking=True)
        t.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
    return benchmark(run, warmup=1, repeats=5).median / t.numel()


def profile_model(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor], *,
                  repeats: int = 3, seconds_from: Profile | None = None) -> Profile:
    """Measure a copy of `model` (GPT blocks with `attn.core`, or any blocks: then no selective way) training
    on `x` with Adam and loss_fn(output). `model` and the random generators are left as they were.

    act: the ledger's saved bytes under each block; inp: its input's bytes; fwd: its forward's median
    seconds. selective: keeps the input and, by lab 04's trace, every op output outside core attention
    (``selective_keep``, ``kept_bytes``); while its backward runs it holds act and what PyTorch's selective
    checkpoint has alive beyond a plain backward (the meter, on the block alone); costs what a forward and
    backward of the block take longer under that checkpoint than plainly (alternating runs: the recomputation
    and the policy's bookkeeping). offload (CUDA only): keeps its input's bytes on the device (a selective block
    before it keeps its output there), holds act and what it stages, costs a round trip of act at the measured
    device-host speed. beside, base and floor: the meter's timeline of a steady step (``_moments``), its peak
    while each block's backward runs less the blocks' activations alive then; its peak from the blocks' forward
    to their backward less all of them; its peak where no plan changes anything (the optimizer step, what comes
    before the blocks); step: that step's median seconds. seconds_from:
    take every time from that profile (of the same model at another batch) instead of measuring: bytes only,
    much faster.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"profile_model: model must be an nn.Module, got {type(model).__name__}")
    n = len(blocks_of(model))  # a model without blocks is refused before anything runs
    if seconds_from is not None and len(seconds_from.blocks) != n:
        raise ValueError(f"profile_model: seconds_from has {len(seconds_from.blocks)} blocks, the model {n}")
    with torch.random.fork_rng(devices=cuda_devices(x, model)):  # dropout draws: put back
        return _profile(copy.deepcopy(model), x, loss_fn, repeats, seconds_from)


def _profile(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor], repeats: int,
             seconds_from: Profile | None) -> Profile:
    from labkit.labs.selective import kept_bytes  # lab 04's cost model

    for p in model.parameters():
        p.grad = None
    opt = torch.optim.Adam(model.parameters())
    step = _train_step(model, opt, x, loss_fn)
    step()  # gradients and Adam's state exist from here on
    windows, top, fixed = _moments(model, opt, x, step)
    if seconds_from is None:
        t_step = benchmark(step, warmup=0, repeats=repeats).median
    else:
        t_step = seconds_from.step
    with Ledger(model=model) as ledger:
        loss_fn(model(x)).backward()
    opt.zero_grad(set_to_none=True)
    saved = ledger.by_module()
    blocks = blocks_of(model)
    under = lambda fqn: sum(b for m, b in saved.items() if m == fqn or m.startswith(fqn + "."))  # noqa: E731
    act = [under(fqn) for fqn, _ in blocks]
    ins = [args[0] for args in inputs_of([m for _, m in blocks], lambda: model(x))]
    per_byte = _h2d_seconds_per_byte(x.device) if x.is_cuda and seconds_from is None else None
    if x.is_cuda and seconds_from is not None:
        per_byte = 0.0  # offload's seconds come from seconds_from
    costs = []
    for i, ((fqn, block), a, h) in enumerate(zip(blocks, act, ins)):
        given = None if seconds_from is None else seconds_from.blocks[i]
        options: dict[str, Option] = {}
        core = getattr(getattr(block, "attn", None), "core", None)
        if isinstance(core, nn.Module):
            ops = trace(block, h.requires_grad_(), model=block, time=False)
            keep = _selective_keep(block, h)  # as `applied` will run it (and checked against lab 04's rule)
            kept = min(a, _nbytes(h) + kept_bytes(ops, keep))
            wrap = _selective(keep)
            t = _extra_seconds(block, h, wrap, repeats) if given is None else given.options[SELECTIVE].seconds
            options[SELECTIVE] = Option(kept, a + _extra_held(block, h, wrap), t)
        if per_byte is not None:  # its input may stay on the device: a selective block before it keeps its output
            t = a * per_byte if given is None else given.options[OFFLOAD].seconds
            options[OFFLOAD] = Option(_nbytes(h), a + _extra_held(block, h, _offloaded), t)
        fwd = _forward_seconds(block, h, repeats) if given is None else given.fwd
        costs.append(BlockCosts(a, _nbytes(h), fwd, options))
    # beside each block's backward, and beside everything kept at the top: the measured peaks less the blocks'
    # activations alive then (plainly, block i's backward runs while blocks 0..i keep theirs)
    beside = [max(0, w - sum(act[:i + 1])) for i, w in enumerate(windows)]
    costs = [dataclasses.replace(c, beside=b) for c, b in zip(costs, beside)]
    return Profile(tuple(costs), max(0, top - sum(act)), fixed, t_step)


def _moments(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
             step: Callable[[], None]) -> tuple[list[int], int, int]:
    """The meter's peaks of one steady step: while each block's backward runs (a ValueError where they cannot be
    told apart: counting them as one would under-count), at the step's top (the blocks' forward, what follows
    them, and its backward), and at the moments no plan changes (the optimizer step; before the blocks' forward;
    after their backward, when what comes before them runs its backward).

    Block i's backward runs from the gradient of its output to the gradient of its input: tensor hooks mark both
    on the meter's timeline (block 0's input may need none: then it runs until backward ends), and a forward
    pre-hook marks where block 0's forward starts. Whatever runs between two blocks' backwards (a module between
    them) counts with the block before it, as if that block held all its activations then (never optimistic)."""
    blocks = [m for _, m in blocks_of(model)]
    marks: dict[tuple[str, int], int] = {}

    def mark(key: tuple[str, int]) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            marks.setdefault(key, len(meter.timeline))
        return hook

    def on_forward(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            for key, t in ((("out", i), out), (("in", i), args[0] if args else None)):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(mark(key))
        return hook

    with contextlib.ExitStack() as stack:
        stack.callback(blocks[0].register_forward_pre_hook(mark(("forward", 0))).remove)
        for i, b in enumerate(blocks):
            stack.callback(b.register_forward_hook(on_forward(i)).remove)
        with MemoryMeter(model, opt, x, device=x.device, history=True) as meter:
            step()
    timeline = meter.timeline
    end = next((e.index + 1 for e in reversed(timeline) if e.phase != "optimizer"), 0)  # forward and backward
    n = len(blocks)
    starts = [marks.get(("out", i)) for i in range(n)]
    stops = [marks.get(("in", i)) for i in range(n)]
    if stops[0] is None:
        stops[0] = end
    first = marks.get(("forward", 0), 0)
    peak = lambda a, b: max((e.live_bytes for e in timeline[a:b] if e.phase != "optimizer"), default=0)  # noqa: E731
    fixed = max(meter.phase_peaks.get("optimizer", 0), peak(0, first), peak(stops[0], end))
    missing = [i for i in range(n) if starts[i] is None or stops[i] is None]
    if missing or any(a > b for a, b in zip(starts, stops)) or any(starts[i] < stops[i + 1] for i in range(n - 1)):
        what = f"no gradient reached block {missing[0]}'s output" if missing else "the blocks' backwards overlap"
        raise ValueError(f"profile_model: cannot tell the blocks' backwards apart ({what}); a plan needs blocks that "
                         "each take one tensor and return one, each called once per step, in order")
    windows = [peak(stops[i + 1] if i + 1 < n else starts[i], stops[i]) for i in range(n)]
    return windows, peak(first, starts[-1]), fixed


# ---------------------------------------------------------------- running a plan
_POLICIES: dict[tuple[Any, ...], frozenset[str]] = {}  # (a kind of block, its input) -> lab 04's selective keep


def _selective_keep(block: nn.Module, x: torch.Tensor, forward: Callable[..., Any] | None = None) -> frozenset[str]:
    """Lab 04's selective policy (every op output outside core attention kept) for `block` on input `x`, from a
    trace of forward(x) (default the block's own; inside `applied`, the one it replaced): op keys count calls,
    and which ops run can depend on the shapes, so the trace takes x's shape; once per kind of block (class,
    parameters, mode) and input, so that entering `applied` stays cheap. A policy that would keep a random op
    before a recomputed one is refused: PyTorch's selective checkpoint would then compute wrong gradients
    without an error (lab 04)."""
    from labkit.labs.selective import random_ok, selective_keep  # lab 04

    key = (type(block), block.training, tuple(x.shape), x.dtype, x.device,
           *((n, tuple(p.shape), p.dtype, p.device) for n, p in block.named_parameters()))
    if key not in _POLICIES:
        ops = trace(forward or block, x.detach().requires_grad_(x.is_floating_point()), model=block, time=False)
        keep = selective_keep(ops)
        if not random_ok(ops, keep):
            raise ValueError(f"applied: the selective policy for {type(block).__name__} keeps a random op that a "
                             "recomputed one follows; PyTorch's selective checkpoint would be silently wrong")
        _POLICIES[key] = keep
    return _POLICIES[key]


@contextlib.contextmanager
def applied(model: nn.Module, plan: Sequence[Step]) -> Iterator[None]:
    """While inside, calling `model` runs its blocks as the plan says: recompute segments under lab 02's
    checkpoint_hooks, selective under PyTorch's checkpoint with lab 04's policy (core attention recomputed),
    offload under torch.autograd.graph.save_on_cpu; keep plainly. Every block's forward is restored after."""
    from labkit.labs.recompute import checkpoint_hooks  # lab 02
    from labkit.labs.sqrt_n import run_layers  # lab 03: one function of a chain's layers
    from labkit.labs.selective import torch_policy  # lab 04

    blocks = [m for _, m in blocks_of(model)]
    n = len(blocks)
    check_plan(plan, Profile(tuple(BlockCosts(0, 0, 0.0, {SELECTIVE: Option(0, 0, 0.0), OFFLOAD: Option(0, 0, 0.0)})
                                   for _ in range(n)), 0, 0, 1.0))
    forwards = [b.forward for b in blocks]
    patched: dict[int, Callable[..., Any]] = {}
    for s in plan:
        f = forwards[s.start]
        if s.how == RECOMPUTE:
            run = run_layers(forwards[s.start:s.stop])
            patched[s.start] = lambda h, run=run: checkpoint_hooks(run, h)
            for i in range(s.start + 1, s.stop):
                patched[i] = lambda h: h  # run by the segment's checkpoint
        elif s.how == SELECTIVE:
            def selective(h: torch.Tensor, f: Callable[..., Any] = f, block: nn.Module = blocks[s.start]) -> Any:
                context_fn = torch_policy(_selective_keep(block, h, f))
                return torch_checkpoint(f, h, use_reentrant=False, context_fn=context_fn)
            patched[s.start] = selective
        elif s.how == OFFLOAD:
            patched[s.start] = lambda h, f=f: _offloaded(f, h)
    before = {i: vars(blocks[i]).get("forward") for i in patched}  # a forward patched already (None: the class's)
    for i, fn in patched.items():
        blocks[i].forward = fn
    try:
        yield
    finally:
        for i, old in before.items():
            if old is None:
                del blocks[i].forward  # the instance attribute goes; the class's forward shows again
            else:
                blocks[i].forward = old


def measure_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                 loss_fn: Callable[[Any], torch.Tensor], plan: Sequence[Step] | None = None) -> int:
    """Peak bytes on x's device (the meter) of one steady training step of `model` on `x` under `plan` (None:
    plainly): two steps train the model (drawing from the global generator for dropout), the first making the
    gradients and the optimizer's state, the second measured."""
    with applied(model, plan) if plan is not None else contextlib.nullcontext():
        step = _train_step(model, opt, x, loss_fn)
        step()
        with MemoryMeter(model, opt, x, device=x.device) as meter:  # the device's bytes: offload moves some out
            step()
    return meter.peak


def largest_batch(fits: Callable[[int], bool], start: int = 1, most: int = 2**16) -> int:
    """The largest batch b in [1, most] with fits(b), 0 if none: from `start`, doubling while it fits, then
    bisection (or bisection below `start` when start does not fit). Fitting is assumed monotone: a larger batch
    never needs less memory."""
    for name, value in (("start", start), ("most", most)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"largest_batch: {name}={value!r} must be an int >= 1")
    start = min(start, most)
    if fits(start):
        low, high = start, None  # fits(low); high: the least batch known not to fit
        while high is None:
            nxt = min(low * 2, most)
            if nxt == low:
                return low
            low, high = (nxt, None) if fits(nxt) else (low, nxt)
    else:
        low, high = 0, start  # 0: nothing known to fit yet
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
