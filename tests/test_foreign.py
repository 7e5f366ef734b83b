"""The planners, the advisor, lab 04's trace and policies and lab 06's harness on models the kit did not build
(tests/helpers/foreign.py, and GPT-2 from `transformers` built from its config): each works, exactly where the kit's own
models are exact, or refuses with a message that says how to make it work. Never silently wrong."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers import foreign as F
from labkit.checks.lab04.common import profiles
from labkit.instruments.harness import compare_step, per_block
from labkit.instruments.meter import MemoryMeter
from labkit.instruments.ops import trace
from labkit.planners import applied, measure_step, profile_model, situation
from labkit.planners.advice import scheme
from labkit.planners.measuring import train_steps
from labkit.plans import SCHEMES, Step, peak_of, scheme_plan, seconds_of
from labkit.reference import selective as S
from labkit.reference.capstone import least_budget, plan_for
from labkit.reference.pitfalls import difference


def train(model: nn.Module, x: torch.Tensor, plan=None, steps: int = 3, blocks=None,
          loss=F.loss) -> tuple[list[float], list[torch.Tensor]]:
    """Losses of `steps` Adam steps of a copy of `model` on x (dropout seeded), under `plan`, and its parameters
    (`blocks` given as modules are the copy's at the same places)."""
    paths = {id(m): n for n, m in model.named_modules()}
    model = copy.deepcopy(model)
    if isinstance(blocks, list):
        blocks = [model.get_submodule(paths[id(b)]) for b in blocks]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        with applied(model, plan, blocks) if plan is not None else _nothing():
            losses = train_steps(model, opt, x, loss, steps)
    return losses, [p.detach().clone() for p in model.parameters()]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def bitwise(a: tuple[list[float], list[torch.Tensor]], b: tuple[list[float], list[torch.Tensor]]) -> bool:
    return a[0] == b[0] and all(torch.equal(p, q) for p, q in zip(a[1], b[1]))


# ---------------------------------------------------------------- 1: a policy is traced from what a block computes
def test_two_models_whose_blocks_share_class_shapes_and_names_get_each_its_own_selective_policy():
    """Attention dropout off in one model and on in the other: the same class, input and parameter names, other
    ops. A policy cached by what a block is would keep the second model's attention dropout (a random op before
    a recomputed one): PyTorch's selective checkpoint then trains it wrong without an error."""
    x = F.tokens()
    first, second = F.gpu_dropout_stack(p_attn=0.0), F.gpu_dropout_stack(p_attn=0.2)
    for model in (first, second):
        plan = [s for s in scheme_plan("selective", len(model.blocks))]
        assert bitwise(train(model, x, plan), train(model, x)), type(model).__name__


def test_a_block_changed_between_two_applied_is_traced_again():
    x, model = F.tokens(), F.gpu_dropout_stack(p_attn=0.0)
    plan = scheme_plan("selective", len(model.blocks))
    assert bitwise(train(model, x, plan), train(model, x))
    for b in model.blocks:
        b.attn.core.drop.p = 0.2
    assert bitwise(train(model, x, plan), train(model, x))


def test_a_block_changed_inside_one_applied_is_refused_never_run_under_a_policy_made_for_other_ops():
    x, model = F.tokens(), F.gpu_dropout_stack(p_attn=0.0)
    work = copy.deepcopy(model)
    with applied(work, scheme_plan("selective", 3)):
        F.loss(work(x)).backward()
        for b in work.blocks:
            b.attn.core.drop.p = 0.2  # attention's dropout now runs: another op first, the keys shift
        with pytest.raises(ValueError, match=r"computes otherwise than when the policy was made"):
            work(x)


def test_a_model_that_lists_one_block_twice_is_refused_by_name():
    block = F.LlamaBlock()
    model = F.Stack([block, block, F.LlamaBlock()])
    for run in (lambda: profile_model(model, F.tokens(), F.loss, repeats=1),
                lambda: situation(model, F.tokens(), 10**9, loss_fn=F.loss, repeats=1)):
        with pytest.raises(ValueError, match=r"block 1 is block 0 \(blocks\.0\)"):
            run()


# ---------------------------------------------------------------- 2: bytes attributed to blocks reached by two paths
def test_blocks_exposed_through_a_wrapper_are_profiled_as_the_same_blocks_unwrapped():
    x = F.tokens()
    bare, wrapped = profile_model(F.llama(), x, F.loss, repeats=1), profile_model(F.Wrapped(F.llama()), x, F.loss,
                                                                                  repeats=1)
    assert [b.act for b in wrapped.blocks] == [b.act for b in bare.blocks]
    assert all(b.act > 0 for b in bare.blocks)
    assert least_budget(wrapped) == least_budget(bare)


def test_blocks_that_are_not_submodules_are_refused_by_name():
    model = F.llama()
    object.__setattr__(model, "blocks", nn.ModuleList([F.LlamaBlock()]))  # an attribute, not a registered child
    model._modules.pop("blocks")
    with pytest.raises(ValueError, match=r"block 0 is not a submodule"):
        profile_model(model, F.tokens(), F.loss, repeats=1)


# ---------------------------------------------------------------- 3, 4: nn.Dropout, and the random rule
def test_the_trace_marks_nn_dropouts_mask_as_changed_in_place_and_the_planners_never_keep_it():
    block = F.LlamaBlock()
    ops = trace(block, torch.randn(2, 8, 32, requires_grad=True), model=block, repeats=1)
    masks = [r for r in ops if r.op == "empty_like"]
    assert masks and all(r.mutated for r in masks)  # CPU: empty_like, then bernoulli_ and div_ into it
    assert not any(r.mutated for r in ops if r.op in ("addmm", "mm", "mul") and r.module.endswith("drop"))
    allowed = {r.key for r in S.candidates(ops)}
    assert not allowed & {r.key for r in masks}
    for keep in (S.selective_keep(ops), S.greedy_keep(ops, 10**9), S.knapsack_keep(ops, 10**9)):
        assert keep <= allowed and S.random_ok(ops, keep)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("make", [F.LlamaBlock, F.MHABlock, F.TupleBlock], ids=["llama", "multihead", "tuple"])
def test_lab04s_planners_on_foreign_blocks_train_as_plainly_under_both_checkpoints(make, share):
    """A LLaMA-style block (nn.Dropout, rotary, SDPA), one around nn.MultiheadAttention, one returning a tuple."""
    torch.manual_seed(0)
    block, x = make(), torch.randn(2, 8, 32, requires_grad=True)
    ops = trace(block, x, model=block, repeats=1)
    budget = int(share * sum(S.keep_bytes(r) for r in S.candidates(ops)))

    def grads(run) -> list[torch.Tensor]:
        block.zero_grad(set_to_none=True)
        x.grad = None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            out = run(x)
            (out[0] if isinstance(out, tuple) else out).square().sum().backward()
        return [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]

    want = grads(block)
    for keep in (S.greedy_keep(ops, budget), S.knapsack_keep(ops, budget)):
        assert S.kept_bytes(ops, keep) <= budget
        ours = grads(lambda h: S.checkpoint_selective(block, h, keep=keep))
        theirs = grads(lambda h: checkpoint(block, h, use_reentrant=False, context_fn=S.torch_policy(keep)))
        assert all(torch.equal(a, b) for a, b in zip(want, ours))
        assert all(torch.equal(a, b) for a, b in zip(want, theirs))


def test_greedy_and_knapsack_keep_the_random_rule_with_in_place_random_ops_on_every_budget():
    cases = [(ops, b) for ops, _ in profiles(60, 9, seed=21)
             for b in range(0, sum(r.output_bytes for r in ops) + 65, 64)]
    assert any(r.op == "bernoulli_" for ops, _ in cases for r in ops)
    for ops, budget in cases:
        for keep in (S.greedy_keep(ops, budget), S.knapsack_keep(ops, budget)):
            assert S.random_ok(ops, keep), ([r.key for r in ops], budget, sorted(keep))
            assert not any(r.mutated for r in ops if r.key in keep)


def test_a_model_with_nn_dropout_profiles_plans_and_trains_within_its_budget_bitwise():
    x, model = F.tokens(), F.llama(4)
    profile = profile_model(model, x, F.loss, repeats=1)
    assert all("selective" in b.options for b in profile.blocks)  # attn.core: the selective way is offered
    low, high = (peak_of(scheme_plan(s, 4), profile) for s in ("full", "none"))
    for budget in (low, (low + high) // 2, high):
        plan = plan_for(profile, budget)
        work = copy.deepcopy(model)
        opt = torch.optim.Adam(work.parameters())
        assert measure_step(work, opt, x, F.loss, plan) <= budget
        assert bitwise(train(model, x, plan), train(model, x))


def test_five_blocks_that_differ_with_nn_multiheadattention_plan_and_train_bitwise():
    x, model = F.tokens(), F.mixed()
    profile = profile_model(model, x, F.loss, repeats=1)
    assert [("selective" in b.options) for b in profile.blocks] == [True, False, True, False, True]
    budget = least_budget(profile)
    plan = plan_for(profile, budget)
    work = copy.deepcopy(model)
    assert measure_step(work, torch.optim.Adam(work.parameters()), x, F.loss, plan) <= budget
    assert bitwise(train(model, x, plan), train(model, x))


# ---------------------------------------------------------------- 5: blocks that take more than a tensor
def test_blocks_that_return_tuples_or_take_keywords_are_refused_saying_how_to_wrap_them():
    model = F.TupleStack([F.TupleBlock() for _ in range(2)])
    for run in (lambda: profile_model(model, F.tokens(), F.loss, repeats=1),
                lambda: situation(model, F.tokens(), 10**9, loss_fn=F.loss, repeats=1)):
        with pytest.raises(ValueError, match=r"blocks\.0 \(TupleBlock\) returns tuple, not one tensor.*"
                                             r"self\.block\(h, \.\.\.\)\[0\]"):
            run()


class KeywordBlock(nn.Module):
    """A LLaMA-style block called with a keyword besides its hidden state, as Hugging Face blocks are."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.inner = F.LlamaBlock(d)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner(x) * (1 if scale is None else scale)


class KeywordStack(F.Stack):
    """Calls each block with a scale: the same tensor for every block, or (other=True) another per block."""

    def __init__(self, blocks, other: bool = False, grad: bool = False) -> None:
        super().__init__(blocks)
        shared = torch.full((32,), 1.0, requires_grad=grad)
        self.scales = [torch.full((32,), 1.0 + i) if other else shared for i in range(len(blocks))]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for block, scale in zip(self.blocks, self.scales):
            h = block(h, scale=scale)
        return self.head(self.norm(h))


def test_blocks_called_with_keywords_that_need_no_gradient_profile_plan_and_train_bitwise():
    torch.manual_seed(0)
    model, x = KeywordStack([KeywordBlock() for _ in range(3)]), F.tokens()
    profile = profile_model(model, x, F.loss, repeats=1)
    for plan in ([Step(0, 3, "recompute")], plan_for(profile, least_budget(profile))):
        work = copy.deepcopy(model)
        assert measure_step(work, torch.optim.Adam(work.parameters()), x, F.loss, plan) <= peak_of(plan, profile)
        assert bitwise(train(model, x, plan), train(model, x))


def test_a_segment_whose_later_block_is_called_with_other_arguments_is_refused_and_a_gradient_argument_too():
    torch.manual_seed(0)
    model, x = KeywordStack([KeywordBlock() for _ in range(3)], other=True), F.tokens()
    with pytest.raises(ValueError, match="block 1 is called with other arguments than block 0"):
        train(model, x, [Step(0, 2, "recompute"), Step(2, 3, "keep")])
    assert bitwise(train(model, x, scheme_plan("full", 3)), train(model, x))  # a segment each: each its own
    with pytest.raises(ValueError, match=r"a tensor that needs a gradient besides its hidden state \(scale\)"):
        profile_model(KeywordStack([KeywordBlock() for _ in range(3)], grad=True), x, F.loss, repeats=1)


def test_lab06s_harness_runs_blocks_with_keywords_and_tuples_and_nn_multiheadattention_exactly():
    for model in (F.TupleStack([F.TupleBlock() for _ in range(2)]), F.mixed()):
        report = compare_step(model, F.tokens(), per_block(lambda f, *a, **k: checkpoint(f, *a, use_reentrant=False,
                                                                                          **k)),
                              difference=difference, loss_fn=F.loss)
        assert report.ok, str(report)


transformers = pytest.importorskip("transformers")


def gpt2(n_layer: int = 3) -> nn.Module:
    config = transformers.GPT2Config(n_layer=n_layer, n_embd=32, n_head=4, vocab_size=50, n_positions=32,
                                     use_cache=False, eos_token_id=0, bos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


class One(nn.Module):
    """A Hugging Face block as one tensor in, one out."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.block(h)
        return out[0] if isinstance(out, tuple) else out


class GPT2Blocks(nn.Module):
    """GPT-2's own modules, its blocks as `blocks` of One: the forward GPT2LMHeadModel runs, written out."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        t = hf.transformer
        self.wte, self.wpe, self.drop, self.ln_f, self.head = t.wte, t.wpe, t.drop, t.ln_f, hf.lm_head
        self.blocks = nn.ModuleList(One(b) for b in t.h)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


def llama(n_layer: int = 3) -> nn.Module:
    config = transformers.LlamaConfig(num_hidden_layers=n_layer, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                      max_position_embeddings=32, attention_dropout=0.1, use_cache=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def hf_loss(out) -> torch.Tensor:
    return F.loss(out.logits)


@pytest.mark.parametrize(("make", "path", "kind"), [(gpt2, "transformer.h", "GPT2Block"),
                                                    (llama, "model.layers", "LlamaDecoderLayer")],
                         ids=["gpt2", "llama"])
def test_a_hugging_face_model_as_built_profiles_plans_and_trains_bitwise_with_blocks_given(make, path, kind):
    """Built from its config (random weights, no download), its blocks called as Hugging Face calls them (a mask,
    rotary tables, positions besides the hidden state); without blocks= the error names where they are."""
    x = F.tokens()
    model = make()
    with pytest.raises(ValueError, match=rf"has no blocks.*blocks=.*{path.replace('.', '[.]')} \(3 {kind}\)"):
        profile_model(model, x, hf_loss, repeats=1)
    profile = profile_model(model, x, hf_loss, repeats=1, blocks=path)
    assert len(profile.blocks) == 3
    low, high = (peak_of(scheme_plan(s, 3), profile) for s in ("full", "none"))
    budget = (low + high) // 2
    plan = plan_for(profile, budget)
    assert any(s.how == "recompute" for s in plan)
    work = copy.deepcopy(model)
    assert measure_step(work, torch.optim.Adam(work.parameters()), x, hf_loss, plan, blocks=path) <= budget
    blocks = [m for m in model.get_submodule(path)]  # blocks= as a list of the modules works alike
    assert bitwise(train(model, x, plan, blocks=path, loss=hf_loss), train(model, x, loss=hf_loss))
    assert bitwise(train(model, x, scheme_plan("full", 3), blocks=blocks, loss=hf_loss), train(model, x, loss=hf_loss))


def test_blocks_given_wrongly_are_refused_saying_what_is_allowed():
    model = gpt2()
    with pytest.raises(ValueError, match=r"blocks='transformer\.hh' is not a submodule of GPT2LMHeadModel; .*"
                                         r"transformer\.h \(3 GPT2Block\)"):
        profile_model(model, F.tokens(), hf_loss, repeats=1, blocks="transformer.hh")
    with pytest.raises(ValueError, match="blocks= must be a non-empty nn.ModuleList"):
        profile_model(model, F.tokens(), hf_loss, repeats=1, blocks=[])


# ---------------------------------------------------------------- 6: the advisor's recommendation holds when run
@pytest.mark.parametrize("make", [F.llama, F.mixed, lambda: GPT2Blocks(gpt2())], ids=["llama", "mixed", "gpt2"])
def test_the_advisors_peaks_are_the_peaks_each_scheme_runs_at(make):
    model, x = make(), F.tokens(4, 16)
    s = situation(model, x, 10**9, loss_fn=F.loss, repeats=1)
    assert set(s.schemes) >= {"none", "full", "sqrt_n"}
    for name, cost in s.schemes.items():
        work = copy.deepcopy(model)
        opt = torch.optim.Adam(work.parameters())
        run = scheme(name)
        for measured in (False, True):
            with MemoryMeter(work, opt, x) if measured else _nothing() as meter:
                opt.zero_grad(set_to_none=True)
                F.loss(run(work, x)).backward()
                opt.step()
        assert cost.peak_bytes == meter.peak, name
        assert abs(cost.predicted_bytes - cost.peak_bytes) <= 0.1 * cost.peak_bytes, name  # the rebuild counted


def test_at_a_budget_between_a_schemes_prediction_and_its_peak_the_advisor_names_what_fits_when_run():
    from labkit.reference.pitfalls import recommend

    model, x = F.llama(4), F.tokens(4, 16)
    s = situation(model, x, 10**9, loss_fn=F.loss, repeats=1)
    optimistic = [(n, c) for n, c in s.schemes.items() if c.predicted_bytes < c.peak_bytes]
    assert optimistic  # the per-block sums miss what a checkpoint holds beyond them
    for name, cost in optimistic:
        budget = (cost.predicted_bytes + cost.peak_bytes) // 2
        choice = recommend(situation(model, x, budget, loss_fn=F.loss, repeats=1))
        assert choice != name
        assert choice is None or s.schemes[choice].peak_bytes <= budget


# ---------------------------------------------------------------- 7: exact budgets plan exactly
@pytest.mark.parametrize("make", [F.llama, F.mixed], ids=["llama", "mixed"])
def test_at_every_schemes_own_peak_the_plan_is_no_slower_than_that_scheme(make):
    model, x = make(), F.tokens()
    profile = profile_model(model, x, F.loss, repeats=1)
    n = len(profile.blocks)
    for name in SCHEMES:
        plan = scheme_plan(name, n)
        if not all(s.how in ("recompute", "keep") or s.how in profile.blocks[s.start].ways() for s in plan):
            continue
        work = copy.deepcopy(model)
        peak = measure_step(work, torch.optim.Adam(work.parameters()), x, F.loss, plan)
        chosen = plan_for(profile, peak)
        assert seconds_of(chosen, profile) <= seconds_of(plan, profile), name
        assert peak_of(chosen, profile) <= peak


def test_exact_peaks_of_two_made_up_schemes_plan_exactly_at_a_coarse_unit():
    """A profile whose byte counts share no divisor, so plan_blocks counts in coarse units: at full
    recomputation's and keeping everything's exact peaks, plan_for still finds those schemes."""
    from labkit.plans import BlockCosts, Profile

    blocks = tuple(BlockCosts(act=1_000_003 + 7919 * i, inp=65_537 + 13 * i, fwd=1e-3, beside=3_001 + i)
                   for i in range(12))
    profile = Profile(blocks, base=10_007, floor=11, step=0.1)
    for name in ("full", "none"):
        plan = scheme_plan(name, 12)
        chosen = plan_for(profile, peak_of(plan, profile))
        assert seconds_of(chosen, profile) <= seconds_of(plan, profile)
    assert least_budget(profile) <= peak_of(scheme_plan("full", 12), profile)


def _plans(at: int, n: int, ways: list[str]):
    if at == n:
        yield []
        return
    for stop in range(at + 1, n + 1):
        hows = ["recompute"] if stop > at + 1 else [*ways, "recompute"]
        for how in hows:
            for rest in _plans(stop, n, ways):
                yield [Step(at, stop, how), *rest]


def test_every_plan_of_three_foreign_blocks_is_predicted_to_the_byte_and_trains_bitwise():
    """The prediction the planner trusts, held against the meter on every plan of three foreign blocks, segments of
    two and three blocks among them (each block of a segment runs once in forward and once in its rebuild)."""
    x, model = F.tokens(), F.llama(3)
    profile = profile_model(model, x, F.loss, repeats=1)
    plans = list(_plans(0, 3, ["keep", "selective"]))
    assert any(s.stop - s.start == 3 for p in plans for s in p)
    for plan in plans:
        work = copy.deepcopy(model)
        assert measure_step(work, torch.optim.Adam(work.parameters()), x, F.loss, plan) == \
            peak_of(plan, profile), plan
    for plan, runs in (([Step(0, 3, "recompute")], [2, 2, 2]),
                       ([Step(0, 2, "recompute"), Step(2, 3, "keep")], [2, 2, 1])):
        work = copy.deepcopy(model)
        calls = [0] * 3  # each block's MLP, called inside its forward: once in forward, once more in a rebuild
        for i, b in enumerate(work.blocks):
            b.mlp.register_forward_pre_hook(lambda m, a, i=i: calls.__setitem__(i, calls[i] + 1))
        with applied(work, plan):
            F.loss(work(x)).backward()
        assert calls == runs, plan
        assert bitwise(train(model, x, plan), train(model, x))


# ---------------------------------------------------------------- where lab 04's prices and a plain backward fall short
class ScaledHead(F.Stack):
    """The last block's output goes to a multiplication by a scalar, which saves nothing."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h * 0.5))


def _predicted_and_measured(model: nn.Module, x: torch.Tensor) -> dict[str, tuple[int, int]]:
    profile = profile_model(model, x, F.loss, repeats=1)
    out = {}
    for name in ("none", "full", "sqrt_n", "selective"):
        plan, work = scheme_plan(name, len(model.blocks)), copy.deepcopy(model)
        out[name] = peak_of(plan, profile), measure_step(work, torch.optim.Adam(work.parameters()), x,
                                                                          F.loss, plan)
    return out


def test_a_selective_last_block_whose_output_nothing_saves_is_predicted_to_the_byte():
    """Lab 04's keep_bytes prices a block's own output at 0 (the next block keeps it anyway); where nothing after
    the last block saves its output, a selective last block keeps it alone, and the profile counts it."""
    torch.manual_seed(0)
    got = _predicted_and_measured(ScaledHead([F.LlamaBlock(p=0.0) for _ in range(3)]), F.tokens(4, 32))
    assert all(p == m for p, m in got.values()), got


def test_full_recomputation_of_blocks_with_attention_written_out_is_predicted_to_the_byte():
    """At (4, 48) such a block's rebuild has 8,064 B more alive than its backward (the output and the forward's
    temporaries it remakes): the profile's beside takes the larger, from a step under full recomputation, so full
    is exact and no scheme is predicted below the meter."""
    torch.manual_seed(0)
    got = _predicted_and_measured(F.Stack([F.DropoutBlock(32, p_attn=0.0, p=0.0) for _ in range(3)]),
                                  F.tokens(4, 48))
    assert got["full"][0] == got["full"][1], got
    assert all(p >= m for p, m in got.values()), got


class PassThrough(nn.Module):
    """A block whose backward makes nothing: the gradient of its output is the gradient of its input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0


def test_a_block_whose_backward_allocates_nothing_is_profiled_and_predicted_to_the_byte():
    """Its backward starts and ends at one moment of the meter's timeline: an empty window, not an overlap."""
    torch.manual_seed(0)
    model, x = F.Stack([F.LlamaBlock(p=0.0), PassThrough(), F.LlamaBlock(p=0.0)]), F.tokens(4, 32)
    profile = profile_model(model, x, F.loss, repeats=1)
    assert profile.blocks[1].act == 0
    for name in ("none", "full"):
        plan, work = scheme_plan(name, 3), copy.deepcopy(model)
        assert measure_step(work, torch.optim.Adam(work.parameters()), x, F.loss, plan) == peak_of(plan, profile)


def test_five_blocks_that_differ_are_offered_no_way_that_keeps_more_than_keeping_the_block():
    """Issue 46: with F.scaled_dot_product_attention, which saves no scores, lab 04's policy (everything outside
    core attention kept, outputs no backward needs among them) keeps more than a plain LLaMA-style block saves.
    Each block's selective way is predicted to the byte of the step it runs in, and one that keeps more than
    keeping the block is never offered; a block the kit cannot price says why."""
    model, x = F.five(), F.tokens(4, 32)
    profile = profile_model(model, x, F.loss, repeats=1)
    llamas = [i for i, m in enumerate(model.blocks) if isinstance(m, F.LlamaBlock)]
    assert len(llamas) == 2 and len(profile.blocks) == 5
    for i, b in enumerate(profile.blocks):
        assert all(o.kept <= b.act for o in b.ways().values()), (i, b)
        if i not in llamas:
            assert "no attn.core" in b.not_offered()["selective"] and not b.options, (i, b)
    losing = []
    for i in llamas:
        b, sel = profile.blocks[i], profile.blocks[i].options["selective"]
        plan = [Step(j, j + 1, "selective" if j == i else "keep") for j in range(5)]
        work = copy.deepcopy(model)
        assert measure_step(work, torch.optim.Adam(work.parameters()), x, F.loss, plan) == peak_of(plan, profile), i
        if sel.kept > b.act:  # priced exactly (a fixed scheme may run it), but never offered to a planner
            losing.append(i)
            assert "selective" not in b.ways() and f"{sel.kept:,} B, more than keeping the block" in \
                b.not_offered()["selective"], (i, b)
    assert losing == llamas  # here both lose: the test holds what it says


def test_the_profile_keeps_nothing_of_the_working_copy_alive():
    """A saved-tensor hook that returned the tensors it saw would tie each saved output to its own graph in a
    cycle autograd cannot free (torch/autograd/graph.py warns of it): every profile would leak a model."""
    import gc
    import weakref

    from labkit.planners.profiling import _saved_later
    torch.manual_seed(0)
    work = F.llama(3)
    ref = weakref.ref(next(work.parameters()))
    assert _saved_later(work, F.tokens(4, 32), list(work.blocks)) == [True, True, True]
    del work
    gc.collect()
    assert ref() is None


class Reversed(F.Stack):
    """Blocks called in the opposite order of the list: their backwards cannot be told apart in list order."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for block in reversed(self.blocks):
            h = block(h)
        return self.head(self.norm(h))


@pytest.mark.parametrize("n", [2, 3])
def test_blocks_called_out_of_order_are_refused_naming_the_overlap(n):
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="the blocks' backwards overlap"):
        profile_model(Reversed([F.LlamaBlock(p=0.0) for _ in range(n)]), F.tokens(), F.loss, repeats=1)


class Detached(F.Stack):
    """The second block's input cut from the graph: its backward never reaches the first block."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](self.embed(idx))
        for block in self.blocks[1:]:
            h = block(h.detach())
        return self.head(self.norm(h))


def test_a_block_whose_input_gets_no_gradient_is_refused_by_name():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="cannot tell the blocks' backwards apart"):
        profile_model(Detached([F.LlamaBlock(p=0.0) for _ in range(2)]), F.tokens(), F.loss, repeats=1)
