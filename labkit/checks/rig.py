"""The rig lab 02's checkers (and later labs') run student checkpoints in.

A small net with a layer before the checkpoint (so a missing detach shows),
parameters and a leaf input inside the checkpointed fn, dropout inside and
after it; the plain reference step; bitwise gradient comparison; a call
counter; and a weak-reference census of what stays alive after forward.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

B, D_IN, D, D_MID, D_OUT = 3, 4, 6, 8, 5  # batch; features of x, h (fn's input), fn's middle, fn's output


P_DROP = 0.5


class Calls:
    """fn, counting its calls and recording grad mode and the non-tensor arguments of each."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.grad_modes: list[bool] = []
        self.args: list[tuple[Any, ...]] = []  # each tensor replaced by the string "tensor"
        self.kwargs: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.grad_modes.append(torch.is_grad_enabled())
        self.args.append(tuple("tensor" if isinstance(a, torch.Tensor) else a for a in args))
        self.kwargs.append(dict(kwargs))
        return self.fn(*args, **kwargs)


class Net(nn.Module):
    """x -> pre -> h -> fn(h, s) -> out: a layer before the checkpoint, parameters inside fn, a leaf input s."""

    def __init__(self, dtype: torch.dtype, p: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pre = nn.Linear(D_IN, D, dtype=dtype)
        self.w1 = nn.Linear(D, D_MID, dtype=dtype)
        self.w2 = nn.Linear(D_MID, D_OUT, dtype=dtype)
        self.p = p  # dropout inside fn
        self.x = torch.randn(B, D_IN, dtype=dtype, requires_grad=True)
        self.s = (torch.rand(D_MID, dtype=dtype) + 0.5).requires_grad_()  # a per-feature scale, a leaf

    def middle(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        a = torch.tanh(self.w1(h) * s)  # (B, D_MID)
        return F.dropout(a, self.p, training=True) if self.p else a

    def fn(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The checkpointed function: one output."""
        return self.w2(self.middle(h, s))

    def fn2(self, h: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The checkpointed function: two outputs."""
        a = self.middle(h, s)
        return self.w2(a), a

    def grads(self) -> dict[str, torch.Tensor | None]:
        """Gradient of every leaf, named by where it sits relative to the checkpoint."""
        return {"x (before the checkpoint)": self.x.grad, "pre.weight (before the checkpoint)": self.pre.weight.grad,
                "pre.bias (before the checkpoint)": self.pre.bias.grad, "s (an input of fn)": self.s.grad,
                "w1.weight (inside fn)": self.w1.weight.grad, "w1.bias (inside fn)": self.w1.bias.grad,
                "w2.weight (inside fn)": self.w2.weight.grad, "w2.bias (inside fn)": self.w2.bias.grad}


def loss_of(out: Any, p_after: float = 0.0) -> torch.Tensor:
    """A weighted sum of fn's outputs, through a dropout after the checkpoint when p_after > 0."""
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    total = torch.zeros((), dtype=outs[0].dtype)
    for o in outs:
        o = F.dropout(o, p_after, training=True) if p_after else o
        total = total + (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)).sum()
    return total


def plain_step(dtype: torch.dtype, p: float = 0.0, two: bool = False) -> tuple[dict, torch.Tensor]:
    """Gradients and the next random numbers of one un-checkpointed step."""
    net = Net(dtype, p)
    torch.manual_seed(1)
    loss = loss_of((net.fn2 if two else net.fn)(net.pre(net.x), net.s), p)
    loss.backward()
    return net.grads(), torch.rand(4)


def dropout_label(p: float) -> str:
    return f"dropout p={p} inside fn and after it" if p else "no dropout"


def first_mismatch(want: dict, got: dict) -> str | None:
    """Name of the first gradient that is not bitwise equal, or None."""
    for name, w in want.items():
        g = got[name]
        if g is None or g.shape != w.shape or not torch.equal(g, w):
            return name
    return None


def show(t: torch.Tensor | None, want: torch.Tensor | None = None) -> str:
    """First values of a gradient; beside the expected one, also the largest difference from it."""
    if t is None:
        return "None"
    text = "[" + ", ".join(f"{v:.4g}" for v in t.flatten()[:4].tolist()) + ", ...]"
    if want is not None and t.shape == want.shape:
        text += f" (largest difference {(t - want).abs().max().item():.2g})"
    return text


class Alive(TorchDispatchMode):
    """Weak references to the storages of `dtype` that ops create inside the mode."""

    def __init__(self, dtype: torch.dtype, *before: torch.Tensor) -> None:
        super().__init__()
        self.dtype = dtype
        self.old = {t.untyped_storage().data_ptr() for t in before}
        self.refs: dict[int, Any] = {}  # data_ptr -> weakref to the storage

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == self.dtype:
                st = t.untyped_storage()
                old = self.refs.get(st.data_ptr())
                if st.data_ptr() not in self.old and (old is None or old() is None):  # freed memory is reused
                    self.refs[st.data_ptr()] = weakref.ref(st)
        return out

    def alive_bytes(self, *but: torch.Tensor) -> int:
        """Bytes of the storages still alive, leaving out those of `but`."""
        skip = {t.untyped_storage().data_ptr() for t in but}
        return sum(st.nbytes() for ptr, r in self.refs.items() if (st := r()) is not None and ptr not in skip)


def kept_after_forward(run: Callable[..., Any], net: Net, h: torch.Tensor) -> tuple[int, Any]:
    """Bytes of fn's activations alive once run(fn, h, s) has returned, and its output."""
    __tracebackhide__ = True
    with Alive(h.dtype, h, net.s, *net.parameters()) as alive:
        out = run(net.fn, h, net.s)
    return alive.alive_bytes(out), out
