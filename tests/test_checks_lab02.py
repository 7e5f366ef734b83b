"""Tests for the checkers of 02_recompute: they pass the reference and catch each planted bug with its own hint."""
from __future__ import annotations

import itertools
import warnings
from contextlib import contextmanager

import pytest
import torch

from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.reference import recompute as ref
from labkit.reference.recompute import RecomputeRNG, Recompute, restored_rng, stash_rng


def _fails(check, *args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


# ---------------------------------------------------------------- the reference passes
@pytest.mark.parametrize("check, args, ex", [
    (checks.ex_2_1, (Recompute,), "2.1"),
    (checks.ex_2_2, (stash_rng, restored_rng, RecomputeRNG), "2.2"),
    (checks.ex_2_3, (ref.checkpoint,), "2.3"),
    (checks.ex_2_4, (ref.checkpoint_hooks,), "2.4"),
])
def test_reference_passes_with_one_line(check, args, ex, capsys):
    check(*args)
    out = capsys.readouterr().out
    assert out.startswith(f"[ex {ex}] passed: ") and out.count("\n") == 1


def test_checks_leave_the_global_generator_alone():
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    checks.ex_2_3(ref.checkpoint)
    assert torch.equal(torch.rand(3), want)


# ---------------------------------------------------------------- stubs and wrong arguments
def _stub(ex):
    def stub(*args, **kwargs):
        raise NotImplementedError(f"Exercise {ex}: title")
    return stub


class StubRecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, *args):
        raise NotImplementedError("Exercise 2.1: a recomputing autograd Function")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("Exercise 2.1: a recomputing autograd Function")


class StubBackward(Recompute):
    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("Exercise 2.1: a recomputing autograd Function")


@contextmanager
def stub_restored_rng(state):
    raise NotImplementedError("Exercise 2.2: replay the random number generator")
    yield


@pytest.mark.parametrize("check, args, ex", [
    (checks.ex_2_1, (StubRecompute,), "2.1"),
    (checks.ex_2_1, (StubBackward,), "2.1"),
    (checks.ex_2_2, (_stub("2.2"), restored_rng, RecomputeRNG), "2.2"),
    (checks.ex_2_2, (stash_rng, stub_restored_rng, RecomputeRNG), "2.2"),
    (checks.ex_2_3, (_stub("2.3"),), "2.3"),
    (checks.ex_2_4, (_stub("2.4"),), "2.4"),
])
def test_a_stub_is_not_attempted(check, args, ex):
    with pytest.raises(NotAttempted, match=rf"\[ex {ex}\] not attempted"):
        check(*args)


@pytest.mark.parametrize("check, args", [
    (checks.ex_2_1, (None,)),
    (checks.ex_2_1, (Recompute.apply,)),
    (checks.ex_2_1, (len,)),
    (checks.ex_2_2, (stash_rng(), restored_rng, RecomputeRNG)),
    (checks.ex_2_2, (stash_rng, restored_rng, 3)),
    (checks.ex_2_3, (torch.zeros(2),)),
    (checks.ex_2_4, ("checkpoint_hooks",)),
])
def test_a_non_callable_is_a_check_failure(check, args):
    err = _fails(check, *args)
    assert "pass the" in err.hint


# ---------------------------------------------------------------- planted bugs of Exercise 2.1
class ForwardWithGrad(Recompute):
    """Bug 1: fn runs with grad mode on in forward, so its activations are saved."""

    @staticmethod
    def forward(ctx, fn, *args):
        ctx.fn = fn
        ctx.save_for_backward(*args)
        with torch.enable_grad():
            return fn(*args)


