"""Lab 04's knapsack inside torch.compile: a keep-planner run as the min-cut partitioner's solver.

Below activation_memory_budget 1, AOTAutograd's partitioner (torch/_functorch/partitioners.py,
``choose_saved_values_set``) hands a 0-1 knapsack to a solver: the nodes it had banned from recomputation
("all_recomputable_banned_nodes", largest first), each node's bytes normalised by the span between saving
only the inputs and its default choice, and the budget in the same unit. ``activation_memory_budget_solver``
names the solver: "dp", "greedy", "ilp", or, from torch 2.13, an instance of
``torch._inductor.custom_graph_pass.CustomKnapsackSolver``, which is what ``planner_solver`` makes. A custom solver
is given no runtimes: it prices each node itself, here as the built-in solvers are priced by default (the
"flops" estimator: torch.utils.flop_counter's count, at least 1), so that a difference between solvers is the
search's, not the price's. Not by calling ``partitioners.estimate_runtime``: torch calls a custom solver under
``no_dispatch()``, where its FlopCounterMode counts nothing and every node would cost 1; ``flop_price`` reads
the same formulas from the node's shapes without running the op. The nodes become lab 04's OpRecords in graph order and the planner's keep set comes back as the indices to save
and to recompute.

Random ops. Under compile nothing replays the RNG for an op the partitioner moves into backward: there it draws
again, and the gradients are those of a forward that never ran (pytorch/pytorch#190758; torch 2.13). They come
back two ways (torch/_functorch/partitioners.py): a banned random op (``random_ops`` of ``get_default_op_list``:
native_dropout, rand_like, randn_like) is among the knapsack's candidates, as ``get_recomputable_banned_nodes``
filters none out, and the solver's "recompute" lets the final min-cut rebuild it (``dont_ban``); and a random op
that list does not name (``aten.rand``, which the decompositions of aot_eager_decomp_partition and Inductor make of
native_dropout) is banned only while the allowlist is on, so the relaxed cuts may recompute it without asking any
solver. So by default (``random="save"``) the solver never recomputes one: the random candidates are saved before
the planner sees them (their bytes charged to its budget), and every other random node of the joint graph is
tagged MUST_SAVE, which the final min-cut, run after the solver returns, bans from recomputation. Lab 04's random-op
rule for eager checkpoints (a recomputed random op before every kept one, replayed from the same RNG state) does
not hold here. ``random="planner"`` hands the random candidates to the planner and tags nothing, as torch's own
solvers do, to measure the difference. At a budget the relaxed cuts meet, no solver is asked at all: only a
policy that tags the random ops (``random_saved_context``) reaches those.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch

from labkit.instruments.ops import OpRecord

__all__ = ["planner_solver", "node_records", "custom_solvers_supported", "random_saved_context"]

SCALE = 1 << 20  # normalised memory -> integer "bytes" for the planner: 2^20 units over the partitioner's span
Keep = Callable[[Sequence[OpRecord], int], Collection[str]]


def custom_solvers_supported() -> bool:
    """Whether this torch takes a CustomKnapsackSolver as activation_memory_budget_solver (2.13 does)."""
    try:
        from torch._inductor.custom_graph_pass import CustomKnapsackSolver  # noqa: F401
    except ImportError:
        return False
    return True


def _random(node: Any) -> bool:
    """The node draws from a random generator (its op is tagged nondeterministic_seeded)."""
    tags = getattr(getattr(node, "target", None), "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def save_random_nodes(joint_graph: Any, offered: Collection[Any]) -> list[str]:
    """Tag every random node of `joint_graph` that is not among `offered` (the solver's candidates) MUST_SAVE,
    unless a policy tagged it already; the names tagged. The min-cut that follows the solver bans a MUST_SAVE node
    from recomputation (should_ban_recomputation, "marked MUST_SAVE")."""
    from torch.utils.checkpoint import CheckpointPolicy

    tagged = []
    for node in getattr(joint_graph, "nodes", ()):
        if node.op == "call_function" and _random(node) and node not in offered and "recompute" not in node.meta:
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            tagged.append(node.name)
    return tagged


def _save_random_ops(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """A selective checkpoint policy for torch.compile: MUST_SAVE for a random op, PREFER_SAVE (no constraint on
    the partitioner, which forces a recomputation only for the two *_RECOMPUTE tags) for any other."""
    from torch.utils.checkpoint import CheckpointPolicy

    random = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
    return CheckpointPolicy.MUST_SAVE if random else CheckpointPolicy.PREFER_SAVE


def random_saved_context() -> Any:
    """context_fn for torch.utils.checkpoint under torch.compile: every random op of the region tagged MUST_SAVE,
    the rest left to the partitioner, so no budget can move a random op into backward (see the module's doc)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_save_random_ops)


def flop_price(node: Any) -> float:
    """The "flops" estimator's price of a graph node, from its recorded shapes (node.meta["val"]): the FLOPs
    torch.utils.flop_counter counts for its op, at least 1 (as partitioners.estimate_runtime returns)."""
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import flop_registry

    packet = getattr(node.target, "overloadpacket", None)
    if packet not in flop_registry:
        return 1.0
    val = lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a  # noqa: E731
    args, kwargs = tree_map(val, (node.args, node.kwargs))
    return float(max(int(flop_registry[packet](*args, **kwargs, out_val=node.meta["val"])), 1))


def _price() -> Callable[[Any], float]:
    """The price of the partitioner's runtime estimator in force; one this solver cannot reproduce is refused."""
    import torch._functorch.config as functorch_config

    mode = functorch_config.activation_memory_budget_runtime_estimator
    if mode == "flops":
        return flop_price
    if mode == "testing":
        return lambda node: 1.0
    raise ValueError(f"planner_solver: activation_memory_budget_runtime_estimator={mode!r}; this solver prices "
                     "as 'flops' (the default) or 'testing' do, and would price otherwise than the built-in solvers")


def node_records(memory: Sequence[float], nodes: Sequence[Any], price: Callable[[Any], float]) -> list[OpRecord]:
    """The partitioner's candidates as lab 04's OpRecords, in graph order: key "i:name" (i: the node's index in
    the solver's lists), bytes the normalised memory x SCALE rounded up (a kept set never exceeds the budget
    the partitioner gave), seconds price(node)."""
    if len(memory) != len(nodes):
        raise ValueError(f"node_records: {len(memory)} memory figures for {len(nodes)} nodes")
    order = {n: k for k, n in enumerate(nodes[0].graph.nodes)} if nodes else {}
    records = []
    for i in sorted(range(len(nodes)), key=lambda i: order[nodes[i]]):
        node = nodes[i]
        op = getattr(node.target, "__name__", str(node.target))
        records.append(OpRecord(key=f"{i}:{node.name}", op=op, module="", flops=0, bytes_moved=0,
                                output_bytes=max(1, math.ceil(memory[i] * SCALE)), elements=0, is_view=False,
                                in_place=False, random=_random(node), seconds=float(price(node))))
    return records


@functools.cache
def _solver_type() -> type:
    """The PlannerSolver class, made on first use: importing Inductor's pass base costs seconds, and torch older
    than 2.13 has no CustomKnapsackSolver at all."""
    from torch._inductor.custom_graph_pass import CustomKnapsackSolver

    class PlannerSolver(CustomKnapsackSolver):
        """keep(ops, budget) as the partitioner's knapsack solver (see the module's doc)."""

        def __init__(self, keep: Keep, name: str, random: str) -> None:
            self.keep, self.name, self.random, self.calls = keep, name, random, 0
            self.random_offered: list[str] = []  # random candidates the partitioner offered (saved by "save")
            self.random_tagged: list[str] = []  # random nodes outside the candidates that "save" tagged MUST_SAVE

        def __call__(self, memory: list[float], joint_graph: Any, max_memory: float, node_info: Any,
                     nodes: list[Any]) -> tuple[list[int], list[int]]:
            self.calls += 1
            ops = node_records(memory, nodes, _price())
            budget = int(max(0.0, max_memory) * SCALE)
            drawn = [r for r in ops if r.random]
            self.random_offered += [r.key for r in drawn]
            if self.random == "save":  # never recomputed: saved whatever the budget, the rest planned in what is left
                self.random_tagged += save_random_nodes(joint_graph, nodes)
                budget = max(0, budget - sum(r.output_bytes for r in drawn))
                keep = set(self.keep([r for r in ops if not r.random], budget)) | {r.key for r in drawn}
            else:
                keep = set(self.keep(ops, budget))
            unknown = keep - {r.key for r in ops}
            if unknown:
                raise ValueError(f"PlannerSolver({self.name}): the planner kept {sorted(unknown)[:3]}, which are "
                                 "not among the partitioner's candidates")
            saved = {i for i in range(len(nodes)) if f"{i}:{nodes[i].name}" in keep}
            return sorted(saved), [i for i in range(len(nodes)) if i not in saved]

        def uuid(self) -> None:
            """None: torch caches no graph partitioned by this solver. What it computes depends on the planner,
            every helper it calls and this module's pricing; a key of less would serve stale partitions."""
            return None

        def __repr__(self) -> str:
            return f"PlannerSolver({self.name})"

    return PlannerSolver


def planner_solver(keep: Keep, name: str = "planner", random: str = "save") -> Any:
    """keep(ops, budget) -> the op keys to keep (lab 04's knapsack_keep or greedy_keep) as a CustomKnapsackSolver:
    set it as torch._functorch.config.activation_memory_budget_solver. Its .calls counts the partitioner's calls.
    random: "save" (no random op recomputed, see the module's doc) or "planner" (the random candidates planned
    as any other, and the random ops the candidates leave out not tagged: as torch's own solvers do)."""
    if random not in ("save", "planner"):
        raise ValueError(f"planner_solver: random={random!r}; allowed: 'save' (never recompute a random op) or "
                         "'planner' (plan them as any other op, as torch's solvers do)")
    if not custom_solvers_supported():
        raise ValueError(f"planner_solver: torch {torch.__version__} takes no custom knapsack solver "
                         "(torch._inductor.custom_graph_pass.CustomKnapsackSolver is from 2.13)")
    return _solver_type()(keep, name, random)
