"""Lab 04's benchmark: selective checkpointing policies on a long-sequence GPT stack.

A policy is what each block keeps: nothing checkpointed ("none"), or a set of op keys (labkit.instruments.ops) whose
outputs a selective checkpoint keeps while the rest of the block is recomputed, or Megatron's own form, a
plain checkpoint around one submodule (core attention). Each is run twice: with a from-scratch selective
checkpoint (lab 04's) and with PyTorch's (torch.utils.checkpoint with create_selective_checkpoint_contexts);
the meter gives the bytes each keeps after forward, and alternating runs the step time against "none".
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from labkit.bench.lab02 import stack_step
from labkit.instruments.blocks import wrapped
from labkit.instruments.compiled import RandomDraws, metered_backend, outside_meters
from labkit.instruments.meter import measure_peak
from labkit.models import GPTConfig, GPTStack, gpt_input
from labkit.instruments.ops import OpRecord, trace
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.timing import Comparison, benchmark, compare

__all__ = ["Policy", "long_config", "long_stack", "policy_rows", "policies", "step", "recompute_seconds",
           "kept_after_forward", "saved_after_forward", "compiled_runner", "head_to_head", "versus", "verdict",
           "standard_policies", "step_draws", "block_step", "dropout_masks", "agreement", "match_masks",
           "relative_difference"]

CORE = "attn.core"  # the submodule Megatron's selective recomputation recomputes


def long_config(size: Sizes | None = None) -> GPTConfig:
    """The profile's long-sequence stack (labs 04-05): attention's (b, a, s, s) tensors dominate its activations;
    its forwards under the profile's autocast (bfloat16 on the gpu profile)."""
    size = size or sizes()
    return size.long_gpt(dropout=0.1, autocast=size.amp)


def long_stack(size: Sizes | None = None) -> tuple[GPTStack, torch.Tensor]:
    """The long-sequence stack on the profile's device, and its input (requires grad)."""
    size = size or sizes()
    cfg = long_config(size)
    return GPTStack(cfg).to(size.device), gpt_input(cfg, requires_grad=True, device=size.device)


@dataclass(frozen=True)
class Policy:
    """What every block of the stack keeps for backward."""

    name: str
    keep: frozenset[str] | None = None  # op keys a selective checkpoint keeps; None: see region
    region: str | None = None  # with keep None: checkpoint only this submodule ("" the whole block), None: nothing

    def __post_init__(self) -> None:
        if self.keep is not None and self.region is not None:
            raise ValueError(f"Policy {self.name!r}: give keep (a selective checkpoint of the block) or region "
                             f"(a plain checkpoint of one submodule), not both")


def recompute_seconds(ops: Sequence[OpRecord], policy: Policy) -> float:
    """Seconds of one block's ops that `policy` runs again in backward, from the trace's replay times."""
    if policy.keep is not None:
        return sum(r.seconds or 0.0 for r in ops if r.key not in policy.keep)
    if policy.region is None:
        return 0.0
    region = policy.region  # "" is the whole block
    return sum(r.seconds or 0.0 for r in ops
               if region == "" or r.module == region or r.module.startswith(region + "."))


def _wrapped(block: nn.Module, region: str, ckpt: Callable[..., Any]) -> contextlib.AbstractContextManager[None]:
    """Run block.<region>'s forward under ckpt while inside (labkit.instruments.blocks.wrapped)."""
    return wrapped([block.get_submodule(region)], lambda forward, *a: ckpt(forward, *a))


def _torch_plain(fn: Callable[..., Any], *args: Any) -> Any:
    return torch_checkpoint(fn, *args, use_reentrant=False)


def _block_runner(policy: Policy, api: str, selective: Callable[..., Any] | None,
                  torch_policy: Callable[..., Any] | None, plain: Callable[..., Any] | None) -> Callable:
    """block, y -> block's output, as `policy` and `api` ("ours" | "torch") say."""
    if policy.keep is not None:
        if api == "ours":
            return lambda block, y: selective(block, y, keep=policy.keep)
        return lambda block, y: torch_checkpoint(block, y, use_reentrant=False, context_fn=torch_policy(policy.keep))
    if policy.region is None:
        return lambda block, y: block(y)
    ckpt = plain if api == "ours" else _torch_plain
    if policy.region == "":
        return lambda block, y: ckpt(block, y)

    def run(block: nn.Module, y: torch.Tensor) -> torch.Tensor:
        with _wrapped(block, policy.region, ckpt):
            return block(y)
    return run