class RerunWithoutGrad(Recompute):
    """Bug 2: the recompute runs with backward's grad mode, off."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        outputs = ctx.fn(*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        torch.autograd.backward(outputs, grad_outputs)
        return (None, *[x.grad for x in inputs])


class NotDetached(Recompute):
    """Bug 4: the rerun starts from the saved inputs themselves, graph and all."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        inputs = list(ctx.saved_tensors)
        with torch.enable_grad():
            outputs = ctx.fn(*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        torch.autograd.backward(outputs, grad_outputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # .grad of a non-leaf
            return (None, *[x.grad for x in inputs])


class SavesOutput(Recompute):
    """Bug 5a: the output is saved beside the inputs."""

    @staticmethod
    def forward(ctx, fn, *args):
        ctx.fn = fn
        with torch.no_grad():
            out = fn(*args)
        ctx.save_for_backward(*args, *((out,) if isinstance(out, torch.Tensor) else out))
        return out

    @staticmethod
    def backward(ctx, *grad_outputs):
        ctx.n_inputs = len(ctx.saved_tensors) - len(grad_outputs)
        return Recompute.backward(_Inputs(ctx), *grad_outputs)


class _Inputs:
    """A ctx whose saved_tensors are the inputs only (for SavesOutput's backward)."""

    def __init__(self, ctx):
        self.fn, self.saved_tensors = ctx.fn, ctx.saved_tensors[:ctx.n_inputs]


class KeepsOutputOnCtx(Recompute):
    """Bug 5b: the output kept as an attribute of ctx."""

    @staticmethod
    def forward(ctx, fn, *args):
        out = Recompute.forward(ctx, fn, *args)
        ctx.out = out
        return out


class NoLeadingNone(Recompute):
    """Bug 6: backward forgets the None for fn."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        return Recompute.backward(ctx, *grad_outputs)[1:]


class NoInputGrad(Recompute):
    """The detached inputs do not require grad: the gradient stops at the checkpoint."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        inputs = [x.detach() for x in ctx.saved_tensors]
        with torch.enable_grad():
            outputs = ctx.fn(*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        torch.autograd.backward(outputs, grad_outputs)
        return (None, *[x.grad for x in inputs])


class RerunsTwice(Recompute):
    """fn rerun once more than needed in backward."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        ctx.fn(*[x.detach() for x in ctx.saved_tensors])
        return Recompute.backward(ctx, *grad_outputs)


class NotSaved(Recompute):
    """The inputs kept as a ctx attribute instead of through save_for_backward."""

    @staticmethod
    def forward(ctx, fn, *args):
        ctx.fn, ctx.args = fn, args
        with torch.no_grad():
            return fn(*args)

    @staticmethod
    def backward(ctx, *grad_outputs):
        ctx.saved = ctx.args
        return Recompute.backward(_Saved(ctx), *grad_outputs)


class _Saved:
    def __init__(self, ctx):
        self.fn, self.saved_tensors = ctx.fn, ctx.args


class ForwardRaises(Recompute):
    @staticmethod
    def forward(ctx, fn, *args):
        ctx.save_for_backward(fn)  # TypeError: save_for_backward can only save tensors


@pytest.mark.parametrize("bug, keyword, what", [
    (ForwardWithGrad, "torch.no_grad()", "grad mode while forward ran fn"),
    (RerunWithoutGrad, "recompute under torch.enable_grad()", "grad mode while backward reran fn"),
    (NotDetached, "get their gradients twice", "backward"),
    (SavesOutput, "save only the inputs", "bytes kept for backward"),
    (KeepsOutputOnCtx, "save only the inputs", "bytes kept for backward"),
    (NoLeadingNone, "None for fn, then one per input", "backward"),
    (NoInputGrad, "the gradient stopped at the checkpoint", "gradient of x"),
    (RerunsTwice, "exactly twice", "calls of fn"),
    (NotSaved, "ctx.save_for_backward", "bytes saved"),
    (ForwardRaises, "forward(ctx, fn, *args)", "Recompute.apply"),
])
def test_ex_2_1_catches(bug, keyword, what):
    err = _fails(checks.ex_2_1, bug)
    assert keyword in err.hint and what in err.what, err
    assert str(err).startswith("[ex 2.1] ")


def test_ex_2_1_hints_are_distinct():
    hints = {_fails(checks.ex_2_1, bug).hint for bug in
             (ForwardWithGrad, RerunWithoutGrad, NotDetached, SavesOutput, NoLeadingNone, NoInputGrad, RerunsTwice)}
    assert len(hints) == 7


def test_an_autograd_error_is_reported_with_its_message_not_a_traceback():
    err = _fails(checks.ex_2_1, NoLeadingNone)
    assert "RuntimeError: function NoLeadingNoneBackward returned an incorrect number of gradients" in err.got
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)


# ---------------------------------------------------------------- planted bugs of Exercise 2.2
class NoRestore(RecomputeRNG):
    """Bug 3a: backward does not replay the RNG."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        return Recompute.backward(ctx, *grad_outputs)


@contextmanager
def restored_rng_sets_nothing(state):
    """Bug 3b: the state is never set."""
    with torch.random.fork_rng(devices=[]):
        yield


@contextmanager
def restored_rng_no_fork(state):
    """The state is set, but the generator is not put back afterwards."""
    torch.set_rng_state(state.cpu)
    yield


def restored_rng_plain_function(state):
    """Not a context manager."""
    torch.set_rng_state(state.cpu)


def stash_live_generator(*args):
    """A reference to the generator, not a snapshot of its state."""
    return torch.default_generator


@contextmanager
def restore_generator(gen):
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(gen.get_state())
        yield


def _broken_rng(Base):
    class Broken(Base):
        @staticmethod
        def forward(ctx, fn, *args):
            ctx.rng = stash_rng(*args)
            return Base.forward(ctx, fn, *args)

        @staticmethod
        def backward(ctx, *grad_outputs):
            with restored_rng(ctx.rng):
                return Base.backward(ctx, *grad_outputs)
    return Broken


@pytest.mark.parametrize("args, keyword, what", [
    ((stash_rng, restored_rng, NoRestore), "was the RNG state restored before recomputing?", "dropout p=0.5"),
    ((stash_rng, restored_rng_sets_nothing, RecomputeRNG), "torch.set_rng_state", "b"),
    ((stash_live_generator, restore_generator, RecomputeRNG), "snapshot", "b"),
    ((stash_rng, restored_rng_no_fork, RecomputeRNG), "fork_rng", "after the with-block"),
    ((stash_rng, restored_rng_plain_function, RecomputeRNG), "@contextmanager", "restored_rng(s)"),
    ((stash_rng, restored_rng, _broken_rng(NoInputGrad)), "make Exercise 2.1 pass first", "no dropout"),
    ((stash_rng, restored_rng, _broken_rng(NoLeadingNone)), "None for fn", "no dropout"),
])
def test_ex_2_2_catches(args, keyword, what):
    err = _fails(checks.ex_2_2, *args)
    assert keyword in err.hint and what in err.what, err


# ---------------------------------------------------------------- planted bugs of Exercise 2.3
def _split(args):
    where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    return where, [args[i] for i in where]


def checkpoint_everything_through_apply(fn, *args, **kwargs):
    """Bug 7a: non-tensors go through Function.apply."""
    if torch.is_grad_enabled() and not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    return RecomputeRNG.apply(lambda *a: fn(*a, **kwargs), *args)


def checkpoint_drops_kwargs(fn, *args, **kwargs):
    """Bug 7b: the keyword arguments never reach fn."""
    where, tensors = _split(args)
    if torch.is_grad_enabled() and not any(t.requires_grad for t in tensors):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)

    def run(*tensor_args):
        full = list(args)
        for i, t in zip(where, tensor_args):
            full[i] = t
        return fn(*full)

    return RecomputeRNG.apply(run, *tensors)


def checkpoint_never_warns(fn, *args, **kwargs):
    """Bug 8."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ref.checkpoint(fn, *args, **kwargs)


def checkpoint_warns_always(fn, *args, **kwargs):
    warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    return checkpoint_never_warns(fn, *args, **kwargs)


def checkpoint_warns_under_no_grad(fn, *args, **kwargs):
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    return checkpoint_never_warns(fn, *args, **kwargs)


def checkpoint_warns_here(fn, *args, **kwargs):
    """The warning points at checkpoint's own line (no stacklevel)."""
    if torch.is_grad_enabled() and not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        warnings.warn(ref.NO_GRAD_INPUTS)
    return checkpoint_never_warns(fn, *args, **kwargs)


def checkpoint_without_rng(fn, *args, **kwargs):
    """Recompute.apply instead of RecomputeRNG.apply."""
    where, tensors = _split(args)
    if torch.is_grad_enabled() and not any(t.requires_grad for t in tensors):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    return Recompute.apply(lambda *t: fn(*t, **kwargs), *tensors) if len(where) == len(args) else None


def checkpoint_on_broken_recompute(fn, *args, **kwargs):
    return _broken_rng(NoLeadingNone).apply(fn, *args)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("bug, keyword, what", [
    (checkpoint_everything_through_apply, "non-tensor arguments", "checkpoint(fn, h, 0.5, s, True, None"),
    (checkpoint_drops_kwargs, "non-tensor arguments", "arguments fn received in forward"),
    (checkpoint_never_warns, "warnings.warn(", "no input requires grad"),
    (checkpoint_warns_always, "not any(t.requires_grad", "s requires grad"),
    (checkpoint_warns_under_no_grad, "torch.is_grad_enabled()", "under torch.no_grad()"),
    (checkpoint_warns_here, "stacklevel=2", "where the warning points"),
    (checkpoint_without_rng, "use RecomputeRNG.apply", "dropout p=0.5"),
    (checkpoint_on_broken_recompute, "None for fn", "no dropout"),
])
def test_ex_2_3_catches(bug, keyword, what):
    err = _fails(checks.ex_2_3, bug)
    assert keyword in err.hint and what in err.what, err


# ---------------------------------------------------------------- planted bugs of Exercise 2.4
def _hooks(fn, args, kwargs, *, replay=True, keep=False, grad=True, once=True):
    """checkpoint_hooks with one piece switchable off."""
    rng = stash_rng(*args)
    rebuilt = {}
    placeholders = itertools.count()

    def rerun():
        rebuilt.clear()
        inputs = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        with (restored_rng(rng) if replay else torch.random.fork_rng(devices=[])), torch.set_grad_enabled(grad), \
                torch.autograd.graph.saved_tensors_hooks(lambda t: rebuilt.setdefault(len(rebuilt), t.detach()),
                                                         lambda _: None):
            fn(*inputs, **kwargs)

    def pack(t):
        return t if keep else next(placeholders)

    def unpack(index):
        if keep:
            return index
        if not rebuilt or not once:
            rerun()
        return rebuilt[index]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return fn(*args, **kwargs)


def hooks_no_rng(fn, *args, **kwargs):
    """Bug 9a."""
    return _hooks(fn, args, kwargs, replay=False)


def hooks_keep_tensors(fn, *args, **kwargs):
    """Bug 9b."""
    return _hooks(fn, args, kwargs, keep=True)


def hooks_no_grad(fn, *args, **kwargs):
    return _hooks(fn, args, kwargs, grad=False)


def hooks_rerun_every_unpack(fn, *args, **kwargs):
    return _hooks(fn, args, kwargs, once=False)


def hooks_through_function(fn, *args, **kwargs):
    """A reentrant checkpoint under the name: autograd.grad cannot reach fn's parameters."""
    return ref.checkpoint(fn, *args, **kwargs)


@pytest.mark.parametrize("bug, keyword, what", [
    (hooks_no_rng, "stash the RNG state", "dropout p=0.5"),
    (hooks_keep_tensors, "placeholder", "activations alive"),
    (hooks_no_grad, "rerun fn under torch.enable_grad()", "grad mode while fn was rerun"),
    (hooks_rerun_every_unpack, "rerun fn once, at the first unpack", "calls of fn"),
    (hooks_through_function, "keep the outer graph", "torch.autograd.grad"),
])
def test_ex_2_4_catches(bug, keyword, what):
    err = _fails(checks.ex_2_4, bug)
    assert keyword in err.hint and what in err.what, err


def test_each_planted_bug_has_its_own_hint():
    """Bugs 1-9 of the lab: no two share a hint, so the hint says which mistake it was."""
    cases = [(checks.ex_2_1, ForwardWithGrad), (checks.ex_2_1, RerunWithoutGrad), (checks.ex_2_2, NoRestore),
             (checks.ex_2_1, NotDetached), (checks.ex_2_1, SavesOutput), (checks.ex_2_1, NoLeadingNone),
             (checks.ex_2_3, checkpoint_everything_through_apply), (checks.ex_2_3, checkpoint_never_warns),
             (checks.ex_2_4, hooks_no_rng), (checks.ex_2_4, hooks_keep_tensors)]
    hints = []
    for check, bug in cases:
        args = (stash_rng, restored_rng, bug) if check is checks.ex_2_2 else (bug,)
        hints.append(_fails(check, *args).hint)
    assert len(set(hints)) == len(cases)

