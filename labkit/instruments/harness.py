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
the two cannot be compared (a missing gradient, another shape or dtype). A scheme is a function
``scheme(model, x) -> output``; ``per_block(wrap)`` makes one that runs each block of the model through
``wrap(forward, x)``, e.g. ``per_block(lambda f, x: checkpoint(f, x, use_reentrant=False))``.
"""
from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from labkit.instruments.tensors import check_callable, cuda_devices, op_name

__all__ = ["Scheme", "Difference", "Report", "difference", "compare_step", "plain", "per_block", "blocks_of", "wrap_blocks", "wrapped"]

Scheme = Callable[[nn.Module, torch.Tensor], Any]
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


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


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of its element size: -0.0 and 0.0 differ, a NaN equals its own bits."""
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(_INTS[t.element_size()]) if t.dtype != torch.bool else t.to(torch.uint8)


def difference(name: str, a: torch.Tensor | None, b: torch.Tensor | None) -> Difference:
    """Compare baseline `a` with `b`: bitwise, else the largest absolute and relative error."""
    if a is None or b is None:
        if a is None and b is None:
            return Difference(name, True)
        return Difference(name, False, math.inf, math.inf, f"{'missing in the baseline' if a is None else 'missing'}")
    meta = [f"{what} {x} vs {y}" for what, x, y in (("shape", tuple(a.shape), tuple(b.shape)),
                                                     ("dtype", a.dtype, b.dtype), ("device", a.device, b.device))
            if x != y]
    if meta:
        return Difference(name, False, math.inf, math.inf, "; ".join(meta))
    differ = _bits(a) != _bits(b)
    if a.numel() == 0 or not differ.any():
        return Difference(name, True)
    a64, b64 = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    max_abs = (a64 - b64)[differ.cpu()].abs().max().item()  # only where the bits differ: inf - inf is no error
    scale = a64.abs().max().item()
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    return Difference(name, False, max_abs, max_rel)


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
def blocks_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(fqn, module) of each block of `model`: the items of its `blocks` (or `layers`) list."""
    for name in ("blocks", "layers"):
        found = getattr(model, name, None)
        if isinstance(found, (nn.ModuleList, nn.Sequential)) and len(found):
            return [(f"{name}.{i}", m) for i, m in enumerate(found)]
    raise ValueError(f"{type(model).__name__} has no blocks: a scheme applied per block needs a model with a "
                     "non-empty `blocks` (nn.ModuleList) or `layers` (nn.Sequential) of blocks")


@contextlib.contextmanager
def wrapped(modules: Sequence[nn.Module], wrap: Callable[..., Any]) -> Iterator[None]:
    """While inside, calling one of `modules` runs wrap(its forward, *args, **kwargs) instead of its forward."""
    check_callable(wrap, "wrapped", "wrap")
    for m in modules:
        m.forward = (lambda f: lambda *a, **k: wrap(f, *a, **k))(m.forward)
    try:
        yield
    finally:
        for m in modules:
            del m.forward  # the instance attribute goes; the class's forward shows again


def wrap_blocks(model: nn.Module, wrap: Callable[..., Any]) -> contextlib.AbstractContextManager[None]:
    """While inside, calling a block of `model` runs wrap(its forward, *args) instead of forward(*args)."""
    return wrapped([m for _, m in blocks_of(model)], wrap)


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
    same = difference(name, a, b)
    return same if same.bitwise else Difference(name, False, math.inf, math.inf, "the generator is in another state")


def _mean_square(output: Any) -> torch.Tensor:
    return torch.stack([t.float().square().mean() for t in tree_leaves(output)
                        if isinstance(t, torch.Tensor) and t.is_floating_point()]).sum()


def compare_step(model: nn.Module, x: torch.Tensor, scheme: Scheme, *, baseline: Scheme = plain,
                 loss_fn: Callable[[Any], torch.Tensor] | None = None, seed: int = 0) -> Report:
    """One training step of copies of `model` on `x` under `baseline` and under `scheme`, from the same state
    and seed (`model` itself is left as it was); every item compared by name (see the module's doc).

    loss_fn(output) -> scalar; default the mean square of the output. If the scheme's step raises, the
    report says so (its `error`) with what could still be compared: a scheme that refuses is a finding."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"compare_step: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"compare_step: x must be a tensor, got {type(x).__name__}")
    check_callable(scheme, "compare_step", "scheme")
    check_callable(baseline, "compare_step", "baseline")
    loss_fn = _mean_square if loss_fn is None else loss_fn
    a = _run(model, x, baseline, loss_fn, seed)
    if a.error:
        raise RuntimeError(f"compare_step: the baseline's step raised {a.error}")
    try:
        b = _run(model, x, scheme, loss_fn, seed)
    except Exception as e:  # a scheme whose forward refuses is a finding, not a crash
        return Report(error=f"{type(e).__name__} in forward: {_first_line(e)}")
    out_a = [t for t in tree_leaves(a.output) if isinstance(t, torch.Tensor)]
    out_b = [t for t in tree_leaves(b.output) if isinstance(t, torch.Tensor)]
    items = [difference("output" if len(out_a) == 1 else f"output {i}", s, t)
             for i, (s, t) in enumerate(zip(out_a, out_b))]
    items += [difference("loss", a.loss, b.loss), _metadata(b)]
    if not b.error:  # after a backward that raised, gradients and generators are half-way: not compared
        items += [difference("grad input", a.input_grad, b.input_grad)]
        items += [difference(f"grad {n}", g, b.grads.get(n)) for n, g in a.grads.items()]
        items += [difference(f"buffer {n}", t, b.buffers.get(n)) for n, t in a.buffers.items()]
        items += [_rng(f"rng {d}", s, b.rng.get(d)) for d, s in a.rng.items()]
    return Report(items, b.error)
