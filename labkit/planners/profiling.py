"""Lab 07's profile of a model: what each of its blocks costs each way, measured (labkit.plans.plan says what
the figures mean and how a plan's peak is predicted from them).

The bytes are the ledger's and the meter's, the times medians on the model's device; lab 04's trace and policy
(labkit.labs.selective) say what a selective block keeps.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from labkit.instruments.blocks import block_calls, blocks_of
from labkit.instruments.meter import MemoryMeter
from labkit.instruments.roofline import measure_host_bandwidth
from labkit.instruments.tensors import cuda_devices, tensor_storages
from labkit.instruments.timing import compare
from labkit.planners.applying import applied
from labkit.planners.measuring import (
    forward_seconds, nbytes, saved_by, saved_under, step_seconds, train_step, working_copy,
)
from labkit.planners.ways import offloaded, policy_of, selective, traced
from labkit.plans.plan import OFFLOAD, SELECTIVE, BlockCosts, Option, Profile, scheme_plan

__all__ = ["profile_model"]


def profile_model(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor], *,
                  repeats: int = 3, seconds_from: Profile | None = None, blocks: Any = None) -> Profile:
    """Measure a copy of `model` (GPT blocks with `attn.core`, or any blocks: then no selective way) training
    on `x` with Adam and loss_fn(output). `model` and the random generators are left as they were. blocks: the
    model's blocks where they are not its `blocks` or `layers` (labkit.instruments.blocks.blocks_of: the list, or
    its path, such as "model.layers"); each is called with its hidden state first, and may take other arguments
    that need no gradient (a Hugging Face block's mask and rotary tables), the same at every step.

    act: the ledger's saved bytes under each block; inp: its input's bytes; fwd: its forward's median
    seconds. selective: keeps the input and, by lab 04's trace, every op output outside core attention
    (``policy_of``, ``kept_bytes``); while its backward runs it holds act and what PyTorch's selective
    checkpoint has alive beyond a plain backward (the meter, on the block alone); costs what a forward and
    backward of the block take longer under that checkpoint than plainly (alternating runs: the recomputation
    and the policy's bookkeeping); offered (BlockCosts.ways) only where it keeps no more than act, which with
    attention that saves no scores (F.scaled_dot_product_attention) it can exceed; a block without `attn.core`, or
    called with more than its hidden state, has none and says why (BlockCosts.not_offered). offload (CUDA only): keeps its input's bytes on the device (a selective block
    before it keeps its output there), holds act and what it stages, costs a round trip of act at the measured
    device-host speed. beside, base and floor: the meter's timeline of a steady step (``_moments``), its peak
    while each block's backward runs less the blocks' activations alive then (or, where more, that less its
    act and the inputs before it, in a step under full recomputation: its rebuild); its peak from the blocks' forward
    to their backward less all of them; its peak where no plan changes anything (the optimizer step, what comes
    before the blocks); step: that step's median seconds. seconds_from:
    take every time from that profile (of the same model at another batch) instead of measuring: bytes only,
    much faster. It runs one step under full recomputation too (as `applied` does: lab 02's checkpoint_hooks on
    lab 03's run_layers), so in a handed-out kit it needs those two exercises done.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"profile_model: model must be an nn.Module, got {type(model).__name__}")
    n = len(blocks_of(model, blocks))  # a model without blocks is refused before anything runs
    if seconds_from is not None and len(seconds_from.blocks) != n:
        raise ValueError(f"profile_model: seconds_from has {len(seconds_from.blocks)} blocks, the model {n}")
    if isinstance(blocks, (list, tuple, nn.ModuleList, nn.Sequential)):  # the copy's own blocks, at the same places
        paths = {id(m): fqn for fqn, m in model.named_modules()}
        blocks = [paths.get(id(m), "") for m in blocks]
    with working_copy(model, x) as work:
        if isinstance(blocks, list):
            blocks = [work.get_submodule(p) for p in blocks]
        return _profile(work, x, loss_fn, repeats, seconds_from, blocks)


def _profile(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor], repeats: int,
             seconds_from: Profile | None, given: Any) -> Profile:
    from labkit.labs.selective import kept_bytes  # lab 04's cost model

    opt = torch.optim.Adam(model.parameters())
    step = train_step(model, opt, x, loss_fn)
    step()  # gradients and Adam's state exist from here on
    calls = block_calls(model, lambda: model(x), "profile_model", given)  # each block h, ... -> h, or refused
    windows, top, fixed = _moments(model, opt, x, step, given)
    with applied(model, scheme_plan("full", len(calls)), blocks=given):  # each block's rebuild, fully recomputed
        rebuilds, _, _ = _moments(model, opt, x, train_step(model, opt, x, loss_fn), given)
    t_step = step_seconds(step, x.device, repeats, warmup=0) if seconds_from is None else seconds_from.step
    saved, _ = saved_by(model, x, loss_fn)
    blocks = blocks_of(model, given)
    kept_after = _saved_later(model, x, [m for _, m in blocks])
    act = [saved_under(saved, fqn) for fqn, _ in blocks]
    # offload's price: a device -> pinned host -> device round trip per byte, measured
    per_byte = 2 / measure_host_bandwidth(x.device, mib=16) if x.is_cuda and seconds_from is None else None
    if x.is_cuda and seconds_from is not None:
        per_byte = 0.0  # offload's seconds come from seconds_from
    costs = []
    for i, ((fqn, block), a, call) in enumerate(zip(blocks, act, calls)):
        timed = None if seconds_from is None else seconds_from.blocks[i]
        options: dict[str, Option] = {}
        h, run = call.h, call.bind(block)  # run: the block as a function of its hidden state
        core = getattr(getattr(block, "attn", None), "core", None)
        unknown = _selective_unknown(core, run is block, timed)
        if not unknown:
            ops = traced(block, h)
            keep = policy_of(ops, block, "profile_model")  # as `applied` traces it (lab 04's rule checked)
            kept = nbytes(h) + kept_bytes(ops, keep)  # what the policy caches, beyond what a plain block saves too
            if not kept_after[i]:  # lab 04 prices the block's output at 0: what comes after keeps it; here nothing does
                kept += sum(r.output_bytes for r in ops if r.is_output and r.key in keep)
            wrap = selective(keep, [r.key for r in ops], "profile_model")
            t = _extra_seconds(block, h, wrap, repeats) if timed is None else timed.options[SELECTIVE].seconds
            options[SELECTIVE] = Option(kept, max(kept, a + _extra_held(block, h, wrap)), t)
        if per_byte is not None:  # its input may stay on the device: a selective block before it keeps its output
            t = a * per_byte if timed is None else timed.options[OFFLOAD].seconds
            options[OFFLOAD] = Option(nbytes(h), a + _extra_held(block, h, offloaded, run), t)
        fwd = forward_seconds(run, (h,), repeats) if timed is None else timed.fwd
        costs.append(BlockCosts(a, nbytes(h), fwd, options, unknown=unknown))
    # beside each block's backward, and beside everything kept at the top: the measured peaks less the blocks'
    # activations alive then (plainly, block i's backward runs while blocks 0..i keep theirs; rebuilt under full
    # recomputation, while blocks 0..i-1 keep their inputs and block i has its act again). The larger of the two:
    # a rebuild remakes the block's output and its forward's temporaries, which its backward may not have alive
    beside = [max(0, w - sum(act[:i + 1]), r - sum(c.inp for c in costs[:i]) - act[i])
              for i, (w, r) in enumerate(zip(windows, rebuilds))]
    costs = [dataclasses.replace(c, beside=b) for c, b in zip(costs, beside)]
    return Profile(tuple(costs), max(0, top - sum(act)), fixed, t_step)


def _selective_unknown(core: Any, alone: bool, timed: BlockCosts | None) -> dict[str, str]:
    """Why the selective way of a block cannot be priced ({} where it can): lab 04's policy recomputes
    `attn.core` and its trace runs the block on its hidden state alone; with seconds_from, that profile must
    have timed it."""
    if not isinstance(core, nn.Module):
        return {SELECTIVE: "the block has no attn.core module, so the kit cannot tell its core attention (what "
                           "lab 04's policy recomputes) from the rest"}
    if not alone:
        return {SELECTIVE: "the block is called with arguments besides its hidden state; lab 04's trace runs a "
                           "block on its hidden state alone"}
    if timed is not None and SELECTIVE not in timed.options:
        return {SELECTIVE: "seconds_from did not time it for this block"}
    return {}


def _moments(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
             step: Callable[[], None], given: Any = None) -> tuple[list[int], int, int]:
    """The meter's peaks of one steady step: while each block's backward runs (a ValueError where they cannot be
    told apart: counting them as one would under-count), at the step's top (the blocks' forward, what follows
    them, and its backward), and at the moments no plan changes (the optimizer step; before the blocks' forward;
    after their backward, when what comes before them runs its backward).

    Block i's backward runs from the gradient of its output to the gradient of its input: tensor hooks mark both
    on the meter's timeline (block 0's input may need none: then it runs until backward ends), and a forward
    pre-hook marks where block 0's forward starts. Whatever runs between two blocks' backwards (a module between
    them) counts with the block before it, as if that block held all its activations then (never optimistic)."""
    blocks = [m for _, m in blocks_of(model, given)]
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
                         "each take their hidden state and return one tensor, each called once per step, in order")
    windows = [peak(stops[i + 1] if i + 1 < n else starts[i], stops[i]) for i in range(n)]
    return windows, peak(first, starts[-1]), fixed


