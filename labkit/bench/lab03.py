"""Lab 03's benchmarks: segments (the √n U-curve against its model) and schedule (optimal against √n)."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from labkit.instruments.ledger import saved_tensors
from labkit.instruments.meter import measure_peak
from labkit.models import MLPChain, MLPConfig, layer_chain, mlp_input
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.timing import benchmark, compare

Run = Callable[[Sequence[nn.Module], torch.Tensor], torch.Tensor]  # run(layers, x) -> the chain's output


def mlp_chain(size: Sizes, n_layers: int) -> tuple[nn.Module, torch.Tensor]:
    """The lab's uniform chain, n_layers Linear+ReLU of size.chain_width, and an input that requires grad."""
    model = MLPChain(MLPConfig(n_layers=n_layers, width=size.chain_width)).to(size.device)
    x = mlp_input(model.cfg, batch=size.chain_batch, requires_grad=True, device=size.device)
    return model, x


def _with_grads(model: nn.Module, x: torch.Tensor) -> None:
    """Gradients that exist before a step (zeros): the step's peak above them is activations and temporaries."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    x.grad = torch.zeros_like(x)


def _step(model: nn.Module, x: torch.Tensor, run: Run | None) -> Callable[[], None]:
    layers = list(model.layers if hasattr(model, "layers") else model)

    def step() -> None:
        out = model(x) if run is None else run(layers, x)
        out.sum().backward()
    return step


def activation_peak(model: nn.Module, x: torch.Tensor, run: Run | None = None) -> int:
    """Live bytes above parameters, their gradients and the input at the peak of one step (run None: plain).

    The gradients exist before the step (zeros, accumulated into in place) and there is no optimizer, so
    nothing is made lazily by a first step: one measured step is the steady state.
    """
    _with_grads(model, x)
    meter = measure_peak(_step(model, x, run), track=(model, x))
    return meter.peak - meter.baseline


def step_time_ratio(model: nn.Module, x: torch.Tensor, run: Run, repeats: int = 3) -> float:
    """Median over alternating pairs of time(step with run) / time(plain step)."""
    _with_grads(model, x)
    return compare(_step(model, x, None), _step(model, x, run), repeats=repeats, warmup=1, device=x.device).ratio


def segment_constants(model: nn.Module, x: torch.Tensor, checkpoint: Callable[..., torch.Tensor]) -> dict[str, int]:
    """The segment model's constants, from the ledger and one plain step.

    input_bytes: what a checkpoint keeps (the ledger of the whole chain checkpointed as one segment);
    layer_bytes: what one layer keeps (the plain chain's ledger, less its input, per layer);
    extra_bytes: what backward holds besides saved activations (the plain step's peak less its ledger), plus
    the output of the segment being back-propagated, which the reentrant design holds (lab 02).
    """
    layers = list(model.layers)

    def whole(h: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            h = layer(h)
        return h

    input_bytes = saved_tensors(lambda h: checkpoint(whole, h), x, model=model).total_bytes
    plain = saved_tensors(model, x, model=model).total_bytes
    layer_bytes = (plain - input_bytes) // len(layers)
    output_bytes = x.numel() * x.element_size()
    extra_bytes = activation_peak(model, x) - plain + output_bytes
    return {"input_bytes": input_bytes, "layer_bytes": layer_bytes, "extra_bytes": extra_bytes}


def segments_sweep(checkpoint_segments: Callable[..., torch.Tensor], segment_peak: Callable[..., int],
                   checkpoint: Callable[..., torch.Tensor], size: Sizes, n_layers: int, ks: Sequence[int],
                   repeats: int = 3, progress: bool = True, timed: Sequence[int] | None = None) -> dict[str, Any]:
    """Measured activation peak, predicted peak and step time ratio of checkpoint_segments for each k in ks
    (the time only for the ks in `timed`, when given; None for the others)."""
    model, x = mlp_chain(size, n_layers)
    constants = segment_constants(model, x, checkpoint)
    none_bytes = activation_peak(model, x)
    rows = []
    for k in tqdm(list(ks), desc=f"n={n_layers}: segments", disable=not progress, leave=False):
        run = (lambda layers, h, k=k: checkpoint_segments(layers, h, k, checkpoint))
        # the lab's own functions first, the timing last: an unfinished exercise fails at once
        predicted, measured = segment_peak(n_layers, k, **constants), activation_peak(model, x, run)
        ratio = None if timed is not None and k not in timed else round(step_time_ratio(model, x, run, repeats), 4)
        rows.append({"segments": k, "measured_bytes": measured, "predicted_bytes": predicted,
                     "step_time_ratio": ratio})
    best = min(rows, key=lambda r: (r["measured_bytes"], r["segments"]))["segments"]
    error = max(abs(r["measured_bytes"] - r["predicted_bytes"]) / r["measured_bytes"] for r in rows)
    return {"n_layers": n_layers, "none_bytes": none_bytes, "rows": rows, "best_segments": best,
            "max_rel_error": round(error, 6), "constants": constants}


def segments(size: Sizes | None = None) -> dict[str, Any]:
    """Lab 03's reference checkpoint_segments on the longest chain of the profile (n = 64 on `cpu`)."""
    from labkit.labs.recompute import checkpoint
    from labkit.labs.sqrt_n import checkpoint_segments, segment_peak

    size = size or sizes()
    n = max(size.chain_layers)
    ks = sorted({2 ** i for i in range(int(math.log2(n)) + 1)} | {round(math.sqrt(n))})
    out = segments_sweep(checkpoint_segments, segment_peak, checkpoint, size, n, ks, progress=False)
    del out["constants"]
    return out


# ------------------------------------------------------------------ schedule
def hetero_chain(size: Sizes, n_layers: int) -> tuple[nn.Sequential, torch.Tensor]:
    """Heavy and light layers alternating (Linear+GELU, GELU alone), half the lab's width, and an input."""
    width = max(8, size.chain_width // 2)
    chain = layer_chain("HL" * (n_layers // 2), width).to(size.device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(size.chain_batch, width, generator=gen).to(size.device).requires_grad_()
    return chain, x


def _random_costs(ChainCosts: type, n: int, rng: np.random.Generator) -> Any:
    """A chain of n layers with random costs; each layer's act includes its own input, as the model assumes."""
    inp = [int(v) for v in rng.integers(1, 5, n)]
    return ChainCosts([i + int(v) for i, v in zip(inp, rng.integers(0, 8, n))], inp, [float(v) for v in rng.random(n)])


def schedule(size: Sizes | None = None) -> dict[str, Any]:
    """Lab 03's optimal schedule against √n on the heterogeneous chain, at the budget √n needs."""
    import labkit.labs.sqrt_n as S
    from labkit.labs.recompute import checkpoint

    size = size or sizes()
    n = max(size.chain_layers) // 2
    chain, x = hetero_chain(size, n)
    costs = S.profile_chain(chain, x)
    sqrt_n = S.uniform_schedule(n, round(math.sqrt(n)))
    budget = S.peak_of(sqrt_n, costs)
    optimal = S.schedule_for(costs, budget)
    plain = benchmark(_step(chain, x, None), warmup=1, repeats=size.repeats).median
    out: dict[str, Any] = {"budget_bytes": budget}
    for name, sched in (("optimal", optimal), ("sqrt_n", sqrt_n)):
        run = (lambda layers, h, sched=sched: S.run_schedule(layers, h, sched, checkpoint))
        seconds = benchmark(_step(chain, x, run), warmup=1, repeats=size.repeats).median
        out[name] = {"measured_bytes": activation_peak(chain, x, run), "predicted_bytes": S.peak_of(sched, costs),
                     "recompute_cost": S.recompute_cost(sched, costs), "recompute_s": round(seconds - plain, 6),
                     "segments": [[s.start, s.stop, "recompute" if s.recompute else "store"] for s in sched]}
    rng = np.random.default_rng(0)
    big = _random_costs(S.ChainCosts, 1000, rng)
    start = time.perf_counter()
    S.plan(big, 16 * int(math.sqrt(1000)))
    out["solve_seconds_n1000"] = round(time.perf_counter() - start, 4)
    return out  # the planner against exhaustive search is a test: tests/test_reference_lab03.py


# ------------------------------------------------------------------ optimal
def _revolve_rows(longest: int = 64, most: int = 8) -> dict[str, Any]:
    """The optimum on uniform chains, n <= longest and s = 1..most, against checkpoint_schedules' counts: reduced to
    Revolve's model (revolve_model), equal to binomial Revolve's with s slots; reduced to the mixed schedules'
    (a kept input and a taped output one unit, s + 1 units, one of them the state being advanced), between
    Maddison's mixed schedules' with s + 1 and with s slots (the state free there)."""
    from labkit.planners import persistent as P
    try:
        from checkpoint_schedules.mixed import optimal_steps_mixed
        from checkpoint_schedules.multistage import optimal_steps_binomial
    except ImportError:
        return {"revolve": "checkpoint-schedules is not installed (pip install checkpoint-schedules)"}
    mixed = lambda n, s: n if s >= n - 1 else optimal_steps_mixed(n, s)  # noqa: E731
    equal = within = revolve = cases = 0
    for n in range(2, longest + 1):
        costs = P.OpCosts([1] * n + [0], [0] * (n + 1), *([[0] * n] * 4), [1.0] * n)
        for s in range(1, most + 1):
            forwards = P.simulate(P.optimal_ops(costs, s + 1), costs)[1]
            cases += 1
            equal += forwards == mixed(n, s)
            within += mixed(n, s + 1) <= forwards <= mixed(n, s)
            reduced, budget = P.revolve_model(n, s)
            steps = P.simulate(P.optimal_ops(reduced, budget), reduced)[1]
            revolve += steps == optimal_steps_binomial(n, min(s, n - 1))
    return {"revolve_cases": cases, "matches_revolve": revolve == cases, "mixed_within_bounds": within == cases,
            "mixed_equal": equal}


def drawn_op_costs(rng: np.random.Generator, n: int) -> Any:
    """Made-up OpCosts of n layers with small integer bytes (a gradient's apart from its tensor's), for
    exhaustive search."""
    from labkit.planners import persistent as P

    x = [int(v) for v in rng.integers(1, 4, n + 1)]
    draw = lambda low, k: [low[i] + int(v) for i, v in enumerate(rng.integers(0, 3, k))]  # noqa: E731
    grad = [int(v) for v in rng.integers(1, 5, n)] + [1]
    return P.OpCosts(x, grad, [int(v) for v in rng.integers(0, 3, n)], draw(x[1:], n),
                     [v + int(w) for v, w in zip(x[1:], rng.integers(0, 7, n))], draw(grad[:n], n),
                     [float(v) for v in rng.integers(1, 6, n)], int(rng.integers(0, 3)))


def _exhaustive(rng: np.random.Generator, chains: int = 6, longest: int = 6) -> bool:
    """optimal_ops against the best of every persistent schedule, simulated, on drawn chains, at every budget."""
    from labkit.planners import persistent as P

    for _ in range(chains):
        n = int(rng.integers(1, longest + 1))
        costs = drawn_op_costs(rng, n)
        simulated = [P.simulate(ops, costs) for ops in P.all_schedules(n)]
        for budget in sorted({peak for peak, _ in simulated}):
            ops = P.optimal_ops(costs, budget)
            best = min(cost for peak, cost in simulated if peak <= budget)
            if ops is None or P.simulate(ops, costs)[0] > budget or abs(P.simulate(ops, costs)[1] - best) > 1e-9:
                return False
    return True


def other_ops(n: int, chain_costs: Any) -> list[tuple[str, list]]:
    """Lab 03's other schedules of an n-layer chain as (name, ops): the recursion, √n segments (k = 2, √n, n/2)
    and the one-level planner at four budgets from its least to storing everything (chain_costs: ChainCosts)."""
    import labkit.labs.sqrt_n as S
    from labkit.planners import persistent as P

    out = [("recursive", P.recursive_ops(n))]
    out += [(f"sqrt_n k={k}", P.segments_ops(S.uniform_schedule(n, k), n)) for k in (2, round(math.sqrt(n)), n // 2)]
    low, high = S.least_budget(chain_costs), S.peak_of([S.Segment(0, n, False)], chain_costs)
    return out + [("one-level planner", P.segments_ops(S.schedule_for(chain_costs, b), n))
                  for b in sorted({low + (high - low) * k // 3 for k in range(4)})]


def budget_sources(least: int, top: int, others: Sequence[tuple[str, int]]) -> dict[int, list[str]]:
    """Why lab 03 runs the optimum at each budget: "sweep k/5" for the six from the least that fits (0/5) to
    storing everything (`top`, 5/5), and "NAME's peak" for each other schedule (name, peak) whose peak it is."""
    out: dict[int, list[str]] = {}
    for k in range(6):
        out.setdefault(least + (top - least) * k // 5, []).append(f"sweep {k}/5")
    for name, peak in others:
        label = f"{name}'s peak"
        if label not in out.setdefault(peak, []):
            out[peak].append(label)
    return out


def optimal_budgets(least: int, top: int, peaks: Sequence[int]) -> list[int]:
    """The budgets lab 03 runs the optimum at: six from the least that fits to storing everything (`top`), and
    each other schedule's peak."""
    return sorted(budget_sources(least, top, [("", peak) for peak in peaks]))


def optimal_rows(chain: nn.Sequential, x: torch.Tensor, repeats: int = 3) -> dict[str, Any]:
    """Lab 03's recursion, √n segments (k = 2, √n, n/2) and the one-level planner (four budgets) as ops, and the
    optimal persistent schedule at six budgets from the least that fits to storing everything and at each of
    theirs' peak (each optimal row's "at" says which: "sweep k/5", "NAME's peak"; None on the other rows), each
    run by run_ops: its measured and predicted peaks, its forward cost (in forward passes,
    from the profile's per-layer seconds) and whether its gradients are the plain chain's, bitwise; and
    whether the optimum at every other schedule's peak costs no more than it; and the profile (`costs`). The
    optimum's tables are filled once, at storing everything's peak, and read back at every budget."""
    import labkit.labs.sqrt_n as S
    from labkit.planners import persistent as P

    layers, n = list(chain), len(chain)
    costs = P.profile_ops(chain, x, repeats=repeats)
    chain_costs = S.profile_chain(chain, x)
    chain.zero_grad(set_to_none=True)
    x.grad = None
    chain(x).sum().backward()
    want = [p.grad.clone() for p in chain.parameters()] + [x.grad.clone()]

    def run(name: str, ops: list, budget: int | None = None) -> dict[str, Any]:
        predicted, cost = P.simulate(ops, costs)
        measured = activation_peak(chain, x, lambda ls, h: P.run_ops(ls, h, ops))
        chain.zero_grad(set_to_none=True)
        x.grad = None
        P.run_ops(layers, x, ops).sum().backward()
        bitwise = all(torch.equal(a, b) for a, b in zip(want, [p.grad for p in chain.parameters()] + [x.grad]))
        return {"name": name, "budget": budget, "predicted_peak": predicted, "measured_peak": measured,
                "forward_cost": round(cost / sum(costs.fwd), 4), "bitwise": bitwise, "cost": cost}

    rows = [run(name, ops) for name, ops in other_ops(n, chain_costs)]
    top = P.simulate(P.store_all(n), costs)[0]
    tables = P.tables_for(costs, top)  # one fill for every budget below (a fill each: 13, 5 s each at n = 128)
    least = tables.least()
    sources = budget_sources(least, top, [(r["name"], r["measured_peak"]) for r in rows])
    mine = {b: {**run("optimal", tables.ops(b), b), "at": ", ".join(sources[b])} for b in sorted(sources)}
    bounded = all(mine[r["measured_peak"]]["cost"] <= r["cost"] * (1 + 1e-12) for r in rows)
    rows = [*mine.values(), *({**r, "at": None} for r in rows)]
    for r in rows:
        del r["cost"]
    return {"least_budget": least, "optimal_bounds_the_others": bounded, "rows": rows, "costs": costs,
            "tables": tables}


def solve_all_budgets_seconds(chain: nn.Sequential, x: torch.Tensor) -> float:
    """Seconds to solve every budget lab 03 (optimal_rows) runs the optimum at on `chain`, profiled: the tables
    filled once, the least budget and each budget's schedule read back and simulated (the other schedules'
    peaks, which run_ops meets to the byte, simulated rather than run)."""
    import labkit.labs.sqrt_n as S
    from labkit.planners import persistent as P

    costs = P.profile_ops(chain, x, repeats=1)
    peaks = [P.simulate(ops, costs)[0] for _, ops in other_ops(len(chain), S.profile_chain(chain, x))]
    start = time.perf_counter()
    top = P.simulate(P.store_all(costs.n), costs)[0]
    tables = P.tables_for(costs, top)
    for budget in optimal_budgets(tables.least(), top, peaks):
        if tables.ops(budget) is None:
            raise RuntimeError(f"solve_all_budgets_seconds: nothing fits {budget:,} B, at or above the least budget")
    return time.perf_counter() - start


def optimal(size: Sizes | None = None) -> dict[str, Any]:
    """The optimal persistent schedule on lab 03's heterogeneous chain: run at a sweep of budgets from the least
    that fits to storing everything, beside √n segments, the recursion and the one-level planner run as ops by
    the same executor; held against Revolve and exhaustive search; its solve time on the lab's longest chain."""
    import labkit.labs.sqrt_n as S
    from labkit.planners import persistent as P

    size = size or sizes()
    n = max(size.chain_layers) // 2
    chain, x = hetero_chain(size, n)
    recursive_peak = activation_peak(chain, x, lambda ls, h: S.checkpoint_recursive(ls, h))
    found = optimal_rows(chain, x, size.repeats)
    rows, costs, tables = found["rows"], found.pop("costs"), found.pop("tables")
    # what counting memory in 2048 units of the largest budget costs (the one fill the rows read back, coarser
    # for a smaller budget): the optimum at the sweep's budgets, against its own fill in 4 times finer units
    sweep = sorted(r["budget"] for r in rows if r["name"] == "optimal")[::3]
    ratios = [P.simulate(tables.ops(b), costs)[1] / P.simulate(P.optimal_ops(costs, b, most=8192), costs)[1]
              for b in sweep]
    long_chain, long_x = mlp_chain(size, max(size.chain_layers))
    long_costs = P.profile_ops(nn.Sequential(*long_chain.layers), long_x, repeats=1)
    long_top = P.simulate(P.store_all(long_costs.n), long_costs)[0]
    start = time.perf_counter()
    P.optimal_ops(long_costs, long_top // 3)
    solve = time.perf_counter() - start
    # the gpu profile's lab 03 chain is 128 layers: hetero_chain at 128 layers, at this profile's sizes (on gpu
    # the lab's own chain; elsewhere narrower tensors, in about as many units, so the tables are as large)
    all_budgets = solve_all_budgets_seconds(*hetero_chain(size, 128))
    return {"n_layers": n, "recursive_peak": recursive_peak, "least_budget": found["least_budget"],
            "least_budget_at_most_recursive_peak": found["least_budget"] <= recursive_peak,
            "exact": all(r["measured_peak"] == r["predicted_peak"] for r in rows),
            "bitwise": all(r["bitwise"] for r in rows), "optimal_bounds_the_others": found["optimal_bounds_the_others"],
            "matches_exhaustive": _exhaustive(np.random.default_rng(0)), **_revolve_rows(),
            "solve_seconds_n64": round(solve, 3), "n_long": long_costs.n,
            "solve_all_budgets_seconds_n128": round(all_budgets, 3),
            "units": 2048, "cost_against_8192_units_max": round(max(ratios), 4), "rows": rows}
