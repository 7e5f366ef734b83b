"""Tests for the checkers of 02_recompute: they pass the reference and catch each planted bug with its own hint."""
from __future__ import annotations

import itertools
import types
import warnings
from contextlib import ExitStack, contextmanager

import pytest
import torch

from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.checks.lab02 import hints as H
from labkit.reference import recompute as ref
from labkit.reference.recompute import (
    RecomputeRNG, Recompute, refuse_unsupported_backward, restored_autocast, restored_rng, save_inputs,
    stash_autocast, stash_rng,
)
from torch.utils.checkpoint import checkpoint as torch_checkpoint

# Checker strength (docs/maintainers.md, "Checker strength"): tools/mutants.py labkit/reference/recompute.py
# tests/test_checks_lab02.py, --sample 10 --seed 1 and --sample 30 --seed 2 (all 23 mutants). The survivors on a
# CPU, read, GPU-only:
# - restored_rng, `torch.cuda.set_rng_state(cuda_state, device)` deleted, and stash_rng, `a.device.index or 0` ->
#   `or 1`: test_cuda_generator_and_autocast_are_checked holds both on one GPU (the replayed CUDA draw differs;
#   device 1 does not exist there).
# - stash_rng, `a.device.index or 0` -> `and 0`: device 0's generator stashed for an input on another device; the
#   same on one GPU, and test_the_generator_of_the_input_s_own_device_is_checked holds it on two.


def _fails(check, *args) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(*args)
    assert not isinstance(info.value, NotAttempted), info.value
    return info.value


# ---------------------------------------------------------------- the reference passes
@pytest.mark.parametrize("check, args", [
    (checks.ex_2_1, (Recompute,)), (checks.ex_2_2, (stash_rng, restored_rng, RecomputeRNG)),
    (checks.ex_2_3, (stash_autocast, restored_autocast)), (checks.ex_2_4, (ref.checkpoint,)),
    (checks.ex_2_5, (ref.checkpoint_hooks,)),
], ids=["2.1", "2.2", "2.3", "2.4", "2.5"])
def test_the_reference_passes(check, args, capsys):
    check(*args)
    assert capsys.readouterr().out.startswith(f"[ex {check.__name__[3:].replace('_', '.')}] passed")


@pytest.mark.parametrize("check, reentrant", [(checks.ex_2_4, True), (checks.ex_2_5, False)], ids=["2.4", "2.5"])
def test_an_answer_wrapping_pytorch_s_own_checkpoint_fails_with_its_own_hint(check, reentrant):
    """The checker asks of checkpoint_hooks what PyTorch's own non-reentrant checkpoint does; calling it is no
    answer: the exercise builds one."""
    err = _fails(check, lambda fn, *args, **kwargs: torch_checkpoint(fn, *args, use_reentrant=reentrant, **kwargs))
    assert err.hint == H.FROM_SCRATCH and "torch.utils.checkpoint" in err.got


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


@contextmanager
def stub_restored_autocast(state):
    raise NotImplementedError("Exercise 2.3: re-enter the forward's autocast")
    yield


