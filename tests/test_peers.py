"""PyTorch's own answers to lab 07's question, run on the capstone model (labkit.planners.peers, sac_milp,
labkit.instruments.compiled, labkit.bench.peers): each trains exactly as plainly where it should (every one but
torch.compile's decompositions), keeps less than plainly where it claims to, and the meter sees compiled code;
what would be silently wrong (a fallback to eager, a policy on other ops) is refused."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import labkit as lk
from labkit.bench import plan as bench_plan
from labkit.bench.peers import peers_table
from labkit.instruments.gradients import judge
from labkit.planners.capstone import budgets
from labkit.planners.measuring import train_step
from labkit.instruments.compiled import Compiled
from labkit.instruments.meter import MemoryMeter
from labkit.planners.peers import CompiledBlocks, torch_full, torch_sequential


@pytest.fixture(scope="module")
def capstone():
    return bench_plan.capstone(lk.sizes("tiny"), repeats=1)


def _steady(c):
    model = copy.deepcopy(c.model)
    opt = torch.optim.Adam(model.parameters())
    train_step(model, opt, c.tokens, c.loss)()
    return model, opt


def _peak(model, opt, c, context=contextlib.nullcontext) -> int:
    step = train_step(model, opt, c.tokens, c.loss)
    with context():
        step()
        with MemoryMeter(model, opt, c.tokens) as meter:
            step()
    return meter.peak


def _kept(model, c, context) -> int:
    """Bytes alive after a forward and the loss, beyond what was alive before: what backward will use."""
    model.zero_grad(set_to_none=True)
    with context(), MemoryMeter(model, c.tokens) as meter:
        loss = c.loss(model(c.tokens))
        kept = meter.live - meter.baseline
    del loss
    return kept


def _same_grads(model, c, context) -> bool:
    return judge(model, c.tokens, c.loss, context).gradients == "bitwise"


def test_torch_full_and_checkpoint_sequential_train_bitwise_and_keep_less(capstone):
    model, opt = _steady(capstone)
    plain = _peak(model, opt, capstone)
    for context in (lambda: torch_full(model), lambda: torch_sequential(model, 2)):
        assert _same_grads(model, capstone, context)
        assert _peak(model, opt, capstone, context) < plain
    assert all("forward" not in vars(b) for b in model.blocks)  # every forward put back
    with pytest.raises(ValueError, match="segments=9 must be an int from 1 to 2"):
        with torch_sequential(model, 9):
            pass


def test_the_meter_sees_compiled_blocks_and_a_lower_budget_keeps_less(capstone):
    model, opt = _steady(capstone)
    peaks = {}
    for budget in (1.0, 0.0):
        blocks = CompiledBlocks(model, budget)
        with blocks.ran(f"budget {budget}"):
            peaks[budget] = _peak(model, opt, capstone, lambda b=blocks: b)
        assert all(c.graphs_run > 0 for c in blocks.compiled)
    assert peaks[0.0] < peaks[1.0]
    # within a few percent of the plain eager step at the default partition (the partition may keep a little
    # other than eager does), never a fraction of it: a meter blind to the compiled graphs would see far less
    assert abs(peaks[1.0] / _peak(model, opt, capstone) - 1) < 0.1


def test_a_compiled_function_that_ran_eagerly_is_refused_not_reported():
    f = Compiled(lambda x: (x * 2).sin(), 0.5)
    x = torch.randn(4)
    with f.check_ran("plain call"):
        f(x)
    with pytest.raises(RuntimeError, match="ran no compiled graph"):  # told to: the function runs eagerly
        with f.check_ran("forced eager"), torch.compiler.set_stance("force_eager"):
            f(x)


def test_under_another_dispatch_mode_a_compiled_function_runs_compiled_and_the_mode_sees_its_graph():
    """Dynamo runs a function eagerly where a dispatch mode is active; Compiled sets the thread's modes aside for
    the call and runs its graph inside them again, so the mode sees the graph's ops and the figures are compiled."""
    f = Compiled(lambda x: (x * 2).sin(), 0.5)
    x = torch.randn(4)
    seen: list[str] = []

    class Other(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with f.check_ran("under another mode"), Other():
        f(x)
    assert {"mul", "sin"} <= set(seen), seen


def test_compiled_refuses_a_budget_or_backend_it_does_not_take():
    for budget in (1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="must be a number from 0 to 1"):
            Compiled(lambda x: x, budget)
    with pytest.raises(ValueError, match="allowed: aot_eager_decomp_partition, aot_eager, inductor"):
        Compiled(lambda x: x, 0.5, backend="eager")


pulp = pytest.importorskip("pulp", reason="pulp is not installed (sac_milp's solver): pip install pulp pwlf")
pytest.importorskip("pwlf", reason="pwlf is not installed (sac_milp's trade-off curves): pip install pwlf")


@pytest.fixture(scope="module")
def stats(capstone):
    from labkit.planners.sac_milp import torch_stats

    return torch_stats(capstone.model, capstone.tokens, capstone.loss)


def test_torch_stats_are_pytorchs_graph_of_the_blocks_and_what_is_inside_them(capstone, stats):
    n = len(capstone.model.blocks)
    assert {f"GPT.blocks.{i}" for i in range(n)} <= set(stats.units)
    assert all(u.startswith("GPT.blocks.") for u in stats.units)
    assert 0 < stats.baseline_bytes, stats.baseline_bytes
    ops = stats.sac_stats["GPT.blocks.0"]
    assert len(ops.func_names) == len(ops.runtimes) == len(ops.memory) and sum(ops.runtimes) > 0
    assert ops.rand_ops  # the block's dropout, which sac_milp saves or recomputes all together


def test_sac_milp_decides_and_its_decisions_train_bitwise(capstone, stats):
    from labkit.planners.sac_milp import SacApplied, sac_decisions

    assert sac_decisions(stats, stats.baseline_bytes * 2) == {}
    for share in (0.95, 0.9, 0.85):  # on the tiny model parameters are most of its peak: little can go
        decisions = sac_decisions(stats, int(stats.baseline_bytes * share))
        if decisions:
            break
    assert decisions and all(k in stats.units and 0 <= v <= 1 for k, v in decisions.items())
    model, _ = _steady(capstone)
    assert _same_grads(model, capstone, lambda: SacApplied(model, stats, decisions))
    with pytest.raises(ValueError, match="finds nothing that fits"):
        sac_decisions(stats, 1024)


def test_a_block_whose_activations_are_all_discarded_keeps_less_and_trains_bitwise(capstone, stats):
    """The application alone, on a decision made by hand (what sac_milp picks depends on measured times)."""
    from labkit.planners.sac_milp import SacApplied

    model, _ = _steady(capstone)
    way = SacApplied(model, stats, {"GPT.blocks.0": 1.0})
    assert sum(way.saved["GPT.blocks.0"]) < len(way.saved["GPT.blocks.0"])  # some ops recomputed
    assert _same_grads(model, capstone, lambda: way)
    assert _kept(model, capstone, lambda: way) < _kept(model, capstone, contextlib.nullcontext)


def test_a_sac_policy_on_other_ops_than_traced_is_refused(capstone, stats):
    from labkit.planners.sac_milp import SacApplied

    model, _ = _steady(capstone)
    wrong = copy.deepcopy(stats)
    names = wrong.sac_stats["GPT.blocks.0"].func_names
    names[0] = "not_" + names[0]
    with pytest.raises(ValueError, match="where SACEstimator traced not_"):
        with SacApplied(model, wrong, {"GPT.blocks.0": 0.5}):
            capstone.loss(model(capstone.tokens))
    with pytest.raises(ValueError, match="is not a module of GPT that SACEstimator saw"):
        SacApplied(model, stats, {"GPT.nowhere": 0.5})


def _row(method, setting, peak, ratio, gradients="bitwise"):
    row = {"method": method, "setting": setting, "measured_peak": peak, "step_ratio": ratio,
           "gradients": gradients, "gradient_difference": 0.0 if gradients == "bitwise" else 0.9,
           "judged_against": "the plain step"}
    return {**row, "why": "its gradients differ (planted)"} if gradients == "wrong" else row


def test_the_table_takes_each_peers_fastest_setting_that_fits_and_says_when_none_does():
    plans = {100: [lk.plans.Step(0, 1, "keep")]}
    rows = [_row("planner", "keep 0", 90, 1.0), _row("a", "x", 80, 1.5), _row("a", "y", 99, 1.2, "rounding"),
            _row("a", "z", 150, 1.0), _row("b", "u", 130, 1.1), _row("b", "v", 120, 1.3)]
    table = peers_table(rows, plans)
    assert [(r["method"], r["setting"], r["fits"]) for r in table] == [
        ("planner", "keep 0", True), ("a", "y", True), ("b", "v", False)]


def test_a_setting_whose_gradients_are_wrong_never_fits_is_never_chosen_and_its_row_says_why():
    """Wrong gradients (compile below budget 1 redrawing dropout in backward, pytorch/pytorch#190758): the
    setting is no candidate; where it would have been its method's row (it fits and is faster), it is a row of
    its own, fits false, saying why; a method with nothing else shows it so; a planner so judged does not fit."""
    plans = {100: [lk.plans.Step(0, 1, "keep")]}
    rows = [_row("planner", "keep 0", 90, 1.0), _row("a", "slow", 95, 1.5), _row("a", "fast", 80, 1.1, "wrong"),
            _row("a", "big", 150, 0.9, "wrong"), _row("b", "only", 50, 0.5, "wrong")]
    table = peers_table(rows, plans)
    assert [(r["method"], r["setting"], r["fits"]) for r in table] == [
        ("planner", "keep 0", True), ("a", "slow", True), ("a", "fast", False), ("b", "only", False)]
    for r in table[2:]:
        assert r["why"].startswith("gradients wrong against the plain step, never a candidate: its gradients"), r
    assert "why" not in table[1]
    wrong_planner = peers_table([_row("planner", "keep 0", 90, 1.0, "wrong"), *rows[1:]], plans)[0]
    assert wrong_planner["fits"] is False and wrong_planner["why"].startswith("gradients wrong")
    over = peers_table([_row("planner", "keep 0", 90, 1.0), _row("c", "right", 120, 1.0),
                        _row("c", "least", 110, 1.0, "wrong"), _row("d", "only", 130, 0.5, "wrong")], plans)
    assert [(r["method"], r["setting"], r["fits"]) for r in over[1:]] == [("c", "right", False), ("d", "only", False)]
    assert "why" not in over[1] and over[2]["why"].startswith("gradients wrong")  # nothing fits: no wrong row beside
    with pytest.raises(KeyError, match="gradients"):  # a row never judged is no candidate, never taken as right
        peers_table([_row("planner", "keep 0", 90, 1.0), {"method": "a", "setting": "x", "measured_peak": 1,
                                                           "step_ratio": 1.0}], plans)


def test_each_budget_takes_its_own_plan_and_a_peak_equal_to_the_budget_fits():
    plans = {100: [lk.plans.Step(0, 1, "keep")], 200: [lk.plans.Step(0, 1, "recompute")]}
    rows = [_row("planner", "keep 0", 100, 1.0), _row("planner", "recompute 0", 150, 1.2), _row("a", "x", 100, 1.5)]
    table = peers_table(rows, plans)
    assert [(r["budget"], r["setting"], r["fits"]) for r in table] == [
        (100, "keep 0", True), (100, "x", True), (200, "recompute 0", True), (200, "x", True)]


def test_the_planner_is_raced_only_against_a_right_peer_that_fits_and_each_row_without_a_race_says_why():
    """head_to_head on a table made by hand (a fitting row judged wrong is refused there too, whatever made it)."""
    from labkit.bench.peers import Setting, head_to_head

    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    opt = torch.optim.Adam(model.parameters())
    loss = lambda out: out.pow(2).mean()  # noqa: E731
    found = [Setting(m, s, contextlib.nullcontext) for m, s in
             (("planner", "p"), ("a", "slow"), ("b", "wrong"), ("c", "over"))]
    at = lambda budget, method, setting, ratio, fits, gradients="bitwise": {  # noqa: E731
        "budget": budget, **_row(method, setting, 1, ratio, gradients), "fits": fits}
    table = [at(1, "planner", "p", 1.0, True), at(1, "a", "slow", 2.0, True), at(1, "b", "wrong", 0.1, True, "wrong"),
             at(1, "c", "over", 0.2, False), at(2, "planner", "p", 1.0, True), at(2, "c", "over", 0.2, False),
             at(3, "planner", "p", 1.0, False), at(3, "a", "slow", 2.0, True),
             {**at(4, "planner", "p", 1.0, False, "wrong"), "why": "gradients wrong ... (peers_table's why)"},
             at(4, "a", "slow", 2.0, True)]
    out = head_to_head(found, table, model, opt, x, loss, repeats=1)
    assert [(r["budget"], r["best_peer"], r.get("why")) for r in out] == [
        (1, "a (slow)", None), (2, None, "no peer fits"), (3, None, "the planner's plan does not fit"),
        (4, None, "the planner's plan does not fit: gradients wrong ... (peers_table's why)")]
    assert out[0]["planner_over_best_peer"] > 0


def test_a_method_whose_every_setting_was_refused_is_a_refused_row_and_a_planner_that_did_not_run_is_an_error():
    plans = {100: [lk.plans.Step(0, 1, "keep")]}
    planner = _row("planner", "keep 0", 90, 1.0)
    refused = {"method": "sac_milp", "setting": "0.9 of its peak", "error": "RuntimeError: refused"}
    table = peers_table([planner, refused], plans)
    assert table[1] == {"budget": 100, **refused, "fits": False}
    with pytest.raises(ValueError, match="the planner's plan keep 0 at 100 B did not run: RuntimeError: no"):
        peers_table([{"method": "planner", "setting": "keep 0", "error": "RuntimeError: no"}], plans)


def test_the_bar_needs_a_race_the_planner_fitting_everywhere_and_every_ratio_within_three_percent():
    from labkit.bench.peers import bar_holds

    raced = lambda r: {"budget": 1, "best_peer": "x", "planner_over_best_peer": r}  # noqa: E731
    unfit = {"budget": 2, "best_peer": None, "planner_over_best_peer": None, "why": "the planner's plan does not fit"}
    alone = {"budget": 3, "best_peer": None, "planner_over_best_peer": None, "why": "no peer fits"}
    assert bar_holds([raced(0.9), raced(1.03), alone])
    assert not bar_holds([raced(0.9), raced(1.031)])
    assert not bar_holds([raced(0.9), unfit])
    assert not bar_holds([raced(0.9), {**unfit, "why": "the planner's plan does not fit: gradients wrong ..."}])
    assert not bar_holds([alone]) and not bar_holds([])


def test_checkpoint_sequential_refuses_blocks_called_with_other_arguments_than_the_first():
    """It passes one input along and runs every block with block 0's other arguments: a later block called with
    others (a mask of its own) is refused, never run with block 0's."""
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, h, scale=None):
            return self.lin(h) * (1 if scale is None else scale)

    class Net(nn.Module):
        def __init__(self, shared: bool) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Scaled() for _ in range(4))
            one = torch.tensor(1.0)
            self.scales = [one if shared else torch.tensor(1.0 + i) for i in range(4)]

        def forward(self, x):
            for block, scale in zip(self.blocks, self.scales):
                x = block(x, scale=scale)
            return x

    x = torch.randn(2, 8, requires_grad=True)
    for shared in (True, False):
        net = Net(shared)
        with torch_sequential(net, 2):
            if shared:
                net(x).sum().backward()
            else:
                with pytest.raises(ValueError, match="block 1 is called with other arguments than block 0"):
                    net(x)


