"""The catalog of the labs: one table of numbers and names that everything listing labs asks.

A lab is `NN_name`: its solution `solutions/NN_name.ipynb`, its student notebook `notebooks/NN_name.ipynb`, its
exported code `labkit/reference/name.py` (imported as `labkit.labs.name`), its checkers `labkit.checks.labNN`.
Adding a lab adds one row here (CONTRIBUTING.md); `python -m labkit student --check` fails on a solution that
is not in the table, and on a row without its solution.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = ["Lab", "LABS"]


@dataclass(frozen=True)
class Lab:
    """One lab: its number ("02"), name ("recompute") and what it builds, in a line."""

    number: str  # two digits, "00".."99": the order the labs are taken in
    name: str  # the notebook's name after its number, and the module of its exported code
    builds: str = ""  # what this lab builds, one sentence of its own (not a recap of the lab before): the site's index

    @property
    def notebook(self) -> str:
        """The notebook's file name, in solutions/ and notebooks/ alike: "02_recompute.ipynb"."""
        return f"{self.number}_{self.name}.ipynb"

    @property
    def module(self) -> str:
        """The module of its exported code: labkit.reference.<module> and labkit.labs.<module>."""
        return self.name

    @property
    def checks(self) -> str:
        """The package (or module) of its checkers, by name."""
        return f"labkit.checks.lab{self.number}"

    @property
    def checkers(self) -> ModuleType:
        """That package (or module) itself, imported: its raw checks, without the notebook's display wrapper."""
        from labkit import checks

        return getattr(checks, f"lab{self.number}")

    def solution(self, root: Path) -> Path:
        """Its solution notebook in the kit at `root`."""
        return root / "solutions" / self.notebook

    def student(self, root: Path) -> Path:
        """Its student notebook in the kit (or a bundle) at `root`."""
        return root / "notebooks" / self.notebook


LABS: tuple[Lab, ...] = (
    Lab("00", "start_here", "The frame every lab uses: the environment check, the profiles that size each experiment, "
        "and one checked exercise."),
    Lab("01", "activation_memory", "What autograd saves, measured op by op and module by module against Korthikanti's "
        "formula, where one step's peak falls, and a leak-free saved-tensor hook of your own."),
    Lab("02", "recompute", "A recomputing checkpoint written twice, as an autograd.Function and with saved-tensor "
        "hooks, replaying RNG and autocast, held against torch.utils.checkpoint."),
    Lab("03", "sqrt_n", "Chen's √n segments and their recursion on your own checkpoint, the measured U-curve, and an "
        "optimal schedule for layers that differ, held to Revolve."),
    Lab("04", "selective", "Selective checkpointing op by op: a policy from two dispatch modes, greedy and knapsack "
        "planners under a budget, and your knapsack as torch.compile's solver."),
    Lab("05", "roofline", "The bandwidth roofline that prices a recompute: this machine's ceilings, every op of a "
        "block placed under them, and lab 04's planners priced by it."),
    Lab("06", "pitfalls", "A harness that compares a plain and a checkpointed step bit for bit, what checkpointing can "
        "silently change (summation order, dropout, BatchNorm), and when not to checkpoint."),
    Lab("07", "capstone", "A planner for a whole language model under a memory budget, run for real against PyTorch's "
        "own answers, and composed with FSDP2 and tensor parallelism."),
)



def lab(number: str) -> Lab:
    """The lab numbered `number` ("02")."""
    for entry in LABS:
        if entry.number == number:
            return entry
    raise KeyError(f"no lab {number!r}; the labs are {', '.join(e.number for e in LABS)}")