@pytest.mark.parametrize("check, args, ex", [
    (checks.ex_2_1, (StubRecompute,), "2.1"),
    (checks.ex_2_1, (StubBackward,), "2.1"),
    (checks.ex_2_2, (_stub("2.2"), restored_rng, RecomputeRNG), "2.2"),
    (checks.ex_2_2, (stash_rng, stub_restored_rng, RecomputeRNG), "2.2"),
    (checks.ex_2_3, (_stub("2.3"), restored_autocast), "2.3"),
    (checks.ex_2_3, (stash_autocast, stub_restored_autocast), "2.3"),
    (checks.ex_2_4, (_stub("2.4"),), "2.4"),
    (checks.ex_2_5, (_stub("2.5"),), "2.5"),
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
    (checks.ex_2_3, (stash_autocast(), restored_autocast)),
    (checks.ex_2_4, (torch.zeros(2),)),
    (checks.ex_2_5, ("checkpoint_hooks",)),
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


class TensorOutputsOnly(Recompute):
    """fn's outputs taken to be tensors: an int or None output crashes backward."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        with torch.enable_grad():
            outputs = ctx.fn(*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, *[x.grad for x in inputs])


class WrongOrder(Recompute):
    """The input gradients returned in reverse order."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        none, *grads = Recompute.backward(ctx, *grad_outputs)
        return (none, *grads[::-1])


class NoRefusal(Recompute):
    """The given refuse_unsupported_backward() line deleted."""

    @staticmethod
    def backward(ctx, *grad_outputs):
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        with torch.enable_grad():
            outputs = ctx.fn(*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, *[x.grad for x in inputs])


@pytest.mark.parametrize("bug, keyword, what", [
    (ForwardWithGrad, "torch.no_grad()", "grad mode while forward ran fn"),
    (RerunWithoutGrad, "recompute under torch.enable_grad()", "grad mode while backward reran fn"),
    (NotDetached, "get their gradients twice", "backward"),
    (SavesOutput, "save only the inputs", "bytes kept for backward"),
    (KeepsOutputOnCtx, "save only the inputs", "bytes kept for backward"),
    (NoLeadingNone, "None for fn, then one per input", "backward"),
    (NoInputGrad, "the gradient stopped at the checkpoint", "gradient of x"),
    (RerunsTwice, "exactly twice", "calls of fn"),
    (NotSaved, "ctx's own method for saving tensors", "bytes saved"),
    (ForwardRaises, "forward(ctx, fn, *args)", "Recompute.apply"),
    (TensorOutputsOnly, "outputs that are tensors and require grad", "outputs (tensor, None, 3, int64 tensor)"),
    (WrongOrder, "in the order the inputs came", "backward"),
    (NoRefusal, "refuse_unsupported_backward()", "torch.autograd.grad(loss, [x])"),
])
def test_ex_2_1_catches(bug, keyword, what):
    err = _fails(checks.ex_2_1, bug)
    assert keyword in err.hint and what in err.what, err
    assert str(err).startswith("[ex 2.1] ")


def test_ex_2_1_hints_are_distinct():
    bugs = (ForwardWithGrad, RerunWithoutGrad, NotDetached, SavesOutput, NoLeadingNone, NoInputGrad, RerunsTwice,
            NotSaved, TensorOutputsOnly, WrongOrder, NoRefusal)
    hints = {_fails(checks.ex_2_1, bug).hint for bug in bugs}
    # an int output paired with its zero gradient and an int output crashing .requires_grad: one mistake, one hint
    assert _fails(checks.ex_2_1, int_output_recompute_bug()).hint == _fails(checks.ex_2_1, TensorOutputsOnly).hint
    assert len(hints) == len(bugs)


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


def _broken_rng(Base, restored=restored_rng):
    """RecomputeRNG built on `Base` (a planted Recompute bug), replaying the RNG with `restored`."""
    class Broken(Base):
        @staticmethod
        def forward(ctx, fn, *args):
            ctx.rng = stash_rng(*args)
            return Base.forward(ctx, fn, *args)

        @staticmethod
        def backward(ctx, *grad_outputs):
            with restored(ctx.rng):
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
def stash_autocast_no_dtype(*args):
    """The dtype is not stashed: bfloat16 is assumed."""
    state = stash_autocast(*args)
    state.settings = {d: (on, torch.bfloat16) for d, (on, _) in state.settings.items()}
    return state


@contextmanager
def restored_autocast_nothing(state):
    """The block runs under whatever autocast is active."""
    yield


@contextmanager
def restored_autocast_always_on(state):
    """enabled is not passed on: autocast is switched on even for a forward that ran without it."""
    with ExitStack() as stack:
        for device, (_, dtype) in state.settings.items():
            stack.enter_context(torch.autocast(device, dtype=dtype))
        yield


@contextmanager
def restored_autocast_never_left(state):
    """autocast is switched on by hand and never switched back."""
    for device, (enabled, dtype) in state.settings.items():
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    yield


@contextmanager
def restored_autocast_cache_on(state):
    """cache_enabled is not passed on: the weight-cast cache is on whatever the forward ran with."""
    with ExitStack() as stack:
        for device, (enabled, dtype) in state.settings.items():
            stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled))
        yield


