"""State-equivalence harness: does a checkpointing scheme leave a training step exactly as it was?

``compare_step(model, x, scheme)`` runs one training step of two deep copies of `model` from the same
starting state and the same generator seed: once plainly (or under `baseline`), once under `scheme`. It
compares everything that should match and reports each item by name:

- the output, the loss, the gradient of the input and of every parameter (``grad NAME``);
- every buffer after the step (BatchNorm's running mean and variance, ``num_batches_tracked``);
- the random generators' states after the step (``rng cpu``, ``rng cuda:0``): a scheme that replays the
  generator leaves it where the plain step left it;
- the saved-tensor metadata: every tensor the scheme recomputes during backward must have the shape, dtype
  and device of one its forward made (what ``torch.utils.checkpoint``'s ``determinism_check`` compares).

Each item is a ``Difference``: bitwise equal, or how far apart (largest absolute and relative error), or why
the two cannot be compared (a missing gradient, another shape or dtype). Comparing two tensors so is Exercise
6.1 of lab 06; the harness takes that comparison as its argument, ``compare_step(..., difference=...)``: in the
lab it is the student's own, in the checkers their independent oracle. A scheme is a function
``scheme(model, x) -> output``; ``per_block(wrap)`` makes one that runs each block of the model through
``wrap(forward, x)``, e.g. ``per_block(lambda f, x: checkpoint(f, x, use_reentrant=False))``.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from labkit.instruments.blocks import wrap_blocks
from labkit.instruments.tensors import check_callable, cuda_devices, op_name
from labkit.stubs import stub_of

__all__ = ["Scheme", "Compare", "Difference", "Report", "compare_step", "plain", "per_block"]

Scheme = Callable[[nn.Module, torch.Tensor], Any]
Compare = Callable[[str, "torch.Tensor | None", "torch.Tensor | None"], "Difference"]  # difference(name, a, b)


@dataclass(frozen=True)
class Difference:
    """How one compared item of two steps differs: bitwise equal, or by how much, or why not comparable."""

    name: str  # what was compared: "loss", "grad blocks.0.mlp.fc1.weight", "buffer bn.running_mean", ...
    bitwise: bool  # same shape, dtype and device, and every element has the same bits
    max_abs: float = 0.0  # largest |a - b| over the elements whose bits differ; inf when not comparable
    max_rel: float = 0.0  # max_abs over the largest |a| (the baseline's); inf when that is 0 and max_abs is not
    detail: str = ""  # why the two cannot be compared (a missing tensor, another shape/dtype/device); else ""

    def __str__(self) -> str:
        if self.bitwise:
            return f"{self.name}: bitwise equal"
        if self.detail:
            return f"{self.name}: {self.detail}"
        return f"{self.name}: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}"


@dataclass
class Report:
    """Every compared item of two steps, in order; `ok` when all are bitwise equal."""

    items: list[Difference] = field(default_factory=list)
    error: str = ""  # what the scheme's step raised; a backward that raised leaves only output, loss, metadata

    @property
    def ok(self) -> bool:
        return not self.error and all(d.bitwise for d in self.items)

    @property
    def failures(self) -> list[Difference]:
        return [d for d in self.items if not d.bitwise]

    def __getitem__(self, name: str) -> Difference:
        for d in self.items:
            if d.name == name:
                return d
        raise KeyError(f"{name!r} was not compared; compared: {', '.join(d.name for d in self.items)}")

    def names(self, prefix: str = "") -> list[str]:
        """The compared items' names starting with `prefix`."""
        return [d.name for d in self.items if d.name.startswith(prefix)]

    def within(self, rtol: float, ignore: Sequence[str] = ()) -> bool:
        """Every item comparable and within relative error `rtol`, except those whose name contains a word of
        `ignore`."""
        return not self.error and all(d.bitwise or (not d.detail and d.max_rel <= rtol)
                                      for d in self.items if not any(w in d.name for w in ignore))

    def __str__(self) -> str:
        equal = sum(d.bitwise for d in self.items)
        head = f"{equal} of {len(self.items)} compared items bitwise equal"
        lines = [f"the scheme's step raised {self.error}"] if self.error else []
        return "\n".join(lines + [head + (":" if self.failures else ""), *(f"  {d}" for d in self.failures)])


# ---------------------------------------------------------------- schemes
def plain(model: nn.Module, x: torch.Tensor) -> Any:
    """The step without checkpointing."""
    return model(x)


def per_block(wrap: Callable[..., Any]) -> Scheme:
    """A scheme running each block of the model through wrap(forward, x) (a checkpoint)."""
    check_callable(wrap, "per_block", "wrap")

    def scheme(model: nn.Module, x: torch.Tensor) -> Any:
        with wrap_blocks(model, wrap):
            return model(x)
    return scheme