def _saved_later(model: nn.Module, x: torch.Tensor, blocks: list[nn.Module]) -> list[bool]:
    """For each block, whether its output (or a view of it) is saved plainly by what keeps it as long as the
    block's own kept tensors live: the next block's forward (its saves are freed by its backward, which runs
    just before this block's), or, for the last block, anything after the blocks (counted in base). A save
    by anything else (a skip connection from an earlier block to the head) is freed sooner, so it does not
    count: there, a way that keeps the output is charged for it."""
    n = len(blocks)
    outs: list[torch.UntypedStorage | None] = [None] * n  # held: no later storage takes their address
    later, running = [False] * n, [-1]  # running[0]: the block whose forward runs now (-1: none; n: after all)

    def pack(t: torch.Tensor) -> None:  # the tensor is not kept: a saved output kept here would make a cycle
        key = {st._cdata for st in tensor_storages(t)}
        at = running[0]
        for i in ([at - 1] if 0 < at < n else range(n - 1, n) if at == n else []):
            later[i] = later[i] or (outs[i] is not None and outs[i]._cdata in key)

    def before(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            running[0] = i
        return hook

    def after(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            outs[i] = out.untyped_storage() if isinstance(out, torch.Tensor) else None
            running[0] = n if i == n - 1 else -1
        return hook

    with contextlib.ExitStack() as stack:
        for i, b in enumerate(blocks):
            stack.callback(b.register_forward_pre_hook(before(i)).remove)
            stack.callback(b.register_forward_hook(after(i)).remove)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None))
        with torch.random.fork_rng(devices=cuda_devices(x, model)):
            model(x)
    return later


