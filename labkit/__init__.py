"""labkit: the helper package behind the activation-checkpointing labs.

Notebooks use it as ``import labkit as lk``; this file is that surface. Where each part lives, and what may import
what, is docs/design.md, "The package". Importing it is light (no torch, no Jupyter), so that the command line and
the doctor start on any Python: the surface's names are imported, torch with them, the first time one is used.
"""
from __future__ import annotations

from typing import Any

from labkit import env  # noqa: F401  (light: sets the CUDA allocator's segments before torch allocates)
from labkit import stubs

# The names a notebook reaches through `lk.`: imported together, by _surface(), when the first of them is used
SURFACE = (
    "bench", "checks", "instruments", "planners", "plans", "advice", "harness", "ops", "roofline",
    "profile", "sizes", "use", "PROFILES", "Sizes", "benchmark", "compare",
    "Ledger", "MemoryMeter", "measure_peak", "saved_tensors",
    "ConvNet", "GPT", "GPTConfig", "GPTStack", "GPTBlock", "MLPChain", "MLPConfig", "gpt_input", "gpt_tokens",
    "mlp_input", "next_token_loss", "korthikanti_bytes", "korthikanti_terms", "layer_chain", "parameter_bytes",
)
# Imported each on its own: matplotlib and ipywidgets (most of a second) come only with a figure or an explorer (a
# grading box or a script that draws nothing never imports them); the doctor runs without torch, to say it is missing
ALONE = ("plots", "widgets", "doctor")


def _torch() -> None:
    """Import torch, or fail with the fix: every name of the surface needs it."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"labkit needs PyTorch, which does not import here ({e}). `python -m labkit doctor` names what is "
            "missing and the command that installs it (from the kit's folder, `make lab` makes a .venv with it)."
        ) from e


def _surface() -> dict[str, Any]:
    """The surface's names, each imported from where it lives (docs/design.md, "The package")."""
    _torch()
    import labkit.bench as bench  # noqa: F401  (not `from labkit import`: that asks this module's __getattr__ first)
    import labkit.checks as checks  # noqa: F401
    import labkit.instruments as instruments  # noqa: F401
    import labkit.planners as planners  # noqa: F401
    import labkit.plans as plans  # noqa: F401
    from labkit.env.profile import profile, sizes, use  # noqa: F401
    from labkit.env.sizes import PROFILES, Sizes  # noqa: F401
    from labkit.instruments import (  # noqa: F401
        Ledger, MemoryMeter, harness, measure_peak, ops, roofline, saved_tensors,
    )
    from labkit.instruments.timing import benchmark, compare  # noqa: F401
    from labkit.models import (  # noqa: F401
        GPT, ConvNet, GPTBlock, GPTConfig, GPTStack, MLPChain, MLPConfig, gpt_input, gpt_tokens, korthikanti_bytes,
        korthikanti_terms, layer_chain, mlp_input, next_token_loss, parameter_bytes,
    )
    from labkit.planners import advice  # noqa: F401
    names = locals()
    return {name: names[name] for name in SURFACE}


def _alone(name: str) -> Any:
    """`lk.plots`, `lk.widgets` or `lk.doctor`, imported on its own."""
    if name == "plots":
        import labkit.plots as plots
        return plots
    if name == "widgets":
        import labkit.widgets as widgets
        return widgets
    from labkit.env.doctor import doctor
    return doctor


def import_all() -> None:
    """Import the whole surface now (torch with it), as a notebook's first `lk.` name does: the grader's worker
    loads every module a checker relies on before any student's code runs."""
    globals().update(_surface(), doctor=_alone("doctor"))


def __getattr__(name: str) -> Any:
    """A surface name, imported the first time it is asked for (PEP 562)."""
    if name in ALONE:
        globals()[name] = _alone(name)
        return globals()[name]
    if name not in SURFACE:
        raise AttributeError(f"module 'labkit' has no attribute {name!r}")
    import_all()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *SURFACE, *ALONE})


stubs.install()  # in a notebook, a stub's NotImplementedError shows as one line naming its exercise

__all__ = [*SURFACE, *ALONE]