step = stack_step  # one training step (or forward only) of the stack with every block run by run_block


def kept_after_forward(model: GPTStack, x: torch.Tensor, run_block: Callable) -> int:
    """Bytes alive after forward beyond the parameters, the input and the output: what the step keeps for backward."""
    model.zero_grad(set_to_none=True)  # gradients of an earlier step would be freed inside the measurement
    x.grad = None
    meter = measure_peak(step(model, x, run_block, backward=False), track=(model, x))
    return meter.live - meter.baseline - meter.result.untyped_storage().nbytes()


def saved_after_forward(model: GPTStack, x: torch.Tensor, run_block: Callable) -> int:
    """Bytes of the distinct storages autograd saved in forward, beyond parameters, buffers and the input.

    A pack hook sees what compiled code saves, where the meter's dispatch mode would make torch.compile fall
    back to eager; for a plain step it equals kept_after_forward.
    """
    model.zero_grad(set_to_none=True)
    x.grad = None
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t.detach()  # not t: a node keeping its own output would be a cycle, freed only by gc.collect()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(model, x, run_block, backward=False)()
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), x]}
    return sum(n for ptr, n in seen.items() if ptr not in skip)


def compiled_runner(model: GPTStack, budget: float) -> Callable:
    """block, y -> block(y) compiled with torch.compile's partitioner under activation_memory_budget=budget.

    The backend aot_eager_decomp_partition runs AOTAutograd's min-cut partitioner, which is where the budget
    acts, and then eager kernels: no Inductor fusion, so its time compares like for like with eager policies
    (and it compiles in seconds, not the half minute Inductor takes on a small CPU).
    """
    import torch._functorch.config as functorch_config

    if not isinstance(budget, (int, float)) or not 0 <= budget <= 1:
        raise ValueError(f"compiled_runner: budget={budget!r} must be a number from 0 to 1")
    from torch._dynamo.backends.debugging import aot_eager_decomp_partition

    # under a meter dynamo would run the blocks eagerly without a word: each compiled graph runs inside the
    # meters instead, and fullgraph makes a graph break an error rather than eager code no meter sees
    backend = metered_backend(aot_eager_decomp_partition)
    compiled = {id(b): torch.compile(b, backend=backend, fullgraph=True) for b in model.blocks}

    def run(block: nn.Module, y: torch.Tensor) -> torch.Tensor:
        with functorch_config.patch(activation_memory_budget=budget), outside_meters():  # read when partitioned
            return compiled[id(block)](y)
    return run


