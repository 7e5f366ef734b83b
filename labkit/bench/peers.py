"""Lab 07's planner against PyTorch's own answers on the capstone model, measured (part of `labkit bench plan`).

The peers: every block under ``torch.utils.checkpoint`` ("torch full"); ``checkpoint_sequential`` at √n
segments; each block compiled under torch.compile's ``activation_memory_budget`` (its min-cut partitioner
with eager kernels: "compile budget"); and ``sac_milp``, PyTorch's integer program over modules and discard
fractions (labkit.planners.sac_milp). Each peer has a knob (segments, the compile budget, sac_milp's budget);
each of its settings is run for real: one steady step under the meter (its peak, on the device), one step's
gradients judged against its reference's (labkit.instruments.gradients: the plain step's for an eager way,
compile at budget 1's for compile's budgets; bitwise, rounding or wrong), and its step time over the plain
step's (medians of alternating pairs). At each budget a peer's row is its fastest setting whose gradients are not
wrong and whose measured peak fits: the best it can do there, chosen by measurement; a wrong setting never fits,
and where one would have been chosen the table says so in a row of its own. The planner's row is its plan for
the budget, from its profile alone. Then the planner and the best peer that fits are timed against each other, in
alternating pairs.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
from pathlib import Path
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from labkit.instruments.tensors import cuda_devices
from labkit.instruments.timing import compare
from labkit.instruments.blocks import blocks_of
from labkit.instruments.gradients import NotJudged, judge
from labkit.instruments.meter import MemoryMeter
from labkit.planners import applied
from labkit.planners.capstone import COUNT, budgets
from labkit.planners.measuring import train_step, train_steps
from labkit.planners.peers import CompiledBlocks, torch_full, torch_sequential
from labkit.planners.sac_milp import SacApplied, sac_decisions, torch_stats
from labkit.plans import describe

__all__ = ["recorded", "Setting", "settings", "run_settings", "peers_table", "head_to_head",
           "compare_with_peers", "foreign_figures", "COMPILE_BUDGETS", "SAC_SHARES"]

RECORDED = Path(__file__).parent / "data"  # bench plan's figures, recorded: recorded()


def recorded(profile: str = "cpu") -> dict[str, Any]:
    """What `python -m labkit bench plan --json` printed when the kit recorded it on the `profile` profile
    (labkit/bench/data/plan_<profile>.json; its "machine" says where): the full sweep takes minutes, so a lab
    shows it from here."""
    path = RECORDED / f"plan_{profile}.json"
    if not path.exists():
        have = sorted(p.stem.removeprefix("plan_") for p in RECORDED.glob("plan_*.json"))
        raise ValueError(f"recorded: no figures recorded for profile={profile!r}; recorded: {', '.join(have)}")
    return json.loads(path.read_text())


COMPILE_BUDGETS = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)  # activation_memory_budget, each compiled and run
INDUCTOR_BUDGETS = (1.0, 0.5, 0.0)  # on CUDA: Inductor compiles each budget in tens of seconds
SAC_SHARES = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4)  # sac_milp's budget, a share of its own plain peak


@dataclass
class Setting:
    """One way of running the model: its method, its knob's setting, and the context manager that runs it
    (entered around every step it times)."""

    method: str
    setting: str
    context: Callable[[], contextlib.AbstractContextManager[Any]]
    ran: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    error: str | None = None  # why it cannot run (PyTorch's own solver found no policy), reported as such
    # the step its gradients are judged against: one that ran the same forward and recomputed nothing (the plain
    # step; for compile's budgets, compile at budget 1, whose decomposed forward draws the same masks)
    reference: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    against: str = "the plain step"


def settings(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor], plans: dict[int, list],
             compile_budgets: Sequence[float] = COMPILE_BUDGETS, sac_shares: Sequence[float] = SAC_SHARES,
             inductor: bool = False, blocks: Any = None) -> tuple[list[Setting], dict[str, Any]]:
    """Every setting of every method on `model` (the copy that runs them; `blocks` as blocks_of takes it): the
    planner's plan at each budget (`plans`: budget -> plan), the peers at each knob setting; and notes on what
    sac_milp was fed."""
    found = [Setting("planner", describe(p), (lambda p=p: applied(model, p, blocks)))
             for p in _distinct(plans.values())]
    n = len(blocks_of(model, blocks))
    found.append(Setting("torch full", "every block", lambda: torch_full(model, blocks)))
    k = max(1, round(math.sqrt(n)))
    found.append(Setting("checkpoint_sequential", f"{k} segments", lambda: torch_sequential(model, k, blocks)))
    backends = [("aot_eager_decomp_partition", compile_budgets)]
    backends += [("inductor", INDUCTOR_BUDGETS)] if inductor else []
    for backend, fractions in backends:
        name = "compile budget" if backend != "inductor" else "compile budget (inductor)"
        whole = {b: CompiledBlocks(model, b, backend, blocks) for b in dict.fromkeys((*fractions, 1.0))}
        reference = lambda c=whole[1.0], s=f"{name} 1 (the reference)": _both(c.ran(s), c)  # noqa: E731
        for budget in fractions:
            compiled = whole[budget]
            found.append(Setting(name, f"{budget:g}", lambda c=compiled: c,
                                 (lambda c=compiled, s=f"{name} {budget:g}": c.ran(s)), reference=reference,
                                 against=f"{name} 1"))
    try:
        stats = torch_stats(model, x, loss_fn, blocks)
    except ValueError as e:  # its estimators could not time an op: it is not fed, and says so
        found.append(Setting("sac_milp", "not run", contextlib.nullcontext, error=f"ValueError: {e}"))
        return found, {"sac_milp_fed": str(e)}
    seen: list[dict[str, float]] = []
    for share in sac_shares:
        try:
            decisions = sac_decisions(stats, int(stats.baseline_bytes * share))
        except ValueError:
            continue
        if decisions in seen:
            continue
        seen.append(decisions)
        name = f"{share:g} of its peak: " + _short(decisions)
        try:
            way = SacApplied(model, stats, decisions)
        except ValueError as e:
            found.append(Setting("sac_milp", name, contextlib.nullcontext, error=f"ValueError: {e}"))
            continue
        found.append(Setting("sac_milp", name, lambda w=way: w))
    notes = {"sac_milp_fed": "on CUDA PyTorch's estimators whole; on a CPU, each op's runtime by the kit's stopwatch "
                             "(PyTorch's estimators time ops with CUDA events only), the rest PyTorch's",
             "sac_milp_plain_peak": stats.baseline_bytes}
    return found, notes


@contextlib.contextmanager
def _both(*contexts: contextlib.AbstractContextManager[Any]) -> Any:
    """Inside every one of `contexts`, entered in order."""
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        yield


def _refused(what: str, e: BaseException) -> str:
    """The error's line, printed as it happens (a long run's refusals are not first seen at its end)."""
    line = f"{type(e).__name__}: {e}"[:300]
    print(f"labkit bench: {what} refused: {line}", file=sys.stderr, flush=True)
    return line


def _distinct(plans: Any) -> list[list]:
    out: list[list] = []
    for p in plans:
        if p not in out:
            out.append(p)
    return out


def _short(decisions: dict[str, float]) -> str:
    return ", ".join(f"{k.split('.', 1)[1]} {v:.2f}" for k, v in decisions.items()) or "nothing"


def run_settings(found: list[Setting], model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                 loss_fn: Callable[[Any], torch.Tensor], repeats: int) -> list[dict[str, Any]]:
    """Each setting run for real: its measured peak, its one-step gradients judged against its reference's
    (`gradients`: bitwise, rounding or wrong; `gradient_difference`; the rounding bound of
    labkit.instruments.gradients), and its step time over the plain step's (median of `repeats` alternating
    pairs). The peak is the meter's, except for Inductor's kernels, whose buffers no dispatch mode sees: the CUDA
    allocator's peak. A setting whose gradients cannot be judged (its forward is not its reference's) is a refused
    row, saying why."""
    plain_step = train_step(model, opt, x, loss_fn)
    rows = []
    for s in found:
        if s.error is not None:
            rows.append({"method": s.method, "setting": s.setting, "error": s.error[:300]})
            continue
        try:
            with s.ran():
                with s.context():
                    plain_step()  # gradients and Adam's state exist; the weights move (two steps)
                    with MemoryMeter(model, opt, x, device=x.device) as meter:
                        plain_step()
                # Inductor's buffers: the allocator's growth over the step, on top of what was there (as meter.peak)
                peak = meter.baseline + meter.allocator_peak if "inductor" in s.method else meter.peak
                judged = _judged(s, model, x, loss_fn)
                ratio = compare(plain_step, _under(s, plain_step), repeats=repeats, warmup=1, device=x.device).ratio
        except Exception as e:  # noqa: BLE001 - a setting PyTorch refuses (SAC on a tensor changed in place, a
            opt.zero_grad(set_to_none=True)  # recompile limit), or one not judged: a row that says so, no figure
            rows.append({"method": s.method, "setting": s.setting, "error": _refused(f"{s.method} ({s.setting})", e)})
            continue
        rows.append({"method": s.method, "setting": s.setting, "measured_peak": peak, "step_ratio": round(ratio, 4),
                     **judged})
    return rows


def _judged(s: Setting, model: nn.Module, x: torch.Tensor, loss_fn: Callable) -> dict[str, Any]:
    """The setting's gradient fields against its reference's, and what that reference was; NotJudged names both."""
    try:
        found = judge(model, x, loss_fn, s.context, s.reference)
    except NotJudged as e:
        raise NotJudged(f"gradients not judged against {s.against}: {e}") from None
    return {**found.fields(), "judged_against": s.against}


def _under(s: Setting, step: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with s.context():
            step()
    return run


def peers_table(rows: list[dict[str, Any]], plans: dict[int, list]) -> list[dict[str, Any]]:
    """Per budget and method: the planner's row for its plan; each peer's fastest setting that fits (or, where
    none fits, its setting of least peak, fits false; where every setting was refused, the first refusal). A
    setting whose gradients are wrong never fits and is never chosen: where it would have been its method's row
    (it fits and is faster, or the method has nothing else), it is a row of its own, fits false, `why` saying so."""
    table = []
    for budget, plan in plans.items():
        mine = next(r for r in rows if r["method"] == "planner" and r["setting"] == describe(plan))
        if "error" in mine:
            raise ValueError(f"peers_table: the planner's plan {describe(plan)} at {budget:,} B did not run: "
                             f"{mine['error']}")
        fits = _right(mine) and mine["measured_peak"] <= budget
        table.append({"budget": budget, **mine, "fits": fits, **({} if _right(mine) else {"why": _wrong_why(mine)})})
        for method in _distinct(r["method"] for r in rows if r["method"] != "planner"):
            own = [r for r in rows if r["method"] == method and "error" not in r]
            if not own:
                refused = next(r for r in rows if r["method"] == method)
                table.append({"budget": budget, **refused, "fits": False})
                continue
            table += _method_rows(own, budget)
    return table


def _right(row: dict[str, Any]) -> bool:
    """Its gradients were judged and are not wrong (a row that was never judged is no candidate either)."""
    return row["gradients"] in ("bitwise", "rounding")


def _wrong_why(row: dict[str, Any]) -> str:
    return f"gradients wrong against {row['judged_against']}, never a candidate: {row['why']}"


def _best(rows: list[dict[str, Any]], budget: int) -> tuple[dict[str, Any], bool]:
    """The fastest of `rows` whose peak fits `budget`, True; else the one of least peak, False."""
    fit = [r for r in rows if r["measured_peak"] <= budget]
    return (min(fit, key=lambda r: r["step_ratio"]), True) if fit else (min(rows, key=lambda r: r["measured_peak"]),
                                                                        False)


def _method_rows(own: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """One method's rows at `budget`: its best right setting, and the wrong one that would have been chosen."""
    right = [r for r in own if _right(r)]
    out = []
    if right:
        best, fits = _best(right, budget)
        out.append({"budget": budget, **best, "fits": fits})
    chosen, fits = _best(own, budget)
    if not _right(chosen) and (fits or not right):
        out.append({"budget": budget, **chosen, "fits": False, "why": _wrong_why(chosen)})
    return out


