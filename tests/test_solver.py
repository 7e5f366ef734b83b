"""Lab 04's knapsack as torch.compile's partitioner solver (labkit.planners.solver) and `bench compile`."""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import labkit as lk
from labkit.bench.compile import peak_monotone, solver_rows
from labkit.planners.solver import SCALE, custom_solvers_supported, node_records, planner_solver
from labkit.reference.selective import knapsack_keep

pytestmark = pytest.mark.skipif(not custom_solvers_supported(), reason="torch < 2.13 takes no custom solver")


def _graph() -> tuple[list[fx.Node], fx.Graph]:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.ops.aten.mm.default, (x, x))
    d = g.call_function(torch.ops.aten.native_dropout.default, (a, 0.1, True))
    r = g.call_function(torch.ops.aten.relu.default, (a,))
    g.output((d, r))
    return [r, a, d], g  # as the partitioner lists them: largest first, not in graph order


def test_the_partitioners_candidates_become_op_records_in_graph_order():
    nodes, _ = _graph()
    ops = node_records([0.25, 0.5, 0.125], nodes, price=lambda n: 3.0)
    assert [r.key for r in ops] == ["1:mm_default", "2:native_dropout_default", "0:relu_default"]  # graph order; keys keep the index
    assert [r.output_bytes for r in ops] == [SCALE // 2, SCALE // 8, SCALE // 4]
    assert [r.random for r in ops] == [False, True, False] and all(r.seconds == 3.0 for r in ops)
    with pytest.raises(ValueError, match="2 memory figures for 3 nodes"):
        node_records([0.1, 0.2], nodes, price=lambda n: 1.0)


def test_the_solver_returns_what_the_planner_keeps_and_refuses_what_it_invents(monkeypatch):
    import labkit.planners.solver as S

    monkeypatch.setattr(S, "flop_price", lambda node: 100.0 if node.name == "mm_default" else 1.0)
    nodes, g = _graph()
    seen = []
    solver = planner_solver(lambda ops, budget: seen.append((ops, budget)) or knapsack_keep(ops, budget), "mine",
                            random="planner")
    saved, recomputed = solver([0.25, 0.5, 0.125], g, 0.5, None, nodes)
    assert seen[0][1] == SCALE // 2 and solver.calls == 1
    assert saved == [1] and recomputed == [0, 2]  # the mm: most seconds within half the span; the dropout redrawn
    bad = planner_solver(lambda ops, budget: {"9:nothing"}, "bad")
    with pytest.raises(ValueError, match=r"kept \['9:nothing'\], which are not among the partitioner's"):
        bad([0.25, 0.5, 0.125], g, 0.5, None, nodes)
    assert solver.uuid() is None  # torch caches nothing this solver partitioned (see its docstring)
    with pytest.raises(ValueError, match="random='replay'"):
        planner_solver(knapsack_keep, random="replay")


def test_by_default_the_solver_never_recomputes_a_random_op(monkeypatch):
    """Under compile nothing replays the RNG for a recomputed random op (pytorch/pytorch#190758): a random
    candidate is saved whatever the budget, charged to it before the planner plans the rest; a random node the
    partitioner did not offer is tagged MUST_SAVE, so the min-cut after the solver cannot recompute it either."""
    import labkit.planners.solver as S
    from torch.utils.checkpoint import CheckpointPolicy

    monkeypatch.setattr(S, "flop_price", lambda node: 100.0 if node.name == "mm_default" else 1.0)
    nodes, g = _graph()
    seen = []
    solver = planner_solver(lambda ops, budget: seen.append((ops, budget)) or knapsack_keep(ops, budget), "mine")
    saved, recomputed = solver([0.25, 0.5, 0.125], g, 0.5, None, nodes)
    assert [r.key for r in seen[0][0]] == ["1:mm_default", "0:relu_default"]  # the dropout is not the planner's
    assert seen[0][1] == SCALE // 2 - SCALE // 8  # the dropout's bytes come off the budget
    assert saved == [0, 2] and recomputed == [1]  # the mm no longer fits; the dropout is saved
    assert solver([0.25, 0.5, 0.125], g, 0.0, None, nodes)[0] == [2]  # at no budget at all, still saved
    assert solver.random_offered == ["2:native_dropout_default"] * 2 and solver.random_tagged == []
    # a random node outside the candidates (aten.rand, as aot_eager_decomp_partition decomposes dropout)
    x = next(n for n in g.nodes if n.op == "placeholder")
    with g.inserting_after(x):
        rand = g.call_function(torch.ops.aten.rand.default, ([4, 4],))
        tagged_before = g.call_function(torch.ops.aten.rand.default, ([4, 4],))
    tagged_before.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE  # a policy's tag is the policy's
    solver([0.25, 0.5, 0.125], g, 0.5, None, nodes)
    assert solver.random_tagged == [rand.name] and rand.meta["recompute"] == CheckpointPolicy.MUST_SAVE
    assert tagged_before.meta["recompute"] == CheckpointPolicy.MUST_RECOMPUTE
    eager = planner_solver(knapsack_keep, "eager", random="planner")
    eager([0.25, 0.5, 0.125], g, 0.5, None, nodes)
    assert eager.random_tagged == [] and eager.random_offered == ["2:native_dropout_default"]


def test_the_random_op_policy_saves_random_ops_and_leaves_the_rest_to_the_partitioner():
    from torch.utils.checkpoint import CheckpointPolicy

    from labkit.planners.solver import _save_random_ops, random_saved_context

    assert _save_random_ops(None, torch.ops.aten.rand.default) == CheckpointPolicy.MUST_SAVE
    assert _save_random_ops(None, torch.ops.aten.native_dropout.default) == CheckpointPolicy.MUST_SAVE
    assert _save_random_ops(None, torch.ops.aten.mm.default) == CheckpointPolicy.PREFER_SAVE
    forward, recompute = random_saved_context()  # as torch.utils.checkpoint enters a context_fn's pair
    assert forward is not None and recompute is not None


def test_prices_are_the_flops_estimators_even_where_torch_calls_the_solver():
    """torch calls a custom solver under no_dispatch(), where estimate_runtime's FlopCounterMode counts nothing
    (every node would cost 1): flop_price reads the same formulas from the node's shapes."""
    from torch._functorch.partitioners import estimate_runtime
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._mode_utils import no_dispatch
    from labkit.planners.solver import flop_price

    def f(a, b):
        return torch.relu(torch.mm(a, b)) @ b

    gm = make_fx(f, tracing_mode="fake")(torch.randn(8, 16), torch.randn(16, 16))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    want = [estimate_runtime(n) for n in nodes]
    assert max(want) == 2 * 8 * 16 * 16  # an mm's FLOPs, counted outside no_dispatch
    with no_dispatch():
        assert [estimate_runtime(n) for n in nodes] == [1] * len(nodes)  # torch's own estimate, where it calls us
        assert [flop_price(n) for n in nodes] == want


def test_inside_a_real_compile_the_planner_sees_flop_prices():
    model, x = lk.bench.long_stack(lk.sizes("tiny"))
    seen = []
    keep = lambda ops, budget: seen.extend(ops) or knapsack_keep(ops, budget)  # noqa: E731
    solver_rows(model, x, keep, budgets=(0.2,), solvers=("planner",), repeats=1)
    assert seen and max(r.seconds for r in seen) > 1  # priced by FLOPs, not all at the floor of 1


def test_the_planner_runs_inside_torch_compile_and_its_plan_is_measured():
    """At a budget where the knapsack runs, dp and the planner with the eager rule draw the dropouts again in
    backward (pytorch/pytorch#190758): loss equal to budget 1's, gradients not; the planner (random ops saved) and
    dp under the random-op policy train budget 1's gradients, no random op run in backward."""
    model, x = lk.bench.long_stack(lk.sizes("tiny"))
    rows = solver_rows(model, x, knapsack_keep, budgets=(0.2,), solvers=("planner", "planner-eager", "dp", "policy"),
                       repeats=1)
    mine, eager, dp, policy = rows
    assert mine["solver_calls"] == eager["solver_calls"] == len(model.blocks)  # asked once per block's graph
    assert all(r["measured_peak"] > 0 and {"step_ratio", "bitwise"} <= set(r) for r in rows)
    assert mine["random_offered"] == 0 and mine["random_tagged"] == 3 * len(model.blocks)  # aten.rand, not offered
    assert [r["backward_draws"] for r in rows] == [0, 3 * len(model.blocks), 3 * len(model.blocks), 0]
    assert [r["same_as_budget_1"] for r in rows] == [True, False, False, True]


def test_a_solver_that_fails_is_a_row_and_the_peaks_order_is_judged_per_solver():
    model, x = lk.bench.long_stack(lk.sizes("tiny"))
    (row,) = solver_rows(model, x, None, budgets=(0.5,), solvers=("planner",), repeats=1)
    assert "needs keep=" in row["error"]
    with pytest.raises(ValueError, match="'simplex'.*planner-eager, policy"):
        solver_rows(model, x, None, solvers=("simplex",))
    rows = [{"solver": "dp", "budget": b, "measured_peak": p} for b, p in ((0.2, 5), (0.5, 7), (0.8, 6))]
    rows += [{"solver": "ilp", "budget": b, "measured_peak": p} for b, p in ((0.2, 5), (0.8, 6))]
    rows += [{"solver": "greedy", "budget": 0.2, "error": "x"}]
    assert peak_monotone(rows) == {"dp": False, "ilp": True, "greedy": None}


def test_compile_tags_every_node_by_the_policy_and_saves_only_what_it_must():
    from labkit.bench.compile import compile_tags
    from labkit.instruments.ops import trace
    from labkit.reference.selective import selective_keep, torch_policy

    model, x = lk.bench.long_stack(lk.sizes("tiny"))
    block = model.blocks[0]
    keep = selective_keep(trace(block, x, model=block, repeats=1))
    found = compile_tags(block, x, torch_policy(keep))
    must, prefer = found["MUST_SAVE"], found["PREFER_RECOMPUTE"]
    assert must["tagged"] >= len(keep)  # a kept multi-output op is a tuple node and its getitems, each tagged
    assert 0 < must["saved"] <= must["tagged"]
    # none of the MUST_SAVE nodes left unsaved is rebuilt: they are tuples (never saved) or read by no backward node
    assert must["rebuilt"] == 0 and must["tuples"] > 0
    assert must["saved"] + must["tuples"] + must["unread"] == must["tagged"]
    assert prefer["tagged"] > 0 and prefer["saved"] == 0
    # PREFER_RECOMPUTE is a must for the partitioner (must_recompute): core attention's matrix products, which the
    # min-cut never recomputes on its own, are run again in backward
    assert prefer["matmuls"] == prefer["matmuls_rebuilt"] == 2
    # the block's input and weights (8 graph inputs), and the RNG state of the one dropout the policy recomputes
    assert found["saved_inputs"] == 8 and found["saved_rng_states"] == 1 and found["saved_untagged_ops"] == 0


def test_compile_tags_runs_under_a_meter_and_the_meter_sees_its_graphs():
    """A whole notebook measured under one MemoryMeter (tools/lab_peaks.py) once made dynamo refuse this compile
    (a dispatch mode active): the compile steps outside the meter, and its graphs run inside it."""
    from labkit.bench.compile import compile_tags
    from labkit.instruments.ops import trace
    from labkit.reference.selective import selective_keep, torch_policy

    model, x = lk.bench.long_stack(lk.sizes("tiny"))
    block = model.blocks[0]
    keep = selective_keep(trace(block, x, model=block, repeats=1))
    alone = compile_tags(block, x, torch_policy(keep))
    torch._dynamo.reset()
    with lk.MemoryMeter(history=True) as meter:
        metered = compile_tags(block, x, torch_policy(keep))
    assert metered == alone
    # the compiled forward graph's own ops, counted in forward (the eager code around it runs only sum and
    # ones_like there): its matrix products and the rng wrapper of its checkpointed dropout
    forward = {e.op for e in meter.timeline if e.phase == "forward"}
    assert {"addmm", "bmm", "run_and_save_rng_state"} <= forward, forward


def test_a_meter_counts_only_the_compiled_graphs_of_its_own_thread():
    """Dispatch modes are a thread's own: a compiled call in a thread with no meter is not counted by a meter
    another thread entered (nor does it run inside that meter's mode)."""
    import threading

    from labkit.instruments.compiled import Compiled

    def f(t):
        return (t * 2).sin() + 1

    compiled, x = Compiled(f, 1.0), torch.randn(64)
    compiled(x)  # compiled here, before the meter, so only running is measured below
    entered, leave = threading.Event(), threading.Event()
    seen: list = []

    def measure():
        with lk.MemoryMeter(history=True) as meter:
            entered.set()
            leave.wait(60)
        seen.extend(e.op for e in meter.timeline)

    other = threading.Thread(target=measure)
    other.start()
    entered.wait(60)
    with compiled.check_ran("the main thread's call"):
        compiled(x)
    leave.set()
    other.join()
    assert seen == [], seen


def test_a_ledger_inside_a_meter_still_sees_a_compiled_graph():
    """outside_meters sets aside every mode of the thread, not only meters, and the graph runs inside all of them:
    a ledger (its own dispatch mode) nested in a meter still records what the compiled code saves."""
    from labkit.instruments import saved_tensors
    from labkit.instruments.compiled import Compiled

    lin = torch.nn.Linear(16, 16)
    compiled, x = Compiled(lambda t: torch.relu(lin(t)), 1.0), torch.randn(8, 16, requires_grad=True)
    alone = saved_tensors(compiled, x).total_bytes
    with lk.MemoryMeter():
        nested = saved_tensors(compiled, x).total_bytes
    assert nested == alone > 0


def test_where_the_partitioner_offers_the_random_ops_the_solver_saves_them():
    """The other way random ops come back (pytorch/pytorch#190758): without decompositions (backend aot_eager)
    native_dropout stays one op, banned by name, so it is among the knapsack's candidates, and a solver that
    recomputes it redraws: lab 04's knapsack with its eager rule recomputes the earlier dropouts. By default the
    solver saves them, and trains the gradients of the same blocks compiled at budget 1."""
    from labkit.bench.lab02 import stack_step
    from labkit.instruments.compiled import Compiled, RandomDraws

    model, x = lk.bench.long_stack(lk.sizes("tiny"))

    def step(budget, solver):
        compiled = {id(b): Compiled(b.forward, budget, backend="aot_eager", solver=solver) for b in model.blocks}
        run = lambda block, y: compiled[id(block)](y)  # noqa: E731
        stack_step(model, x, run)()  # compiles
        with RandomDraws() as draws:
            stack_step(model, x, run)()
        return draws.count("backward"), [p.grad.clone() for p in model.parameters()]

    _, want = step(1.0, "dp")
    eager, saved = planner_solver(knapsack_keep, random="planner"), planner_solver(knapsack_keep)
    (redrawn, wrong), (none, right) = step(0.1, eager), step(0.1, saved)
    assert eager.random_offered and eager.random_offered == saved.random_offered  # native_dropout, offered
    assert redrawn > 0 and not all(map(torch.equal, wrong, want))
    assert none == 0 and all(map(torch.equal, right, want)) and saved.random_tagged == []