def restored_autocast_plain_function(state):
    """Not a context manager."""
    torch.set_autocast_enabled("cpu", True)


@pytest.fixture(autouse=True)
def _autocast_off_after_each_test():
    yield
    torch.set_autocast_enabled("cpu", False)
    torch.set_autocast_dtype("cpu", torch.bfloat16)


@pytest.mark.parametrize("args, keyword, what", [
    ((stash_autocast_no_dtype, restored_autocast), "dtype too", "float16"),
    ((stash_autocast, restored_autocast_nothing), "ran in float32", "bfloat16"),
    ((stash_autocast, restored_autocast_always_on), "enabled=that", "without autocast"),
    ((stash_autocast, restored_autocast_never_left), "leaving the block", "after the with-block"),
    ((stash_autocast, restored_autocast_plain_function), "@contextmanager", "restored_autocast(s)"),
    ((stash_autocast, restored_autocast_cache_on), "weight-cast cache", "cache_enabled=False"),
])
def test_ex_2_3_catches(args, keyword, what):
    err = _fails(checks.ex_2_3, *args)
    assert keyword in err.hint and what in err.what, err


# ---------------------------------------------------------------- planted bugs of Exercise 2.4
def _split(args):
    where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    return where, [args[i] for i in where]


def checkpoint_everything_through_apply(fn, *args, **kwargs):
    """Bug 7a: non-tensors go through Function.apply."""
    if torch.is_grad_enabled() and not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    return RecomputeRNG.apply(lambda *a: fn(*a, **kwargs), *args)


def _others(args):
    """args with every tensor replaced by None: what a closure may hold."""
    return [None if isinstance(a, torch.Tensor) else a for a in args]


def checkpoint_drops_kwargs(fn, *args, **kwargs):
    """Bug 7b: the keyword arguments never reach fn."""
    where, tensors = _split(args)
    if torch.is_grad_enabled() and not any(t.requires_grad for t in tensors):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    others, autocast = _others(args), stash_autocast(*tensors)

    def run(*tensor_args):
        full = list(others)
        for i, t in zip(where, tensor_args):
            full[i] = t
        with restored_autocast(autocast):
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


def checkpoint_warns_too_far_up(fn, *args, **kwargs):
    """The warning points past the caller, at the caller's caller (stacklevel=3)."""
    if torch.is_grad_enabled() and not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=3)
    return checkpoint_never_warns(fn, *args, **kwargs)


def checkpoint_without_rng(fn, *args, **kwargs):
    """Recompute.apply instead of RecomputeRNG.apply."""
    where, tensors = _split(args)
    if torch.is_grad_enabled() and not any(t.requires_grad for t in tensors):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    return Recompute.apply(lambda *t: fn(*t, **kwargs), *tensors) if len(where) == len(args) else None


def checkpoint_on_broken_recompute(fn, *args, **kwargs):
    return _broken_rng(NoLeadingNone).apply(fn, *args)


def checkpoint_without_autocast(fn, *args, **kwargs):
    """The autocast state is not replayed: the recompute runs in float32."""
    where, tensors = _split(args)
    if torch.is_grad_enabled() and not any(t.requires_grad for t in tensors):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    others = _others(args)

    def run(*tensor_args):
        full = list(others)
        for i, t in zip(where, tensor_args):
            full[i] = t
        return fn(*full, **kwargs)

    return RecomputeRNG.apply(run, *tensors)


def checkpoint_closes_over_args(fn, *args, **kwargs):
    """run ignores the tensors it is given and reruns fn on the originals."""
    where, tensors = _split(args)
    autocast = stash_autocast(*tensors)

    def run(*tensor_args):
        with restored_autocast(autocast):
            return fn(*args, **kwargs)

    return RecomputeRNG.apply(run, *tensors)


