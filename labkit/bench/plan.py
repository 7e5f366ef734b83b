"""Lab 07's measurements: a plan for a budget against the fixed schemes, and the largest batch each one fits.

``capstone`` builds the lab's language model and measures its profile, ``budget_between`` draws a budget: both
are labkit.planners.capstone's, which the leaderboard shares, named here as the lab calls them. ``rows`` runs
each plan for real: the meter's peak of a steady training step against the predicted one, and the step time
over the plain step's (medians of alternating runs) against the predicted ratio. ``batch_rows`` finds, by
bisection with the meter, the largest batch whose step fits a budget under each scheme, the planner re-planning
at every batch it tries from the bytes ``at_batch`` draws through two measured batches. ``plan`` is `labkit
bench plan`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from labkit.models import GPT, GPTConfig, gpt_tokens, next_token_loss
from labkit.env.profile import sizes
from labkit.env.sizes import Sizes
from labkit.instruments.gradients import judge
from labkit.instruments.meter import MemoryMeter
from labkit.instruments.tensors import cuda_devices
from labkit.instruments.timing import benchmark, compare
from labkit.planners import applied, largest_batch, measure_step, profile_model
from labkit.planners.capstone import Capstone, budget_between, capstone, capstone_config
from labkit.planners.measuring import train_step, train_steps
from labkit.plans import SCHEMES, BlockCosts, Option, Profile, Step, describe, peak_of, scheme_plan, step_ratio

__all__ = ["Capstone", "capstone_config", "capstone", "budget_between", "rows", "MEASURED", "at_batch", "batch_rows",
           "batch_profiles", "predicted_batch", "batch_ceiling", "step_meters",
           "random_profile", "planning_seconds", "train_losses", "plan"]


def _steady(model: nn.Module, tokens: torch.Tensor) -> tuple[nn.Module, torch.optim.Optimizer, Callable]:
    model = copy.deepcopy(model)
    return model, torch.optim.Adam(model.parameters()), lambda out: next_token_loss(out, tokens)


def _timed_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> Callable[[], None]:
    return train_step(model, opt, tokens, lambda out: next_token_loss(out, tokens))


def _planned_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor,
                  plan: Sequence[Step]) -> Callable[[], None]:
    step = _timed_step(model, opt, tokens)

    def run() -> None:
        with applied(model, plan):  # cheap to enter: patching forwards (the selective policy is cached)
            step()
    return run


def rows(c: Capstone, plans: dict[str, list[Step]], budget: int, repeats: int = 5,
         judged: bool = False) -> list[dict[str, Any]]:
    """Each plan run for real on one copy of the model: predicted and measured peak, fits (measured peak <=
    budget), predicted and measured step time over the plain step's (median of `repeats` alternating pairs). With
    `judged` (`labkit bench plan`), also its one-step gradients judged against the plain step's
    (labkit.instruments.gradients: `gradients`, `gradient_difference`), and a plan judged wrong does not fit."""
    out = []
    with torch.random.fork_rng(devices=cuda_devices(c.tokens)):
        model, opt, loss = _steady(c.model, c.tokens)
        for name, plan in plans.items():
            measured = measure_step(model, opt, c.tokens, loss, plan)
            verdict = judge(model, c.tokens, loss, lambda plan=plan: applied(model, plan)).fields() if judged else {}
            ratio = compare(_timed_step(model, opt, c.tokens), _planned_step(model, opt, c.tokens, plan),
                            repeats=repeats, warmup=1, device=c.tokens.device).ratio
            out.append({"name": name, "plan": describe(plan), "predicted_peak": peak_of(plan, c.profile),
                        "measured_peak": measured,
                        "fits": measured <= budget and verdict.get("gradients") != "wrong", **verdict,
                        "predicted_step_ratio": step_ratio(plan, c.profile), "measured_step_ratio": ratio})
    return out


MEASURED = (2, 3)  # the batches at_batch draws its line through


def at_batch(low: Profile, high: Profile, batch: int, measured: tuple[int, int] = MEASURED) -> Profile:
    """The profile at `batch`, from the bytes measured at two batches (`measured`: low's and high's), along the
    line through them (every block's bytes grow by the same amount per sequence; base and floor nearly so: the
    tests measure how near); the seconds are low's. Batch 1 is not one of the two: there a selective block's
    backward peaks where its gradients, not its activations, decide, off the line the others follow."""
    a, b = measured
    at = lambda x, y: max(0, x + (batch - a) * (y - x) // (b - a))  # noqa: E731

    def way(o: Option, p: Option) -> Option:  # below the two batches a selective block's lines can cross
        kept = at(o.kept, p.kept)
        return Option(kept, max(kept, at(o.held, p.held)), o.seconds)
    blocks = tuple(BlockCosts(at(x.act, y.act), at(x.inp, y.inp), x.fwd,
                              {k: way(o, y.options[k]) for k, o in x.options.items()}, at(x.beside, y.beside))
                   for x, y in zip(low.blocks, high.blocks))
    return Profile(blocks, at(low.base, high.base), at(low.floor, high.floor), low.step)


def _tokens(cfg: GPTConfig, vocab: int, batch: int, device: str) -> torch.Tensor:
    return gpt_tokens(dataclasses.replace(cfg, batch=batch), vocab, device=device)


def _metered_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, plan: Sequence[Step]) -> int:
    """The meter's peak of one step under the plan (gradients and Adam's state already there: a steady step)."""
    with applied(model, plan), MemoryMeter(model, opt, tokens, device=tokens.device) as meter:
        _timed_step(model, opt, tokens)()
    return meter.peak


def step_meters(c: Capstone, plans: dict[str, Sequence[Step]]) -> dict[str, MemoryMeter]:
    """One steady training step (gradients and Adam's state already there) of a copy of the model under each
    plan, each under a meter that records every tensor's life (lk.plots.lifetimes, lk.widgets.step_player)."""
    out = {}
    with torch.random.fork_rng(devices=cuda_devices(c.tokens)):
        for name, plan in plans.items():
            model, opt, _ = _steady(c.model, c.tokens)
            step = _timed_step(model, opt, c.tokens)
            with applied(model, plan):
                step()
                with MemoryMeter(model, opt, c.tokens, device=c.tokens.device, lifetimes=True) as meter:
                    step()
            out[name] = meter
    return out


OVER = 1.25  # a batch whose predicted peak is this far over the budget is not run (see batch_rows)


def batch_profiles(size: Sizes, reference: Profile) -> tuple[Profile, Profile]:
    """The lab's model profiled at the batches at_batch draws its line through (MEASURED), bytes only (its times
    are reference's); the model and the generators are left as they were."""
    cfg, vocab = capstone_config(size, 1)
    with torch.random.fork_rng(devices=cuda_devices(torch.empty(0, device=size.device))):
        model = GPT(cfg, vocab).to(size.device)
        one, two = (profile_model(model, t, lambda out, t=t: next_token_loss(out, t), repeats=1,
                                  seconds_from=reference)
                    for t in (_tokens(cfg, vocab, b, size.device) for b in MEASURED))
    return one, two


def batch_ceiling(start: int) -> int:
    """How far a batch search from `start` (the profile's batch) may go: 16x it, at least 64. The gpu profile's
    batch grows with the card (x94 on 141 GiB), so no constant fits every card."""
    return max(64, 16 * start)


def predicted_batch(one: Profile, two: Profile, planner: Callable[[Profile, int], list[Step] | None], budget: int,
                    start: int = 1, most: int | None = None) -> int:
    """The largest batch (up to `most`, by default batch_ceiling(start)) the planner finds a plan for within
    `budget`, from the bytes at_batch draws through `one` and `two`: predicted, not measured (batch_rows measures)."""
    return largest_batch(lambda b: planner(at_batch(one, two, b), budget) is not None, start,
                         batch_ceiling(start) if most is None else most)


def batch_rows(size: Sizes, budget: int, planner: Callable[[Profile, int], list[Step] | None],
               reference: Profile, most: int | None = None, repeats: int = 3,
               timed: bool = True) -> list[dict[str, Any]]:
    """For each scheme and the planner: the largest batch (up to `most`, by default batch_ceiling(size.batch)) whose steady step's measured peak fits
    `budget` (labkit.planners.applying.largest_batch: one measured step per batch tried), and the median step time per
    sequence at that batch.

    Bytes at any batch come from ``at_batch`` (bytes measured at batches 2 and 3): the planner plans from them
    at each batch it tries, with reference's seconds (a batch scales every block's time alike, so the same plan
    stays cheapest); a plan that measures over the budget (its prediction a little low) is planned again for the
    budget less the overshoot, twice at most. A batch whose plan's predicted peak is over OVER x budget counts
    as not fitting without being run: it cannot fit unless the prediction is off by more than a quarter (the lab
    measures the error: a few percent), and the search then never holds much more than the budget, which keeps
    the lab inside the memory its profile was sized for.
    """
    cfg, vocab = capstone_config(size, 1)
    n, out = len(reference.blocks), []
    one, two = batch_profiles(size, reference)
    with torch.random.fork_rng(devices=cuda_devices(torch.empty(0, device=size.device))):
        for name in (*SCHEMES, "planner"):
            model = GPT(cfg, vocab).to(size.device)
            opt = torch.optim.Adam(model.parameters())
            _timed_step(model, opt, _tokens(cfg, vocab, 1, size.device))()  # gradients and Adam's state exist

            chosen: dict[int, list[Step]] = {}  # batch -> the plan that fitted it

            def fits(batch: int, name: str = name, model: nn.Module = model, opt: torch.optim.Optimizer = opt,
                     chosen: dict[int, list[Step]] = chosen) -> bool:
                target = budget  # the planner's: lowered by what a plan measured over the budget, twice at most
                for _ in range(3):
                    plan = scheme_plan(name, n) if name != "planner" else planner(at_batch(one, two, batch), target)
                    if plan is None or peak_of(plan, at_batch(one, two, batch)) > OVER * budget:
                        return False
                    peak = _metered_step(model, opt, _tokens(cfg, vocab, batch, size.device), plan)
                    if peak <= budget:
                        chosen[batch] = plan
                        return True
                    if name != "planner":
                        return False
                    target -= peak - budget
                return False

            batch = largest_batch(fits, size.batch, batch_ceiling(size.batch) if most is None else most)
            seconds = float("nan")
            if batch and timed:
                with applied(model, chosen[batch]):
                    run = _timed_step(model, opt, _tokens(cfg, vocab, batch, size.device))
                    seconds = benchmark(run, warmup=1, repeats=repeats).median / batch
            out.append({"name": name, "batch": batch, "seconds_per_sample": seconds})
    return out


def train_losses(c: Capstone, plan: Sequence[Step] | None, steps: int, lr: float = 1e-3, seed: int = 0) -> list[float]:
    """Losses of `steps` Adam steps on a copy of the model from one seed (dropout on), under the plan or plainly."""
    model, opt, loss = _steady(c.model, c.tokens)
    for g in opt.param_groups:
        g["lr"] = lr
    with torch.random.fork_rng(devices=cuda_devices(c.tokens)):
        torch.manual_seed(seed)
        with applied(model, plan) if plan is not None else contextlib.nullcontext():
            return train_steps(model, opt, c.tokens, loss, steps)


def random_profile(n: int, seed: int = 0) -> Profile:
    """n blocks of four ways (keep, selective, offload, and recompute in segments), bytes and seconds drawn from
    a seeded generator: what the planner's speed is measured on."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=gen))  # noqa: E731
    blocks = []
    for i in range(n):
        inp = draw(1, 6) * 2**16
        act = inp + draw(0, 20) * 2**16
        blocks.append(BlockCosts(act, inp, draw(1, 8) / 4e3, {
            "selective": Option(inp + draw(0, (act - inp) // 2**16) * 2**16, act, draw(0, 4) / 4e3),
            "offload": Option(0, act, draw(1, 16) / 4e3)},
            beside=2**20 + (n - i) * 2**16))  # the gradients made so far grow towards block 0
    return Profile(tuple(blocks), 2**20, 0, 1.0)


def planning_seconds(planner: Callable[[Profile, int], Any], n: int = 200, repeats: int = 3) -> float:
    """Median seconds the planner takes on random_profile(n) at a budget of a third of what keeping every block
    keeps, beside the most any block's backward has beside it."""
    profile = random_profile(n)
    budget = max(b.beside for b in profile.blocks) + sum(b.act for b in profile.blocks) // 3
    return benchmark(lambda: planner(profile, budget), warmup=1, repeats=repeats).median


def plan() -> dict[str, Any]:
    """`labkit bench plan`: at a budget 85% of the way from full recomputation's predicted peak up to keeping
    everything's, the planner's plan against the fixed schemes (each one's gradients judged against the plain
    step's), the largest batch each fits, and the seconds the planner takes on 200 blocks of four ways; then, at
    five budgets, the planner against PyTorch's own answers (labkit.bench.peers: every setting judged by its
    gradients, `peers`, `head_to_head`)."""
    from labkit.labs.capstone import plan_blocks, plan_for  # lab 07's planner (plan_for: with its errors)

    size = sizes()
    c = capstone(size)
    n = len(c.profile.blocks)
    budget = budget_between(c.profile, n)
    chosen = plan_for(c.profile, budget)
    plans = {"planner": chosen, **{s: scheme_plan(s, n) for s in SCHEMES}}
    by = {r["name"]: r for r in rows(c, plans, budget, repeats=11, judged=True)}  # the 3% bar: medians of 11 pairs
    mine = by["planner"]
    return {"machine": machine(size), "budget_bytes": budget, "plan": [[s.start, s.stop, s.how] for s in chosen],
            "predicted_peak": mine["predicted_peak"], "measured_peak": mine["measured_peak"],
            "predicted_step_ratio": mine["predicted_step_ratio"], "measured_step_ratio": mine["measured_step_ratio"],
            "fits": {name: r["fits"] for name, r in by.items()},
            "gradients": {name: {k: r[k] for k in ("gradients", "gradient_difference")} for name, r in by.items()},
            "step_ratio": {name: r["measured_step_ratio"] for name, r in by.items()},
            "largest_batch": {r["name"]: r["batch"] for r in batch_rows(size, budget, plan_blocks, c.profile,
                                                                       timed=False)},
            "planner_200_blocks_seconds": planning_seconds(plan_blocks),
            **peers_figures(c, plan_for, repeats=11)}


def machine(size: Sizes) -> dict[str, Any]:
    """Where a benchmark ran: torch, the profile, the device (a GPU's name, or the CPU and its cores), the date."""
    import datetime
    import os

    device = torch.cuda.get_device_name() if size.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    return {"torch": torch.__version__, "profile": size.name, "device": device,
            "date": datetime.date.today().isoformat()}


def peers_figures(c: Capstone, plan_for: Callable[[Profile, int], list[Step]], repeats: int = 11) -> dict[str, Any]:
    """The planner against PyTorch's answers on the capstone (labkit.bench.peers), with the bar's figure: at
    every budget where a peer fits, the planner's step time over the fastest peer's, timed head to head."""
    from labkit.bench.peers import bar_holds, compare_with_peers

    found = compare_with_peers(c.model, c.tokens, c.loss, c.profile, plan_for, repeats=repeats,
                               inductor=c.tokens.is_cuda)
    ratios = [r["planner_over_best_peer"] for r in found["head_to_head"] if r["planner_over_best_peer"] is not None]
    figures = {**found, "planner_over_best_peer_max": max(ratios, default=None),
               "planner_within_3_percent_of_best_peer": bar_holds(found["head_to_head"])}
    try:
        import transformers  # noqa: F401  (a developer extra)
    except ImportError:
        return {**figures, "foreign": "transformers is not installed (pip install transformers)"}
    from labkit.bench.peers import foreign_figures

    return {**figures, "foreign": foreign_figures(c.model.cfg, c.model.vocab, plan_for, repeats=5,
                                                  device=c.tokens.device)}