def test_the_budgets_lie_strictly_between_full_recomputations_peak_and_keeping_everythings(capstone):
    prof, n = capstone.profile, len(capstone.profile.blocks)
    low, high = (lk.plans.peak_of(lk.plans.scheme_plan(s, n), prof) for s in ("full", "none"))
    found = budgets(prof, n)
    assert len(found) == 5 and found == sorted(found) and low < found[0] and found[-1] < high


def test_the_recorded_sweep_is_bench_plans_output_and_an_unknown_profile_is_refused():
    from labkit.bench.peers import recorded

    rec = recorded("cpu")
    assert rec["machine"]["profile"] == "cpu" and len(rec["budgets"]) >= 5
    assert {r["method"] for r in rec["peers"]} >= {"planner", "torch full", "checkpoint_sequential", "compile budget",
                                                   "sac_milp"}
    assert set(rec["foreign"]) == {"gpt2", "llama"}
    fig = lk.plots.peers(rec["settings"], rec["budgets"])
    (ax,) = fig.axes
    series = {r["method"] + (" (gradients wrong)" if r["gradients"] == "wrong" else "") for r in rec["settings"]
              if "error" not in r}
    assert len(ax.lines) == len(series) + len(rec["budgets"])
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == sorted(series)
    with pytest.raises(ValueError, match="no figures recorded for profile='nowhere'; recorded: cpu"):
        recorded("nowhere")