class _NoRefusalRNG(RecomputeRNG):
    @staticmethod
    def backward(ctx, *grad_outputs):
        with restored_rng(ctx.rng):
            return NoRefusal.backward(ctx, *grad_outputs)


def checkpoint_without_refusal(fn, *args, **kwargs):
    """Built on a Function of its own that answers .grad() by writing .grad inside fn."""
    where, tensors = _split(args)
    if torch.is_grad_enabled() and not any(t.requires_grad for t in tensors):
        warnings.warn(ref.NO_GRAD_INPUTS, stacklevel=2)
    autocast, others = stash_autocast(*tensors), _others(args)

    def run(*tensor_args):
        full = list(others)
        for i, t in zip(where, tensor_args):
            full[i] = t
        with restored_autocast(autocast):
            return fn(*full, **kwargs)

    return _NoRefusalRNG.apply(run, *tensors)


def _in_namespace(fn, **names):
    """fn as if defined in a notebook whose `names` are the given (broken) definitions."""
    namespace = dict(fn.__globals__, **names)
    return types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("bug, keyword, what", [
    (checkpoint_everything_through_apply, "non-tensor arguments", "checkpoint(fn, h, 0.5, s, True, None"),
    (checkpoint_drops_kwargs, "non-tensor arguments", "arguments fn received in forward"),
    (checkpoint_never_warns, "warnings.warn(", "no input requires grad"),
    (checkpoint_warns_always, "none of them does", "s requires grad"),
    (checkpoint_warns_under_no_grad, "torch.is_grad_enabled()", "under torch.no_grad()"),
    (checkpoint_warns_here, "stacklevel=2", "where the warning points"),
    (checkpoint_warns_too_far_up, "stacklevel=2", "where the warning points"),
    (checkpoint_without_rng, "use RecomputeRNG.apply", "dropout p=0.5"),
    (checkpoint_without_autocast, "restored_autocast(state) inside run", "forward under autocast"),
    (checkpoint_closes_over_args, "not the ones checkpoint was called with", "tensors fn received"),
    (checkpoint_without_refusal, "refuse_unsupported_backward()", "torch.autograd.grad"),
    (_in_namespace(ref.checkpoint, restored_rng=restored_rng_no_fork, RecomputeRNG=_broken_rng(Recompute, restored_rng_no_fork)),
     "make Exercise 2.2 pass first", "Exercise 2.2, which checkpoint is built on"),
    (_in_namespace(ref.checkpoint, Recompute=NoLeadingNone, RecomputeRNG=_broken_rng(NoLeadingNone)),
     "make Exercise 2.1 pass first", "Exercise 2.1, which checkpoint is built on"),
    (_in_namespace(ref.checkpoint, restored_autocast=restored_autocast_nothing), "make Exercise 2.3 pass first",
     "Exercise 2.3, which checkpoint is built on"),
])
def test_ex_2_4_catches(bug, keyword, what):
    err = _fails(checks.ex_2_4, bug)
    assert keyword in err.hint and what in err.what, err