def _extra_seconds(block: nn.Module, x: torch.Tensor, wrap: Callable[..., Any], repeats: int) -> float:
    """Median seconds a forward and backward of `block` take longer under wrap(block, x) than plainly (alternating
    runs): what the way costs, its bookkeeping included."""
    def step(run: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def go() -> None:
            run(x.detach().requires_grad_()).float().sum().backward()
        return go
    c = compare(step(block), step(lambda h: wrap(block, h)), repeats=repeats, warmup=1, device=x.device)
    return max(0.0, (c.ratio - 1) * c.a.median)


def _extra_held(block: nn.Module, x: torch.Tensor, wrap: Callable[..., Any],
                run: Callable[[torch.Tensor], Any] | None = None) -> int:
    """Bytes more that a forward and backward of `block` (run: as a function of its hidden state, default the
    block itself) has alive at its peak under wrap(run, x) than plainly
    (the meter, on x's device, each from no gradients and the same random draws): what the way rebuilds or
    stages beyond what the block holds plainly. PyTorch's selective checkpoint, for one, reruns the block in
    backward (its kept ops served from its cache, the others run again), and the outputs it recomputes meet
    the ones it kept."""
    def peak(run: Callable[[torch.Tensor], torch.Tensor]) -> int:
        for p in block.parameters():
            p.grad = None
        with torch.random.fork_rng(devices=cuda_devices(x)), MemoryMeter(device=x.device) as meter:
            run(x.detach().requires_grad_()).float().sum().backward()
        return meter.peak
    run = run or block
    return max(0, peak(lambda h: wrap(run, h)) - peak(run))