def test_the_recorded_sweep_judges_every_setting_by_its_gradients_and_races_no_wrong_one():
    """Lab 07 reads this table: every setting judged (gradients, gradient_difference), no wrong one fitting or
    raced, compile at budget 1 bitwise against itself, in lab 07's model and the foreign ones."""
    from labkit.bench.peers import recorded

    rec = recorded("cpu")
    tables = [(rec["settings"], rec["peers"], rec["head_to_head"])]
    tables += [(f["peers"], f["peers"], [f["head_to_head"]]) for f in rec["foreign"].values()]
    for settings, table, raced in tables:
        judged = [r for r in settings if "error" not in r]
        assert judged and all(r["gradients"] in ("bitwise", "rounding", "wrong") for r in judged)
        assert all(isinstance(r["gradient_difference"], float) for r in judged)
        wrong = {f"{r['method']} ({r['setting']})" for r in judged if r["gradients"] == "wrong"}
        assert not any(r["fits"] for r in table if f"{r['method']} ({r['setting']})" in wrong)
        assert not {r["best_peer"] for r in raced} & wrong
    assert next(r for r in rec["settings"] if r["method"] == "compile budget" and r["setting"] == "1")[
        "gradients"] == "bitwise"


def test_pytorchs_selective_checkpoint_refuses_a_policy_that_saves_the_mask_nn_dropout_fills_in_place():
    """What lab 07 says of GPT-2's rows: on a CPU nn.Dropout fills an empty_like in place (sac_milp's op list shows
    it), a policy that saves that empty_like (and the in-place ops tied to it, as the per-module solver ties them)
    is refused by PyTorch's selective checkpoint: an error, never wrong gradients. Without dropout the same
    policy on the same ops runs."""
    import dataclasses

    pytest.importorskip("transformers", reason="transformers is not installed")
    from labkit.instruments.blocks import patched
    from labkit.models.hugging_face import BLOCKS, build, logits_loss
    from labkit.planners.sac_milp import _under_policy, torch_stats

    cfg, fqn = lk.sizes("tiny").gpt(), "GPT2LMHeadModel.transformer.h.0.mlp"
    for p in (0.1, 0.0):
        model, tokens = build("gpt2", dataclasses.replace(cfg, dropout=p), 64), lk.gpt_tokens(cfg, 64)
        loss = logits_loss(tokens)
        names = torch_stats(model, tokens, loss, BLOCKS["gpt2"]).sac_stats[fqn].func_names
        assert (names[-4:-1] == ["empty_like", "bernoulli_", "div_"]) == (p > 0)
        save = [int(n in ("addmm", "empty_like", "bernoulli_", "div_")) for n in names]
        mlp = model.get_submodule(fqn.split(".", 1)[1])
        with patched([(mlp, _under_policy(mlp.forward, names, save, fqn))]):
            if p > 0:
                with pytest.raises(RuntimeError, match="cached during selective activation checkpoint has been "
                                                       "mutated"):
                    loss(model(tokens)).backward()
            else:
                loss(model(tokens)).backward()