# ---------------------------------------------------------------- planted bugs of Exercise 2.5
def _hooks(fn, args, kwargs, *, replay=True, keep=False, grad=True, once=True, fork=True, pop=True,
           through_autograd=True, per_task=True, autocast=True, exact=True, rerun_kwargs=True, frozen=True):
    """checkpoint_hooks with one piece switchable off."""
    if not frozen and not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        with torch.no_grad():  # "no input requires grad: nothing to differentiate", as the reentrant design warns
            return fn(*args, **kwargs)
    rng, amp = stash_rng(*args), stash_autocast(*args)
    saved = save_inputs([a for a in args if isinstance(a, torch.Tensor)]) if through_autograd else None
    rebuilt = {}
    placeholders = itertools.count()

    def replayed():
        if not replay:
            return torch.random.fork_rng(devices=[])
        if fork:
            return restored_rng(rng)
        torch.set_rng_state(rng.cpu)  # the generator is left where the rerun ends
        return ExitStack()

    def rerun():
        tensors = iter(saved()) if through_autograd else iter(a for a in args if isinstance(a, torch.Tensor))
        inputs = [next(tensors).detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                  for a in args]
        kept = {}
        with replayed(), (restored_autocast(amp) if autocast else ExitStack()), torch.set_grad_enabled(grad), \
                torch.autograd.graph.saved_tensors_hooks(
                    lambda t: kept.setdefault(len(kept), t.detach() if exact else t.detach().half().float()),
                    lambda _: None):
            fn(*inputs, **(kwargs if rerun_kwargs else {}))
        return kept

    def pack(t):
        return t.detach() if keep else next(placeholders)

    def unpack(index):
        if keep:
            return index
        task = torch._C._current_graph_task_id() if per_task else 0
        if task not in rebuilt or not once:
            rebuilt[task] = rerun()
        return rebuilt[task].pop(index) if pop else rebuilt[task][index]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return fn(*args, **kwargs)


def _hooks_bug(**off):
    def bug(fn, *args, **kwargs):
        return _hooks(fn, args, kwargs, **off)
    bug.__name__ = "hooks_" + "_".join(off)
    return bug


def hooks_through_function(fn, *args, **kwargs):
    """A reentrant checkpoint under the name: autograd.grad cannot reach fn's parameters."""
    return ref.checkpoint(fn, *args, **kwargs)


def test_the_hooks_rig_with_nothing_off_passes():
    checks.ex_2_5(_hooks_bug())


HOOK_BUGS = [
    (dict(replay=False), "stash the RNG state", "dropout p=0.5"),
    (dict(keep=True), "placeholder", "activations alive"),
    (dict(grad=False), "rerun fn under torch.enable_grad()", "grad mode while fn was rerun"),
    (dict(once=False), "rerun fn once, at the first unpack", "calls of fn"),
    (dict(fork=False), "afterwards the generator must continue", "torch.rand(4) after the step"),
    (dict(pop=False), "hand each tensor over and forget it", "still held"),
    (dict(through_autograd=False), "save_inputs", "bytes saved"),
    (dict(per_task=False), "torch._C._current_graph_task_id()", "retain_graph=True"),
    (dict(autocast=False), "restored_autocast(state)", "forward under autocast"),
    (dict(exact=False), "i-th tensor the rerun saved", "no dropout: gradient of"),
    (dict(rerun_kwargs=False), "keyword arguments must reach fn unchanged in the rerun", "shift=2.0"),
    (dict(frozen=False), "no input requires grad", "requiring no grad"),
]


@pytest.mark.parametrize("off, keyword, what", HOOK_BUGS, ids=["_".join(b[0]) for b in HOOK_BUGS])
def test_ex_2_5_catches(off, keyword, what):
    err = _fails(checks.ex_2_5, _hooks_bug(**off))
    assert keyword in err.hint and what in err.what, err


def test_ex_2_5_catches_a_reentrant_checkpoint():
    err = _fails(checks.ex_2_5, hooks_through_function)
    assert "keep the outer graph" in err.hint and "torch.autograd.grad" in err.what, err


def test_ex_2_5_prerequisite():
    err = _fails(checks.ex_2_5, _in_namespace(ref.checkpoint_hooks, restored_autocast=restored_autocast_nothing))
    assert "make Exercise 2.3 pass first" in err.hint, err


