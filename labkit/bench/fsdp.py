"""Sharding (FSDP2) and activation checkpointing together: each rank's peak memory, measured.

``fsdp()`` starts RANKS processes joined by ``torch.distributed`` (labkit.env.ranks: gloo on the CPU, nccl with a
GPU per rank). Each rank trains the GPT stack for STEPS steps of Adam on the mean square of its output, on
its own micro-batch of one global batch (data parallel), in four combinations, one after the other:

  plain                 every rank holds the whole model; gradients averaged over ranks by all_reduce
  checkpointed          as plain, each GPTBlock's forward run under checkpoint(use_reentrant=False)
  sharded               FSDP2: fully_shard on each block, then on the root
  sharded_checkpointed  checkpoint on each block first, then fully_shard as in sharded (See Note 2)

What is measured, per rank and combination: a MemoryMeter over the second step (the first one made the
gradients and Adam's state), tracking the model, the optimizer and the micro-batch from the start. Its peak is
that state plus the activations the forward keeps plus what is briefly live: FSDP's all-gather buffers and
unsharded parameters, the gradients being reduced. Beside it: the state bytes, the activation bytes (live
bytes the forward added) and the losses, which must match one process training on the whole global batch.

Notes (the code says "See Note N" where one applies):

1. The meter counts a DTensor by its local shard: labkit.instruments.tensors unwraps wrapper subclasses, whose own
   storage is a stand-in of the global size. FSDP2's plain-tensor work is counted as it happens: the
   all-gather output (``empty``), the unsharded parameters (the ``view`` FSDP takes of them, then
   ``resize_(0)`` when resharded and ``resize_(n)`` when gathered again), the reduce-scatter input and
   output. tests/test_bench_fsdp.py holds the meter's peak to PyTorch's FSDPMemTracker, byte for byte. Both
   see an op on DTensors from outside DTensor's own dispatch: a temporary it makes and frees inside one op
   is seen by neither (the outputs are).
2. Checkpoint first, then fully_shard: FSDP2's hooks (all-gather before a block, reshard after it) then
   sit outside the checkpointed region. ``wrong_order()`` runs the other order beside it. Patching a
   block's ``forward`` is the same in either order (FSDP2 hooks the module call, around ``forward``); a
   ``checkpoint_wrapper`` put around a block already sharded moves FSDP's hooks inside the region, so the
   recomputation in backward calls them again: in torch 2.13 they see the backward state and do nothing
   (no second all-gather), and the step is bit for bit the right order's.
3. Dropout is 0: each rank draws its own masks, so with dropout the ranks' losses could not match one
   process's training on the whole batch.
4. Sharded peaks vary a little. A buffer that a gloo collective held is sometimes released by gloo's
   worker thread, a moment later than the main thread would: a sharded peak can differ between runs and
   ranks by up to one block's gradient buffer (its unsharded parameter bytes). The meter tags such a free
   "forward" (that thread runs no autograd graph).
5. On one GPU (nccl needs a device per rank) the ranks run on the CPU with gloo, at the cpu profile's sizes.
"""
from __future__ import annotations

import contextlib
import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from labkit.instruments.meter import MemoryMeter
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.env.ranks import Fault, RankError, device_of, launch, on_gpus
from labkit.instruments.tensors import tensor_storages
from labkit.planners.measuring import train_steps

__all__ = ["RANKS", "STEPS", "COMBINATIONS", "WAYS", "fsdp", "fsdp_config", "build", "checkpoint_blocks", "shard",
           "micro_batch", "reference_losses", "wrong_order", "attempt"]

RANKS = 2  # processes, one micro-batch each
STEPS = 3  # training steps per combination; step 1 (the second) is measured
COMBINATIONS = ("plain", "checkpointed", "sharded", "sharded_checkpointed")
LR = 1e-3  # Adam's learning rate
RTOL = 1e-5  # losses match: |a - b| <= RTOL * |b| (ranks sum in another order than one process)
_METERED_STEP = 1


# ---------------------------------------------------------------- the models

def fsdp_config(size: Sizes) -> GPTConfig:
    """The profile's GPT stack with dropout 0 (See Note 3); its batch is the global batch, RANKS micro-batches.
    Where the ranks cannot each have a GPU, the cpu profile's (See Note 5)."""
    if size.device == "cuda" and not on_gpus(RANKS):
        size = sizes("cpu")
    batch = RANKS * math.ceil(size.batch / RANKS)
    return size.gpt(batch=batch, dropout=0.0)