def test_a_peer_whose_backward_draws_fresh_masks_is_judged_wrong_never_fits_and_is_never_raced(capstone):
    """Planted: torch's checkpoint on every block without RNG replay (preserve_rng_state=False), whose backward
    draws fresh dropout masks as compile below budget 1 does (pytorch/pytorch#190758). It keeps as little as torch
    full at the same cost, and trains no error: its gradients alone tell. Judged wrong, it never fits, its row
    says why, and the planner is raced against the right peer."""
    from torch.utils.checkpoint import checkpoint

    from labkit.bench.peers import Setting, head_to_head, run_settings
    from labkit.instruments.blocks import patched
    from labkit.planners import applied

    model, opt = _steady(capstone)
    plan = [lk.plans.Step(i, i + 1, "keep") for i in range(len(model.blocks))]
    redraw = lambda: patched([(b, (lambda f: lambda *a, **k: checkpoint(  # noqa: E731
        f, *a, use_reentrant=False, preserve_rng_state=False, **k))(b.forward)) for b in model.blocks])

    @contextlib.contextmanager
    def reseeded():  # other masks in forward: its gradients are of another forward, and are not judged
        torch.manual_seed(1)
        yield
    found = [Setting("planner", lk.plans.describe(plan), lambda: applied(model, plan)),
             Setting("torch full", "every block", lambda: torch_full(model)),
             Setting("no rng replay", "every block", redraw), Setting("reseeded", "x", reseeded)]
    rows = run_settings(found, model, opt, capstone.tokens, capstone.loss, repeats=1)
    refused = rows.pop()
    assert refused["error"].startswith("NotJudged: gradients not judged against the plain step: the forwards "
                                       "differ"), refused
    verdicts = {r["method"]: (r["gradients"], r["gradient_difference"]) for r in rows}
    assert verdicts["planner"] == verdicts["torch full"] == ("bitwise", 0.0), verdicts
    assert verdicts["no rng replay"][0] == "wrong" and verdicts["no rng replay"][1] > 0.1, verdicts
    budget = 10 * max(r["measured_peak"] for r in rows)  # every peak fits: only the gradients keep it out
    table = peers_table(rows, {budget: plan})
    wrong = next(r for r in table if r["method"] == "no rng replay")
    assert wrong["fits"] is False and wrong["why"].startswith("gradients wrong against the plain step"), wrong
    (raced,) = head_to_head(found, table, model, opt, capstone.tokens, capstone.loss, repeats=1)
    assert raced["best_peer"] == "torch full (every block)", raced


def test_compile_at_budget_1_draws_nothing_in_backward_where_a_lower_budget_does():
    """The step compile's budgets are judged against, compile at budget 1, recomputes no random op: measured here,
    not assumed (bench plan judges budget 1 against itself, so its 'bitwise' says nothing of it). Below 1 the same
    instrument sees the backward's redraw (pytorch/pytorch#190758), so its 0 at budget 1 is not blindness."""
    from labkit.instruments.compiled import RandomDraws
    from labkit.models import next_token_loss
    from labkit.planners.capstone import capstone_model

    torch.manual_seed(0)
    model, tokens = capstone_model(lk.sizes("tiny"))
    counts = {}
    for budget in (1.0, 0.2):
        with CompiledBlocks(model, budget) as blocks, blocks.ran(f"compile budget {budget:g}"):
            next_token_loss(model(tokens), tokens).backward()  # compiles each block's graphs
            with RandomDraws() as draws:
                next_token_loss(model(tokens), tokens).backward()
        counts[budget] = (draws.count("forward"), draws.count("backward"))
    assert counts[1.0][0] > 0 and counts[1.0][1] == 0, counts
    assert counts[0.2][1] > 0, counts
