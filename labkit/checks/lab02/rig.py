"""The rig lab 02's checkers run student checkpoints in.

A small net with a layer before the checkpoint (so a missing detach shows),
parameters and a leaf input inside the checkpointed fn, dropout inside and
after it; the plain reference step; bitwise gradient comparison; a call
counter that notes grad mode and which tensors fn received; and weak-reference
censuses of what stays alive after forward and during backward.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

B, D_IN, D, D_MID, D_OUT = 3, 4, 6, 8, 5  # batch; features of x, h (fn's input), fn's middle, fn's output
P_DROP = 0.5
KINDS = ("one", "two", "mixed")  # fn returns one tensor; two tensors; (tensor, None, 3, an int64 tensor)


class Calls:
    """fn, counting its calls and recording grad mode, arguments and tensor identities of each."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.grad_modes: list[bool] = []
        self.args: list[tuple[Any, ...]] = []  # each tensor replaced by the string "tensor"
        self.kwargs: list[dict[str, Any]] = []
        self.tensor_ids: list[list[int]] = []  # id() of the tensors of each call, as received
        self.first_storages: list[Any] = []  # weak references to the storages of the first call's tensors

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.grad_modes.append(torch.is_grad_enabled())
        self.args.append(tuple("tensor" if isinstance(a, torch.Tensor) else a for a in args))
        self.kwargs.append(dict(kwargs))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        self.tensor_ids.append([id(t) for t in tensors])
        if len(self.tensor_ids) == 1:  # weakly: the checker must not keep the inputs alive itself
            self.first_storages = [weakref.ref(t.untyped_storage()) for t in tensors]
        return self.fn(*args, **kwargs)

    def reran_on_originals(self) -> bool:
        """A later call received one of the very tensor objects of the first call (not detached copies)."""
        first = set(self.tensor_ids[0]) if self.tensor_ids else set()
        return any(i in first for call in self.tensor_ids[1:] for i in call)

    def first_input_alive(self, i: int = 0) -> bool:
        """The storage of the first call's i-th tensor argument is still alive."""
        return self.first_storages[i]() is not None


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
        self.probe: Callable[[torch.Tensor], None] | None = None  # a gradient hook on w1's output in forward

    def middle(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        z = self.w1(h)  # (B, D_MID)
        if self.probe is not None and z.requires_grad and torch._C._current_graph_task_id() == -1:
            z.register_hook(self.probe)  # fires in backward just before w1's node, the last of fn, runs
        a = torch.tanh(z * s)
        return F.dropout(a, self.p, training=True) if self.p else a

    def fn(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The checkpointed function: one output."""
        return self.w2(self.middle(h, s))

    def fn2(self, h: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The checkpointed function: two outputs."""
        a = self.middle(h, s)
        return self.w2(a), a

    def fn_mixed(self, h: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, None, int, torch.Tensor]:
        """The checkpointed function: a tensor, a None (as Hugging Face's T5 blocks return), an int, and an
        int64 tensor (which requires no grad, yet gets a zero gradient, not None)."""
        a = self.middle(h, s)
        return self.w2(a), None, 3, a.argmax(-1)

    def function(self, kind: str) -> Callable[..., Any]:
        """fn, fn2 or fn_mixed by KINDS name."""
        return {"one": self.fn, "two": self.fn2, "mixed": self.fn_mixed}[kind]

    def grads(self) -> dict[str, torch.Tensor | None]:
        """Gradient of every leaf, named by where it sits relative to the checkpoint."""
        return {"x (before the checkpoint)": self.x.grad, "pre.weight (before the checkpoint)": self.pre.weight.grad,
                "pre.bias (before the checkpoint)": self.pre.bias.grad, "s (an input of fn)": self.s.grad,
                "w1.weight (inside fn)": self.w1.weight.grad, "w1.bias (inside fn)": self.w1.bias.grad,
                "w2.weight (inside fn)": self.w2.weight.grad, "w2.bias (inside fn)": self.w2.bias.grad}


def loss_of(out: Any, p_after: float = 0.0) -> torch.Tensor:
    """A weighted sum of fn's tensor outputs (in float32), through a dropout after the checkpoint when p_after > 0."""
    outs = [o for o in ((out,) if isinstance(out, torch.Tensor) else tuple(out))
            if isinstance(o, torch.Tensor) and o.is_floating_point()]
    total = torch.zeros((), dtype=torch.float32 if outs[0].dtype in (torch.bfloat16, torch.float16) else outs[0].dtype)
    for o in outs:
        o = F.dropout(o, p_after, training=True) if p_after else o
        total = total + (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)).sum().to(total.dtype)
    return total


def amp(on: bool) -> contextlib.AbstractContextManager[Any]:
    """CPU autocast to bfloat16 when `on` (forward only: backward runs outside it, as PyTorch recommends)."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def plain_step(dtype: torch.dtype, p: float = 0.0, kind: str = "one", autocast: bool = False
               ) -> tuple[dict, torch.Tensor]:
    """Gradients and the next random numbers of one un-checkpointed step."""
    net = Net(dtype, p)
    torch.manual_seed(1)
    with amp(autocast):
        out = net.function(kind)(net.pre(net.x), net.s)
    loss_of(out, p).backward()
    return net.grads(), torch.rand(4)


def dropout_label(p: float) -> str:
    return f"dropout p={p} inside fn and after it" if p else "no dropout"


def first_mismatch(want: dict, got: dict) -> str | None:
    """Name of the first gradient that is not bitwise equal, or None."""
    for name, w in want.items():
        g = got[name]
        if (g is None) != (w is None) or (w is not None and (g.shape != w.shape or not torch.equal(g, w))):
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
    """Weak references to the storages ops create inside the mode (of `dtype`, and passing `keep`)."""

    def __init__(self, dtype: torch.dtype, *before: torch.Tensor, keep: Callable[[], bool] = lambda: True) -> None:
        super().__init__()
        self.dtype = dtype
        self.keep = keep
        self.old = {t.untyped_storage().data_ptr() for t in before}
        self.refs: dict[int, Any] = {}  # data_ptr -> weakref to the storage

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if not self.keep():
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype in (self.dtype, torch.bool):
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


def _recomputing() -> bool:
    """Inside a backward pass with grad mode on: a recompute."""
    return torch._C._current_graph_task_id() != -1 and torch.is_grad_enabled()


@contextlib.contextmanager
def recompute_census(net: Net) -> Iterator[list[int]]:
    """Around forward and backward: yields a list that receives the bytes the recompute still holds when
    backward reaches fn's first layer.

    By then backward has used every tensor the recompute made except the one that layer needs (fn's input,
    which is no new storage): a checkpoint that hands each tensor over and forgets it holds 0 bytes, while
    one that keeps them holds them until the whole backward through fn is over.
    """
    seen: list[int] = []
    alive = Alive(net.x.dtype, net.x, net.s, *net.parameters(), keep=_recomputing)
    net.probe = lambda g: seen.append(alive.alive_bytes())
    try:
        with alive:
            yield seen
    finally:
        net.probe = None
