"""torch.compile with an activation memory budget, run where the meter sees it.

``torch._functorch.config.activation_memory_budget`` is read when AOTAutograd partitions a compiled graph into
forward and backward (its min-cut partitioner; 1.0 is the default partition, 0.0 recomputes all it can), so a
function is compiled under it, once per budget. The backend ``aot_eager_decomp_partition`` runs that
partitioner and then eager kernels: no Inductor fusion, so its step times compare like for like with eager
plans. Dynamo runs compiled code only where no dispatch mode is active, so a compiled call sets aside the modes
active in its thread (the meter's, a ledger's) and its graphs run inside them (``outside_meters``,
``metered_backend``). And since dynamo falls
back to running a function eagerly without an error (a graph it cannot capture, a recompile limit reached),
every ``Compiled`` counts the compiled graphs it ran, and ``check_ran`` refuses a step that ran none.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import (TorchDispatchMode, _disable_current_modes,
                                          _get_current_dispatch_mode_stack)

__all__ = ["Compiled", "RandomDraws", "metered_backend", "outside_meters", "recompile_limits"]

# How many Compiled share each code object: every block of a model shares its class's forward, and each budget
# compiles it again, so one code object takes blocks x budgets cache entries (72 for lab 07's 8 blocks at 9
# budgets), more than any fixed limit would fit
_SHARING: dict[Any, int] = {}


def _release(code: Any) -> None:
    """One Compiled of `code` less."""
    if _SHARING.get(code, 0) > 1:
        _SHARING[code] -= 1
    else:
        _SHARING.pop(code, None)


def _code(fn: Callable[..., Any]) -> Any:
    """The code object dynamo keys its cache on: a bound method's function's."""
    return getattr(getattr(fn, "__func__", fn), "__code__", fn)


def metered_backend(backend: Callable[..., Any], on_run: Callable[[], None] | None = None) -> Callable[..., Any]:
    """A torch.compile backend that compiles as `backend` and runs each compiled graph inside the dispatch modes
    that ``outside_meters`` set aside in this thread (every meter, and a ledger's or a tracer's mode with them), so
    that the graph's ops are seen as any others by exactly the modes that were active where it was called;
    on_run() before each run."""
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        run = backend(gm, example_inputs)

        def metered(*args: Any) -> Any:
            if on_run is not None:
                on_run()
            with contextlib.ExitStack() as stack:
                for mode in getattr(_SET_ASIDE, "modes", ()):  # outermost first, as they were
                    stack.enter_context(mode)
                return run(*args)
        return metered
    return compile_graph


# The dispatch modes outside_meters set aside, per thread: dispatch modes are a thread's own (torch keeps them in
# thread-local state, and the autograd engine carries them into its worker threads), so a compiled graph run by
# one thread is never counted by a meter another thread entered
_SET_ASIDE = threading.local()


@contextlib.contextmanager
def outside_meters() -> Iterator[None]:
    """No dispatch mode active inside (the meters' included), so that dynamo runs compiled code rather than the
    function eagerly; a backend from metered_backend brings the modes back, this thread's, around each graph."""
    modes = list(_get_current_dispatch_mode_stack())
    if not modes:
        yield
        return
    before = getattr(_SET_ASIDE, "modes", ())
    with _disable_current_modes():
        _SET_ASIDE.modes = tuple(modes)
        try:
            yield
        finally:
            _SET_ASIDE.modes = before


def _custom_solver(solver: Any) -> bool:
    """solver is a CustomKnapsackSolver (torch 2.13; the only other kind torch's partitioner takes)."""
    try:
        from torch._inductor.custom_graph_pass import CustomKnapsackSolver
    except ImportError:
        return False
    return isinstance(solver, CustomKnapsackSolver)


def recompile_limits(fn: Callable[..., Any]) -> tuple[int, int]:
    """dynamo's (recompile_limit, accumulated_recompile_limit) for a call of a Compiled of `fn`: twice the
    Compiled made of its code (a training and an evaluation graph each, at most) and of all code, plus dynamo's
    defaults (8, 256), so that hitting a limit means a real runaway (fail_on_recompile_limit_hit: an error)."""
    return 8 + 2 * _SHARING.get(_code(fn), 0), 256 + 2 * sum(_SHARING.values())


class Compiled:
    """fn compiled with torch.compile under activation_memory_budget=budget (a number from 0 to 1) and the
    knapsack solver `solver`; call it as fn. `backend`: "aot_eager_decomp_partition" (eager kernels),
    "aot_eager" (the same partitioner on the graph as traced, no decompositions: native_dropout stays one op) or
    "inductor"; Inductor's own kernels allocate where no dispatch mode sees them, so under the meter only the
    CUDA allocator's peak counts them."""

    def __init__(self, fn: Callable[..., Any], budget: float, backend: str = "aot_eager_decomp_partition",
                 solver: Any = "dp") -> None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget <= 1:
            raise ValueError(f"Compiled: budget={budget!r} must be a number from 0 to 1")
        if not (solver in ("dp", "greedy", "ilp", "dp_knapsack_sliding_hirschberg") or _custom_solver(solver)):
            raise ValueError(f"Compiled: solver={solver!r}; allowed: dp, greedy, ilp, dp_knapsack_sliding_hirschberg "
                             "or a CustomKnapsackSolver (labkit.planners.solver.planner_solver)")
        if backend not in ("aot_eager_decomp_partition", "aot_eager", "inductor"):
            raise ValueError(f"Compiled: backend={backend!r}; allowed: aot_eager_decomp_partition, aot_eager, inductor")
        # the knapsack solver below budget 1: "dp" (the default), "greedy", "ilp", or a CustomKnapsackSolver
        # (labkit.planners.solver.planner_solver)
        self.budget, self.backend, self.graphs_run, self.fn, self.solver = float(budget), backend, 0, fn, solver
        _SHARING[_code(fn)] = _SHARING.get(_code(fn), 0) + 1
        weakref.finalize(self, _release, _code(fn))  # a Compiled collected no longer raises the limits
        # fullgraph: a graph break would run the code between graphs eagerly, outside every meter (unseen)
        self._compiled = torch.compile(fn, backend=metered_backend(self._inner, self._ran), dynamic=False,
                                       fullgraph=True)

    def _inner(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx as inner
        elif self.backend == "aot_eager":
            from torch._dynamo.backends.debugging import aot_eager as inner
        else:
            from torch._dynamo.backends.debugging import aot_eager_decomp_partition as inner
        return inner(gm, example_inputs)

    def _ran(self) -> None:
        self.graphs_run += 1

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch._dynamo.config as dynamo_config
        import torch._functorch.config as functorch_config

        # one function compiled at several budgets (and for each block) takes a cache entry each: limits sized
        # from how many share it (recompile_limits), and at a limit an error rather than a silent fall back to eager
        limit, accumulated = recompile_limits(self.fn)
        with functorch_config.patch(activation_memory_budget=self.budget,
                                    activation_memory_budget_solver=self.solver), \
                dynamo_config.patch(recompile_limit=limit, accumulated_recompile_limit=accumulated,
                                    fail_on_recompile_limit_hit=True), \
                outside_meters():
            return self._compiled(*args, **kwargs)

    @contextlib.contextmanager
    def check_ran(self, what: str) -> Any:
        """Refuse (RuntimeError) a region in which this compiled function ran no compiled graph: dynamo ran it
        eagerly, and its figures would be eager ones under the compiled name."""
        before = self.graphs_run
        yield
        if self.graphs_run == before:
            raise RuntimeError(f"{what}: torch.compile ran no compiled graph (dynamo fell back to eager: a graph "
                               "break at the first op, or its recompile limit); these figures would not be "
                               "the compiled code's")


class RandomDraws(TorchDispatchMode):
    """Every random op run inside (an op tagged nondeterministic_seeded), eager or in a compiled graph (Compiled
    runs its graphs inside the modes of its caller): per phase, "forward" or "backward" (run while a backward is),
    the op and, when keep=True, its output (a tuple for native_dropout: output and mask). A random op in backward
    is a draw no forward made: under torch.compile nothing replays the RNG for an op the partitioner moved there
    (labkit.planners.solver)."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.keep = keep
        self.draws: dict[str, list[tuple[str, Any]]] = {"forward": [], "backward": []}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if torch.Tag.nondeterministic_seeded in func.tags:
            phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
            kept = None
            if self.keep:
                kept = tuple(t.detach() for t in out) if isinstance(out, (tuple, list)) else out.detach()
            self.draws[phase].append((str(func), kept))
        return out

    def count(self, phase: str) -> int:
        """How many random ops ran in `phase` ("forward" or "backward")."""
        return len(self.draws[phase])