def head_to_head(found: list[Setting], table: list[dict[str, Any]], model: nn.Module, opt: torch.optim.Optimizer,
                 x: torch.Tensor, loss_fn: Callable, repeats: int) -> list[dict[str, Any]]:
    """At each budget, the planner's step against the fastest peer that fits, in alternating pairs: the
    planner's time over the peer's (at most 1.03 is the bar)."""
    step = train_step(model, opt, x, loss_fn)
    by = {(s.method, s.setting): s for s in found}
    out = []
    for budget in _distinct(r["budget"] for r in table):
        here = [r for r in table if r["budget"] == budget]
        mine = here[0]
        fitting = [r for r in here[1:] if r["fits"] and _right(r)]  # a wrong setting never fits (peers_table)
        if not fitting or not mine["fits"]:  # nothing to race, or the planner does not fit: no ratio, said why
            why = ("no peer fits" if not fitting else "the planner's plan does not fit" if _right(mine) else
                   f"the planner's plan does not fit: {mine['why']}")  # peers_table's why: its gradients are wrong
            out.append({"budget": budget, "best_peer": None, "planner_over_best_peer": None, "why": why})
            continue
        best = min(fitting, key=lambda r: r["step_ratio"])
        peer, planner = by[best["method"], best["setting"]], by["planner", mine["setting"]]
        with peer.ran():
            ratio = compare(_under(peer, step), _under(planner, step), repeats=repeats, warmup=1,
                            device=x.device).ratio
        out.append({"budget": budget, "best_peer": f"{best['method']} ({best['setting']})",
                    "planner_over_best_peer": round(ratio, 4)})
    return out