def grads(model: GPTStack, x: torch.Tensor, run_block: Callable) -> list[torch.Tensor]:
    step(model, x, run_block)()
    return [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


def policy_rows(model: GPTStack, x: torch.Tensor, ops: Sequence[OpRecord], policies: Sequence[Policy],
                selective: Callable[..., Any], torch_policy: Callable[..., Any], plain: Callable[..., Any],
                repeats: int = 5, timed: Collection[str] | None = None, check: bool = True) -> list[dict[str, Any]]:
    """For each policy: bytes kept (ours and PyTorch's), gradients equal to "none", predicted and measured ratios.

    selective(fn, x, keep=...) and torch_policy(keep) -> context_fn are lab 04's; plain(fn, x) a checkpoint
    (lab 02's checkpoint_hooks) for region policies. Time ratios are taken against "none" in alternating runs
    (labkit.instruments.timing.compare) for the policies in `timed` (default all); the prediction is 1 + the blocks'
    recompute seconds from the trace over one plain step's median, the same for every row. check=False
    measures the from-scratch checkpoint's bytes only (no PyTorch run, no gradient comparison).
    """
    none = _block_runner(Policy("none"), "ours", selective, torch_policy, plain)
    want = grads(model, x, none) if check else []
    plain_s: float | None = None  # one plain step's median: the baseline of every prediction
    rows = []
    for policy in policies:
        row: dict[str, Any] = {"name": policy.name}
        for api in ("ours", "torch") if check else ("ours",):
            runner = _block_runner(policy, api, selective, torch_policy, plain)
            row[f"bytes_{api}"] = kept_after_forward(model, x, runner)
            if check:
                got = grads(model, x, runner)
                row[f"grads_equal_{api}"] = all(torch.equal(a, b) for a, b in zip(want, got))
        row["activation_bytes"] = row["bytes_ours"]
        row["recompute_s"] = len(model.blocks) * recompute_seconds(ops, policy)
        if policy.keep is None and policy.region is None:  # "none" is the reference: 1 by definition
            row["step_time_ratio"] = row["predicted_step_time_ratio"] = 1.0
        elif timed is None or policy.name in timed:
            runner = _block_runner(policy, "ours", selective, torch_policy, plain)
            c = compare(step(model, x, none), step(model, x, runner), repeats=repeats, device=x.device)
            row["step_time_ratio"] = c.ratio
            row["step_time_pairs"] = (min(c.ratios), max(c.ratios))  # the spread behind the median
            if plain_s is None:
                plain_s = benchmark(step(model, x, none), repeats=repeats, device=x.device).median
            row["predicted_step_time_ratio"] = 1 + row["recompute_s"] / plain_s
        rows.append(row)
    return rows


def versus(model: GPTStack, x: torch.Tensor, a: Policy, b: Policy, selective: Callable[..., Any],
           torch_policy: Callable[..., Any], plain: Callable[..., Any], repeats: int = 5) -> Comparison:
    """Step times of policy a and policy b in alternating runs (both with the from-scratch checkpoint): the ratio
    b / a of each pair, their median, and verdict() of them."""
    run_a, run_b = (_block_runner(p, "ours", selective, torch_policy, plain) for p in (a, b))
    return compare(step(model, x, run_a), step(model, x, run_b), repeats=repeats, device=x.device)


def head_to_head(model: GPTStack, x: torch.Tensor, a: Policy, b: Policy, selective: Callable[..., Any],
                 torch_policy: Callable[..., Any], plain: Callable[..., Any], repeats: int = 5) -> float:
    """Median step time of policy b over policy a, in alternating runs (versus's median)."""
    return versus(model, x, a, b, selective, torch_policy, plain, repeats).ratio


def verdict(c: Comparison) -> str:
    """What a run of alternating pairs can say of B against A: "slower" or "faster" when every pair says so,
    else "not told apart" (pairs on both sides of 1: no order this run supports)."""
    if all(r > 1 for r in c.ratios):
        return "slower"
    if all(r < 1 for r in c.ratios):
        return "faster"
    return "not told apart"


def standard_policies(ops: Sequence[OpRecord], greedy: Callable, knapsack: Callable, selective_keep: Callable,
                      kept_bytes: Callable) -> list[Policy]:
    """none, full, Megatron's selective (as an op policy and in its own form), greedy and knapsack at its budget.

    greedy(ops, budget), knapsack(ops, budget), selective_keep(ops) and kept_bytes(ops, keep) are lab 04's.
    """
    sel = frozenset(selective_keep(ops))
    budget = kept_bytes(ops, sel)
    return [Policy("none"), Policy("full", keep=frozenset()), Policy("selective", keep=sel),
            Policy("selective (checkpoint core attention)", region=CORE),
            Policy("greedy", keep=frozenset(greedy(ops, budget))),
            Policy("knapsack", keep=frozenset(knapsack(ops, budget)))]


def policies(size: Sizes | None = None) -> dict[str, Any]:
    """Every policy of lab 04 (the reference code, generated from the solution) on the profile's long stack."""
    from labkit.labs.recompute import checkpoint_hooks
    from labkit.labs.selective import (checkpoint_selective, greedy_keep, kept_bytes, knapsack_keep,
                                            selective_keep, torch_policy)

    size = size or sizes()
    model, x = long_stack(size)
    ops = trace(model.blocks[0], x, model=model.blocks[0], repeats=size.repeats)
    chosen = standard_policies(ops, greedy_keep, knapsack_keep, selective_keep, kept_bytes)
    rows = policy_rows(model, x, ops, chosen, checkpoint_selective, torch_policy, checkpoint_hooks,
                       repeats=size.repeats)
    by_name = {p.name: p for p in chosen}
    versus = head_to_head(model, x, by_name["selective"], by_name["knapsack"], checkpoint_selective, torch_policy,
                          checkpoint_hooks, repeats=size.repeats)
    cfg = model.cfg
    keys = ("name", "activation_bytes", "bytes_torch", "predicted_step_time_ratio", "step_time_ratio",
            "grads_equal_ours", "grads_equal_torch")
    none, sel = rows[0]["activation_bytes"], next(r for r in rows if r["name"] == "selective")["activation_bytes"]
    return {"policies": [{k: (round(r[k], 4) if isinstance(r[k], float) else r[k]) for k in keys} for r in rows],
            "selective_bytes_cut": round(none / sel, 4),
            "knapsack_vs_selective_time_ratio": round(versus, 4),
            "worst_prediction_error": round(max(abs(r["predicted_step_time_ratio"] / r["step_time_ratio"] - 1)
                                                for r in rows), 4),
            "config": {"s": cfg.seq, "b": cfg.batch, "h": cfg.hidden, "a": cfg.heads, "n_layers": cfg.n_layers,
                       "dtype": str(cfg.dtype).replace("torch.", "")}}


# ---------------------------------------------------------------- what compile draws (pytorch/pytorch#190758)
def step_draws(block: nn.Module, x: torch.Tensor,
               run: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> RandomDraws:
    """The random ops one training step of one block draws (run(block, x) its output; the loss the mean square),
    from seed 0 as every step here: forward's and backward's, their outputs kept."""
    x = x.detach().requires_grad_()
    with RandomDraws(keep=True) as draws:
        torch.manual_seed(0)
        run(block, x).square().mean().backward()
    block.zero_grad(set_to_none=True)
    return draws


def block_step(block: nn.Module, x: torch.Tensor,
               run: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Loss and gradients (the block's parameters', then the input's) of one training step of one block, run as
    step_draws runs it."""
    x = x.detach().requires_grad_()
    block.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    loss = run(block, x).square().mean()
    loss.backward()
    grads = [q.grad.clone() for q in block.parameters()] + [x.grad.clone()]
    block.zero_grad(set_to_none=True)
    return loss.detach(), grads


def dropout_masks(draws: RandomDraws, phase: str, p: float) -> list[torch.Tensor]:
    """The dropout masks drawn in `phase` ("forward" or "backward"): native_dropout's own (its second output), or,
    where a compiled graph decomposed it, aten.rand's draws above p (native_dropout's decomposition keeps where
    rand_like(x) > p, torch/_decomp/decompositions.py; Inductor's table makes rand_like an aten.rand)."""
    masks = []
    for name, out in draws.draws[phase]:
        if name.startswith("aten.native_dropout"):
            masks.append(out[1])
        elif name.startswith("aten.rand."):
            masks.append(out > p)
    return masks


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """The share of elements on which two masks agree (two independent masks of drop rate p: p² + (1 - p)²)."""
    if a.shape != b.shape:
        raise ValueError(f"agreement: masks of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return (a == b).double().mean().item()


def match_masks(drawn: Sequence[torch.Tensor], others: Sequence[torch.Tensor]) -> tuple[bool, float]:
    """Each mask of `others` against the masks of `drawn` of its shape: (whether every one equals one of them, the
    least over `others` of its best agreement); (True, 1.0) when `others` is empty."""
    same, least = True, 1.0
    for m in others:
        mine = [d for d in drawn if d.shape == m.shape]
        if not mine:
            raise ValueError(f"match_masks: no drawn mask of shape {tuple(m.shape)} to compare with")
        same = same and any(torch.equal(d, m) for d in mine)
        least = min(least, max(agreement(d, m) for d in mine))
    return same, least


def relative_difference(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """The largest, over the tensors, of max |got - want| / max |want|: how far the farthest one is off, relative
    to its own size (a gradient of zeros counts by its absolute difference)."""
    return max(((g - w).abs().max() / (w.abs().max() if w.abs().max() > 0 else 1)).item()
               for g, w in zip(got, want, strict=True))