# ---------------------------------------------------------------- one step, recorded
class _Metadata(TorchDispatchMode):
    """(shape, dtype, device) of every tensor an op makes, with the op's name: in forward, and recomputed in
    backward (ops run during backward with grad mode on; the engine runs a backward's own ops with it off)."""

    def __init__(self) -> None:
        super().__init__()
        self.backward = False
        self.forward_made: set[tuple] = set()
        self.recomputed: dict[tuple, str] = {}  # metadata -> the first op that recomputed it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = op_name(func)  # views, in-place ops (add_) and detach make no new tensor: not compared
        if not func.is_view and not name.endswith("_") and name not in ("detach", "alias", "lift_fresh"):
            made = [(tuple(t.shape), t.dtype, str(t.device)) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if not self.backward:
                self.forward_made.update(made)
            elif torch.is_grad_enabled():
                for m in made:
                    self.recomputed.setdefault(m, name)
        return out


@dataclass
class _Step:
    output: Any
    loss: torch.Tensor
    input_grad: torch.Tensor | None
    grads: dict[str, torch.Tensor | None]
    buffers: dict[str, torch.Tensor]
    rng: dict[str, torch.Tensor]
    metadata: _Metadata
    error: str  # what backward raised, or ""


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def _run(model: nn.Module, x: torch.Tensor, scheme: Scheme, loss_fn: Callable[[Any], torch.Tensor],
         seed: int) -> _Step:
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = None  # deepcopy copies gradients: the step starts without any
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    devices = cuda_devices(model, x)
    error = ""
    with torch.random.fork_rng(devices=devices), _Metadata() as meta:
        torch.manual_seed(seed)
        output = scheme(model, x)
        loss = loss_fn(output)
        seed_grad = torch.ones_like(loss)  # made here: backward() would make it with grad mode on
        meta.backward = True
        try:
            loss.backward(seed_grad)
        except Exception as e:  # a recomputation that went wrong: reported with what was recorded before it
            if stub_of(e) is not None:
                raise  # an exercise's stub, not a finding (as in compare_step)
            error = f"{type(e).__name__} in backward: {_first_line(e)}"
        rng = {"cpu": torch.get_rng_state(), **{f"cuda:{d}": torch.cuda.get_rng_state(d) for d in devices}}
    return _Step(output, loss.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()},
                 {n: b.detach().clone() for n, b in model.named_buffers()}, rng, meta, error)


def _metadata(step: _Step) -> Difference:
    """Every recomputed tensor's shape, dtype and device must be one the forward made (as
    torch.utils.checkpoint's determinism_check asks of the saved ones)."""
    unmatched = {m: op for m, op in step.metadata.recomputed.items() if m not in step.metadata.forward_made}
    if not unmatched:
        return Difference("saved-tensor metadata", True)
    (shape, dtype, device), op = next(iter(unmatched.items()))
    return Difference("saved-tensor metadata", False, math.inf, math.inf,
                      f"the recomputation made {len(unmatched)} kinds of tensor the forward never made, e.g. {op} -> "
                      f"{list(shape)} {str(dtype).removeprefix('torch.')} on {device}")


def _rng(name: str, a: torch.Tensor, b: torch.Tensor | None) -> Difference:
    """A generator's state (a uint8 tensor) after both steps: the same bytes, or another state."""
    if b is not None and torch.equal(a, b):
        return Difference(name, True)
    return Difference(name, False, math.inf, math.inf, "the generator is in another state")


def _mean_square(output: Any) -> torch.Tensor:
    return torch.stack([t.float().square().mean() for t in tree_leaves(output)
                        if isinstance(t, torch.Tensor) and t.is_floating_point()]).sum()


def _compared(compare: Compare, name: str, a: torch.Tensor | None, b: torch.Tensor | None) -> Difference:
    found = compare(name, a, b)
    if not isinstance(found, Difference):
        raise TypeError(f"compare_step: difference({name!r}, ...) returned {type(found).__name__} {found!r:.60}, "
                        "not a Difference")
    return found


def compare_step(model: nn.Module, x: torch.Tensor, scheme: Scheme, *, difference: Compare,
                 baseline: Scheme = plain, loss_fn: Callable[[Any], torch.Tensor] | None = None,
                 seed: int = 0) -> Report:
    """One training step of copies of `model` on `x` under `baseline` and under `scheme`, from the same state
    and seed (`model` itself is left as it was); every item compared by name with `difference` (see the
    module's doc).

    loss_fn(output) -> scalar; default the mean square of the output. If the scheme's step raises, the
    report says so (its `error`) with what could still be compared: a scheme that refuses is a finding."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"compare_step: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"compare_step: x must be a tensor, got {type(x).__name__}")
    check_callable(scheme, "compare_step", "scheme")
    check_callable(baseline, "compare_step", "baseline")
    check_callable(difference, "compare_step", "difference")
    loss_fn = _mean_square if loss_fn is None else loss_fn
    a = _run(model, x, baseline, loss_fn, seed)
    if a.error:
        raise RuntimeError(f"compare_step: the baseline's step raised {a.error}")
    try:
        b = _run(model, x, scheme, loss_fn, seed)
    except Exception as e:  # a scheme whose forward refuses is a finding, not a crash
        if stub_of(e) is not None:
            raise  # a scheme not written yet (an exercise's stub) is no finding: the cell shows the stub's error
        return Report(error=f"{type(e).__name__} in forward: {_first_line(e)}")
    out_a = [t for t in tree_leaves(a.output) if isinstance(t, torch.Tensor)]
    out_b = [t for t in tree_leaves(b.output) if isinstance(t, torch.Tensor)]
    pairs = [("output" if len(out_a) == 1 else f"output {i}", s, t) for i, (s, t) in enumerate(zip(out_a, out_b))]
    pairs.append(("loss", a.loss, b.loss))
    if not b.error:  # after a backward that raised, gradients and generators are half-way: not compared
        pairs.append(("grad input", a.input_grad, b.input_grad))
        pairs += [(f"grad {n}", g, b.grads.get(n)) for n, g in a.grads.items()]
        pairs += [(f"buffer {n}", t, b.buffers.get(n)) for n, t in a.buffers.items()]
    items = [_compared(difference, *pair) for pair in pairs]
    items.insert(len(out_a) + 1, _metadata(b))  # after the output and the loss, as the module's doc lists them
    if not b.error:
        items += [_rng(f"rng {d}", s, b.rng.get(d)) for d, s in a.rng.items()]
    return Report(items, b.error)