BAR = 1.03  # issue 31: the planner's step at most 3% slower than the fastest peer that fits, at every budget


def bar_holds(versus: list[dict[str, Any]]) -> bool:
    """Whether head_to_head's rows meet the bar: at least one budget raced, the planner fitting at every budget
    (a row without a ratio because the planner's plan did not fit, or whose gradients are wrong, fails it), and
    every ratio at most BAR."""
    raced = [r["planner_over_best_peer"] for r in versus if r["planner_over_best_peer"] is not None]
    unfit = any(r.get("why", "").startswith("the planner's plan does not fit") for r in versus)
    return bool(raced) and not unfit and all(r <= BAR for r in raced)


def compare_with_peers(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[Any], torch.Tensor], profile: Any,
                       plan_for: Callable[[Any, int], list], count: int = COUNT, repeats: int = 11,
                       blocks: str | None = None, **knobs: Any) -> dict[str, Any]:
    """The planner (plan_for(profile, budget)) against every peer at `count` budgets, on a copy of `model`
    training on x with Adam (gradients and its state made first: steady steps): every setting's row, the
    table per budget and method, the head-to-head times, and what sac_milp was fed. `model` and the
    generators are left as they were. blocks: the path of the model's blocks, where they are not its `blocks`
    or `layers` ("model.layers" in a Hugging Face Llama)."""
    n = len(profile.blocks)
    plans = {b: plan_for(profile, b) for b in budgets(profile, n, count)}
    with torch.random.fork_rng(devices=cuda_devices(x, model)):
        work = copy.deepcopy(model)
        opt = torch.optim.Adam(work.parameters())
        train_step(work, opt, x, loss_fn)()
        found, notes = settings(work, x, loss_fn, plans, blocks=blocks, **knobs)
        rows = run_settings(found, work, opt, x, loss_fn, repeats)
        table = peers_table(rows, plans)
        versus = head_to_head(found, table, work, opt, x, loss_fn, repeats)
    return {"budgets": list(plans), "settings": rows, "peers": table, "head_to_head": versus, **notes}


