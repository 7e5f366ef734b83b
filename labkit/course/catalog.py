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
    """One lab: its number ("02") and name ("recompute")."""

    number: str  # two digits, "00".."99": the order the labs are taken in
    name: str  # the notebook's name after its number, and the module of its exported code

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
    Lab("00", "start_here"),
    Lab("01", "activation_memory"),
    Lab("02", "recompute"),
    Lab("03", "sqrt_n"),
    Lab("04", "selective"),
    Lab("05", "roofline"),
    Lab("06", "pitfalls"),
    Lab("07", "capstone"),
)



def lab(number: str) -> Lab:
    """The lab numbered `number` ("02")."""
    for entry in LABS:
        if entry.number == number:
            return entry
    raise KeyError(f"no lab {number!r}; the labs are {', '.join(e.number for e in LABS)}")