def micro_batch(cfg: GPTConfig, rank: int, ranks: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank `rank`'s rows of the global batch gpt_input(cfg), as a tensor of its own: (b / ranks, s, h)."""
    if cfg.batch % ranks:
        raise ValueError(f"micro_batch: batch={cfg.batch} does not split into {ranks} equal micro-batches; "
                         f"choose a batch that is a multiple of {ranks}")
    rows = cfg.batch // ranks
    return gpt_input(cfg)[rank * rows:(rank + 1) * rows].clone().to(device)


def checkpoint_blocks(model: GPTStack) -> None:
    """Run each block's forward under checkpoint(use_reentrant=False): backward keeps only the block's input.
    For good, not while inside a context (labkit.instruments.blocks.patched): each rank builds the model it
    trains, and the order of checkpoint and fully_shard is what the bench compares."""
    for block in model.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def shard(model: GPTStack) -> None:
    """FSDP2: fully_shard each block (one all-gather and one reduce-scatter per block), then the root (ln_f)."""
    fully_shard = _fully_shard()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)


def build(combination: str, cfg: GPTConfig, device: torch.device | str = "cpu") -> GPTStack:
    """The GPT stack of one combination: checkpoint on each block first, then fully_shard (See Note 2)."""
    if combination not in COMBINATIONS:
        raise ValueError(f"build: combination={combination!r} is unknown; choose one of {', '.join(COMBINATIONS)}")
    model = GPTStack(cfg).to(device)
    if combination.endswith("checkpointed"):
        checkpoint_blocks(model)
    if combination.startswith("sharded"):
        shard(model)
    return model


def _fully_shard() -> Callable[..., Any]:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as e:
        raise ImportError(f"labkit bench fsdp needs FSDP2's torch.distributed.fsdp.fully_shard (torch >= 2.6); "
                          f"this torch is {torch.__version__} ({e})") from e
    return fully_shard


def _is_dtensor(t: Any) -> bool:
    if t is None or not dist.is_available():
        return False
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)


# ---------------------------------------------------------------- one rank's training

def _nbytes(*trees: Any) -> int:
    """Bytes of the distinct storages in `trees` (a DTensor: its local shard, See Note 1)."""
    return sum(st.nbytes() for st in tensor_storages(*trees))


def _average_grads(model: nn.Module, ranks: int) -> None:
    """Each gradient, the mean over ranks: all_reduce where unsharded; FSDP's reduce-scatter already averaged
    a sharded one into the local shard."""
    for p in model.parameters():
        if p.grad is not None and not _is_dtensor(p.grad):
            dist.all_reduce(p.grad)  # sum over ranks, in place
            p.grad.div_(ranks)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, ranks: int,
                meter: MemoryMeter | None = None) -> tuple[float, int]:
    """One step; this rank's loss and, under `meter`, the bytes the forward left live (its activations)."""
    opt.zero_grad(set_to_none=True)
    before = meter.live if meter else 0
    loss = model(x).square().mean()
    activations = meter.live - before if meter else 0
    loss.backward()
    _average_grads(model, ranks)
    opt.step()
    return loss.item(), activations


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> list[Any]:
    """This rank's parameters, gradients and Adam state."""
    params = list(model.parameters())
    return [params, [p.grad for p in params if p.grad is not None], opt.state_dict()["state"]]


def _train(combination: str, cfg: GPTConfig, x: torch.Tensor, ranks: int, steps: int) -> dict[str, Any]:
    """Train one combination for `steps` steps on this rank; its losses and the figures of the measured step."""
    model = build(combination, cfg, x.device)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses, metered = _train_steps(model, opt, x, ranks, steps, _collectives)
    if metered is None:
        return {"losses": losses}
    meter, activations, collectives = metered
    return {"losses": losses, "peak_bytes": meter.peak, "peak_phase": meter.peak_phase,
            "activation_bytes": activations, "state_bytes": _nbytes(_state(model, opt)),
            "all_gathers": collectives["all_gathers"], "reduce_scatters": collectives["reduce_scatters"]}


@contextlib.contextmanager
def _collectives() -> Iterator[Counter[str]]:
    """FSDP's all-gathers and reduce-scatters while inside (``_CollectiveCounter``)."""
    with _CollectiveCounter() as counter:
        yield counter.counts


def _train_steps(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, ranks: int, steps: int,
                 watch: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
                 ) -> tuple[list[float], tuple[MemoryMeter, int, Any] | None]:
    """`steps` training steps on this rank: their losses, and of the measured one (step _METERED_STEP, under the
    meter and inside watch()) the meter, its activation bytes and what watch() gave (None: no step measured)."""
    losses, metered = [], None
    for step in range(steps):
        if step != _METERED_STEP:
            losses.append(_train_step(model, opt, x, ranks)[0])
            continue
        with watch() as watched, MemoryMeter(model, opt, x) as meter:
            loss, activations = _train_step(model, opt, x, ranks, meter)
        losses.append(loss)
        metered = (meter, activations, watched)
    return losses, metered