def foreign_figures(cfg: Any, vocab: int, plan_for: Callable[[Any, int], list], repeats: int = 5,
                    names: Sequence[str] = ("gpt2", "llama"), device: str | torch.device = "cpu") -> dict[str, Any]:
    """Lab 07's planner on models no one here wrote: GPT-2 and Llama from `transformers`, built from their configs
    at the capstone's shapes (labkit.models.hugging_face), profiled with blocks= where Hugging Face keeps them,
    planned halfway between full recomputation's predicted peak and keeping everything's, and run on `device`: the
    measured peak against the budget, the plan's one-step gradients judged, three training steps against plain ones
    (losses and weights, bit for bit), and the planner against every peer at that budget, each judged by its
    gradients. A model that fails is a row {"error": why}, printed as it happens."""
    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = _foreign(name, cfg, vocab, plan_for, repeats, device)
        except Exception as e:  # noqa: BLE001 - one model that fails is its own row, the others still run
            out[name] = {"error": _refused(name, e)}
    return out


def _foreign(name: str, cfg: Any, vocab: int, plan_for: Callable[[Any, int], list], repeats: int,
             device: str | torch.device) -> dict[str, Any]:
    """foreign_figures' row for the model `name`."""
    from labkit.models import gpt_tokens
    from labkit.models.hugging_face import BLOCKS, build, logits_loss
    from labkit.planners import profile_model

    model, tokens = build(name, cfg, vocab).to(device), gpt_tokens(cfg, vocab, device=device)
    loss, path = logits_loss(tokens), BLOCKS[name]
    profile = profile_model(model, tokens, loss, repeats=repeats, blocks=path)
    found = compare_with_peers(model, tokens, loss, profile, plan_for, count=1, repeats=repeats, blocks=path)
    (budget,) = found["budgets"]
    plan = plan_for(profile, budget)
    mine = found["peers"][0]
    return {"blocks": path, "budget": budget, "plan": describe(plan), "measured_peak": mine["measured_peak"],
            "fits": mine["fits"], "gradients": mine["gradients"],
            "trains_bitwise": _trains_bitwise(model, tokens, loss, plan, path),
            "peers": found["peers"], "head_to_head": found["head_to_head"][0],
            "errors": [f"{r['method']} ({r['setting']}): {r['error']}" for r in found["settings"] if "error" in r]}


def _trains_bitwise(model: nn.Module, x: torch.Tensor, loss_fn: Callable, plan: list, blocks: str,
                    steps: int = 3) -> bool:
    """Whether `steps` Adam steps under the plan give the plain steps' losses and weights, bit for bit (from one
    seed: dropout draws alike)."""
    runs = []
    for context in (contextlib.nullcontext, None):
        work = copy.deepcopy(model)
        opt = torch.optim.Adam(work.parameters())
        with torch.random.fork_rng(devices=cuda_devices(x, model)):
            torch.manual_seed(0)
            with applied(work, plan, blocks) if context is None else context():
                losses = train_steps(work, opt, x, loss_fn, steps)
        runs.append((losses, [p.detach() for p in work.parameters()]))
    (a, pa), (b, pb) = runs
    return a == b and all(torch.equal(p, q) for p, q in zip(pa, pb))