# ---------------------------------------------------------------- one hint per mistake, each from the table
def test_each_planted_bug_has_its_own_hint():
    """No two mistakes share a hint, so the hint says which mistake it was."""
    cases = [(checks.ex_2_1, (b,)) for b in (ForwardWithGrad, RerunWithoutGrad, NotDetached, SavesOutput,
                                             NoLeadingNone, NoInputGrad, RerunsTwice, NotSaved, TensorOutputsOnly,
                                             WrongOrder, NoRefusal)]
    cases += [(checks.ex_2_2, (stash_rng, restored_rng, NoRestore)),
              (checks.ex_2_2, (stash_rng, restored_rng_sets_nothing, RecomputeRNG)),
              (checks.ex_2_2, (stash_rng, restored_rng_no_fork, RecomputeRNG))]
    cases += [(checks.ex_2_3, a) for a in ((stash_autocast_no_dtype, restored_autocast),
                                           (stash_autocast, restored_autocast_nothing),
                                           (stash_autocast, restored_autocast_always_on),
                                           (stash_autocast, restored_autocast_never_left),
                                           (stash_autocast, restored_autocast_cache_on))]
    cases += [(checks.ex_2_4, (b,)) for b in (checkpoint_everything_through_apply, checkpoint_never_warns,
                                              checkpoint_without_rng, checkpoint_without_autocast,
                                              checkpoint_closes_over_args, checkpoint_without_refusal)]

    cases += [(checks.ex_2_5, (_hooks_bug(**off),)) for off, *_ in HOOK_BUGS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hints = [_fails(check, *args).hint for check, args in cases]
    assert len(set(hints)) == len(cases), [h for h in hints if hints.count(h) > 1]


def checkpoint_rebuilds_from_args(fn, *args, **kwargs):
    """run takes the tensors it is given, but rebuilds fn's arguments from the captured args: the rerun is right,
    yet the closure keeps every input alive as long as the graph."""
    where, tensors = _split(args)
    autocast = stash_autocast(*tensors)

    def run(*tensor_args):
        full = list(args)
        for i, t in zip(where, tensor_args):
            full[i] = t
        with restored_autocast(autocast):
            return fn(*full, **kwargs)

    return RecomputeRNG.apply(run, *tensors)


def test_ex_2_4_catches_a_closure_that_keeps_the_inputs_alive():
    err = _fails(checks.ex_2_4, checkpoint_rebuilds_from_args)
    assert "keeps the inputs alive" in err.hint and "h once backward has used it" in err.what, err


def int_output_recompute_bug():
    """Recompute that pairs every tensor output with its gradient, requiring grad or not."""
    class TensorsAll(Recompute):
        @staticmethod
        def backward(ctx, *grad_outputs):
            refuse_unsupported_backward()
            inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
            with torch.enable_grad():
                outputs = ctx.fn(*inputs)
            outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
            pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if isinstance(o, torch.Tensor)]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            return (None, *[x.grad for x in inputs])
    return TensorsAll


def test_ex_2_1_catches_an_int_tensor_output_paired_with_its_zero_gradient():
    err = _fails(checks.ex_2_1, int_output_recompute_bug())
    assert "tensors and require grad" in err.hint and "outputs (tensor, None, 3" in err.what, err


# ---------------------------------------------------------------- CUDA (run by `python -m labkit gpu-check`)
def stash_rng_cpu_only(*args):
    return ref.RNGState(torch.get_rng_state())


def stash_autocast_cpu_only(*args):
    return stash_autocast()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_generator_and_autocast_are_checked():
    checks.ex_2_2(stash_rng, restored_rng, RecomputeRNG)
    checks.ex_2_3(stash_autocast, restored_autocast)
    err = _fails(checks.ex_2_2, stash_rng_cpu_only, restored_rng, RecomputeRNG)
    assert "torch.cuda.get_rng_state" in err.hint, err
    err = _fails(checks.ex_2_3, stash_autocast_cpu_only, restored_autocast)
    assert "every device type" in err.hint, err


def stash_rng_device_zero(*args):
    """The CUDA generator of device 0, whatever device the inputs are on."""
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    return ref.RNGState(torch.get_rng_state(), {0: torch.cuda.get_rng_state(0)} if cuda else {})


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_the_generator_of_the_input_s_own_device_is_checked():
    checks.ex_2_2(stash_rng, restored_rng, RecomputeRNG)
    err = _fails(checks.ex_2_2, stash_rng_device_zero, restored_rng, RecomputeRNG)
    assert "torch.cuda.get_rng_state" in err.hint and f"cuda:{torch.cuda.device_count() - 1}" in err.what, err