def _bench_rank(rank: int, ranks: int, cfg: GPTConfig, steps: int, fault: Fault | None) -> dict[str, Any]:
    """One rank of fsdp(): every combination in turn on this rank's micro-batch."""
    x = micro_batch(cfg, rank, ranks, device_of(rank, ranks))
    found = {}
    for i, combination in enumerate(COMBINATIONS):
        if fault is not None and i == 1:
            fault.trigger(rank)
        found[combination] = _train(combination, cfg, x, ranks, steps)
    return found


def reference_losses(cfg: GPTConfig, steps: int = STEPS) -> list[float]:
    """Each step's loss of one process training the plain stack on the whole global batch with
    Adam(model.parameters()), on one thread as a rank: what every combination's mean loss over ranks must match."""
    model, x = GPTStack(cfg), gpt_input(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy machine, several threads can take ten times as long
    try:
        return train_steps(model, opt, x, lambda out: out.square().mean(), steps)
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- the bench

def fsdp(size: Sizes | None = None, *, timeout: float = 120.0, fault: Fault | None = None) -> dict[str, Any]:
    """Per-rank peak, state and activation bytes of the four combinations on RANKS ranks, and whether their
    losses match one process's plain training on the global batch (see the module doc). `fault`: a test hook."""
    start = time.perf_counter()
    cfg = fsdp_config(size or sizes())
    reference = reference_losses(cfg, STEPS)
    ranks = launch(_bench_rank, cfg, STEPS, fault, ranks=RANKS, timeout=timeout)

    def per_rank(key: str) -> dict[str, list[Any]]:
        return {c: [r[c][key] for r in ranks] for c in COMBINATIONS}

    losses = {c: [sum(r[c]["losses"][i] for r in ranks) / RANKS for i in range(STEPS)] for c in COMBINATIONS}
    rel = {c: _max_rel_diff(losses[c], reference) for c in COMBINATIONS}
    return {"ranks": RANKS, "per_rank_peak_bytes": per_rank("peak_bytes"),
            "losses_match": all(d <= RTOL for d in rel.values()),
            "bars_hold": _bars_hold(per_rank("peak_bytes")),
            "per_rank_state_bytes": per_rank("state_bytes"), "per_rank_activation_bytes": per_rank("activation_bytes"),
            "per_rank_peak_phase": per_rank("peak_phase"),
            "per_rank_all_gathers": per_rank("all_gathers"), "per_rank_reduce_scatters": per_rank("reduce_scatters"),
            "losses": losses, "reference_losses": reference, "loss_max_rel_diff": rel, "loss_rtol": RTOL,
            "config": {"seq": cfg.seq, "global_batch": cfg.batch, "micro_batch": cfg.batch // RANKS,
                       "hidden": cfg.hidden, "heads": cfg.heads, "n_layers": cfg.n_layers, "dropout": cfg.dropout},
            "steps": STEPS, "measured_step": _METERED_STEP, "seconds": round(time.perf_counter() - start, 2)}


def _max_rel_diff(a: list[float], b: list[float]) -> float:
    """max |a_i - b_i| / |b_i|."""
    return max(abs(x - y) / max(abs(y), math.ulp(1.0)) for x, y in zip(a, b))


def _bars_hold(peaks: dict[str, list[int]]) -> bool:
    """On every rank: sharded_checkpointed < sharded < plain and sharded_checkpointed < checkpointed < plain."""
    return all(sc < s < p and sc < c < p for p, c, s, sc in zip(*(peaks[k] for k in COMBINATIONS)))


# ---------------------------------------------------------------- the wrong order (See Note 2)

class _CollectiveCounter(TorchDispatchMode):
    """Counts FSDP's collectives: all-gathers and reduce-scatters."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func)
        if "allgather" in name or "reduce_scatter" in name:
            self.counts["all_gathers" if "allgather" in name else "reduce_scatters"] += 1
        return func(*args, **(kwargs or {}))


def _checkpoint(model: GPTStack, how: str) -> None:
    """Checkpoint each block: "wrapper" puts a checkpoint_wrapper module around it, "forward" patches its forward."""
    if how == "forward":
        checkpoint_blocks(model)
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    model.blocks = nn.ModuleList(checkpoint_wrapper(block) for block in model.blocks)


def _count_calls(module: nn.Module, calls: Counter[str], key: str) -> None:
    """Add 1 to calls[key] whenever `module` is called (its forward pre-hooks run)."""
    module.register_forward_pre_hook(lambda mod, args: calls.update([key]))


def _ordered(order: str, how: str, cfg: GPTConfig, device: torch.device, calls: Counter[str]) -> GPTStack:
    """The sharded stack with each block checkpointed `how` before fully_shard (order "right") or after it
    ("wrong"); `calls` counts calls of the GPTBlocks and of the modules fully_shard took, the root aside."""
    from torch.distributed.fsdp import FSDPModule

    model = GPTStack(cfg).to(device)
    for block in model.blocks:
        _count_calls(block, calls, "block_calls")
    if order == "right":
        _checkpoint(model, how)
    shard(model)
    if order == "wrong":
        _checkpoint(model, how)
    for module in model.blocks.modules():
        if isinstance(module, FSDPModule):
            _count_calls(module, calls, "fsdp_calls")
    return model


def _order_rank(rank: int, ranks: int, cfg: GPTConfig, steps: int, ways: tuple[str, ...]) -> dict[str, Any]:
    """One rank of wrong_order(): per way of checkpointing, both orders trained from the same start, compared."""
    x = micro_batch(cfg, rank, ranks, device_of(rank, ranks))
    found: dict[str, Any] = {}
    for how in ways:
        right, wrong = (_order_run(order, how, cfg, x, ranks, steps) for order in ("right", "wrong"))
        if right["error"] is None and wrong["error"] is None:
            wrong["losses_bitwise_equal"] = right["losses"] == wrong["losses"]
            wrong["grads_bitwise_equal"] = all(map(torch.equal, right.pop("grads"), wrong.pop("grads")))
        found[how] = {"right": right, "wrong": wrong}
    return found


def _order_run(order: str, how: str, cfg: GPTConfig, x: torch.Tensor, ranks: int, steps: int) -> dict[str, Any]:
    """Train one ordering; its losses, last gradients, measured peak and per-step calls, or the error it raised."""
    try:
        calls: Counter[str] = Counter()
        model = _ordered(order, how, cfg, x.device, calls)
        opt = torch.optim.Adam(model.parameters(), lr=LR)

        @contextlib.contextmanager
        def watch() -> Iterator[dict[str, int]]:  # the measured step's calls and collectives, as it ends
            seen: dict[str, int] = {}
            calls.clear()
            with _CollectiveCounter() as counter:
                yield seen
            seen.update({**calls, **counter.counts})
        losses, metered = _train_steps(model, opt, x, ranks, steps, watch)
        figures = {} if metered is None else {"peak_bytes": metered[0].peak, **metered[2]}
    except Exception as e:  # noqa: BLE001 - what happened is the result
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return {"error": None, "losses": losses, "grads": [p.grad.to_local().clone() if _is_dtensor(p.grad)
                                                       else p.grad.clone() for p in model.parameters()], **figures}


WAYS = ("wrapper", "forward")  # checkpoint_wrapper around a block; the block's forward patched


def wrong_order(size: Sizes | None = None, *, ways: tuple[str, ...] = WAYS, timeout: float = 120.0) -> dict[str, Any]:
    """fully_shard first, then checkpoint around each block, beside the right order, on RANKS ranks. Per way of
    checkpointing (of WAYS): the error the wrong order raised (None), whether its losses and gradients equal
    the right order's bit for bit on every rank, and per rank and order the measured step's peak bytes, block
    calls, all-gathers and reduce-scatters."""
    unknown = [w for w in ways if w not in WAYS]
    if unknown or not ways:
        raise ValueError(f"wrong_order: ways={ways!r} must be a non-empty tuple of {', '.join(WAYS)}")
    ranks = launch(_order_rank, fsdp_config(size or sizes()), STEPS, tuple(ways), ranks=RANKS, timeout=timeout)
    found = {}
    for how in ways:
        runs = {order: [r[how][order] for r in ranks] for order in ("right", "wrong")}
        errors = [run["error"] for order in ("wrong", "right") for run in runs[order] if run["error"]]
        found[how] = {"error": errors[0] if errors else None, **_ORDER_KEYS}  # every key, None when it failed
        if errors:
            continue
        found[how].update({key: all(w[key] for w in runs["wrong"])
                           for key in ("losses_bitwise_equal", "grads_bitwise_equal")})
        for key in ("peak_bytes", "block_calls", "fsdp_calls", "all_gathers", "reduce_scatters"):
            found[how][f"per_rank_{key}"] = {order: [run[key] for run in runs[order]] for order in runs}
    return found


_ORDER_KEYS = dict.fromkeys(("losses_bitwise_equal", "grads_bitwise_equal", "per_rank_peak_bytes",
                             "per_rank_block_calls", "per_rank_fsdp_calls", "per_rank_all_gathers",
                             "per_rank_reduce_scatters"))


def attempt(run: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """run(*args, **kwargs) with "error": None added, or {"error": why} when it failed (a rank that failed or hung,
    a launch that could not start): a lab cell prints why, and the cells that read its figures say they are
    skipped instead of raising NameError."""
    try:
        return {"error": None, **run(*args, **kwargs)}
    except RankError as e:
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - e.g. spawn unable to pickle the work: said, never a figure
        return {"error": f"{type(e).__name__}: {e}"}
