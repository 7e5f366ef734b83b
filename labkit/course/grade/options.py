"""What a grading run is given and what it gives back: ``grader.run(Options) -> Gradebook``.

The command line (labkit/cli/grade.py) parses into these, the grader runs on them, and the gradebook it returns is
all that comes back (no argument is filled in place). ``Limits`` is also what every gradebook and part records
(``as_json``) and what the judge is sent for each submission.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from labkit.course.grade.report import Row

KIT = Path(__file__).resolve().parents[3]  # the kit whose labs and checkers grade (labkit/course/grade/ -> root)
PROFILES = ("tiny", "cpu")  # what a box may run: the sandbox has no GPU
OPTION = {"cell_timeout": "--timeout", "notebook_timeout": "--notebook-timeout", "memory_gib": "--memory",
          "processes": "processes"}  # how the command line names a limit, for its refusals


@dataclass(frozen=True)
class Limits:
    """What one box may take, and the seed its hidden cases are drawn from."""

    cell_timeout: float = 60.0  # seconds per exercise (sized for the tiny profile)
    notebook_timeout: float = 300.0  # seconds per notebook, its exercises one after another
    memory_gib: float = 4.0  # a box's memory, all its processes together
    profile: str = "tiny"  # the profile the boxes run (LABKIT_PROFILE there)
    processes: int = 64  # processes a box may hold at once
    seed: int = 0  # the hidden cases' (labkit.checks.base.hidden); the same for every part of a class

    def __post_init__(self) -> None:
        for name, option in OPTION.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"{option} {value!r}: must be a positive number")
        if self.profile not in PROFILES:
            raise ValueError(f"profile {self.profile!r}: a box runs one of {', '.join(PROFILES)} (it has no GPU)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed {self.seed!r}: must be an int")

    def as_json(self) -> dict[str, Any]:
        """The limits as a gradebook, a part and the judge's request carry them."""
        return asdict(self)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Limits:
        """Limits from their JSON, every field named and checked (a ValueError names what is wrong)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, Mapping) or set(data) != names:
            raise ValueError(f"limits {data!r:.200}: not the fields {', '.join(sorted(names))}")
        return cls(**data)


@dataclass(frozen=True)
class Options:
    """One grading run: the class, the labs graded, the limits, and how it runs."""

    paths: tuple[Path, ...]  # the class: notebooks, or folders searched for them (collect's --out)
    labs: tuple[str, ...]  # the labs graded, each a catalog number
    limits: Limits
    jobs: int = 1  # submissions graded at a time, each in a box of its own
    hidden: tuple[Path, ...] = ()  # what every box covers with an empty folder (the kit, the gradebook's, the home)
    sandbox: bool = True  # False: no bubblewrap (--no-sandbox), only for notebooks one trusts
    executed: Path | None = None  # a folder to keep what was run for each submission in (JSON)
    shard: tuple[int, int] | None = None  # (K, N): only part K of N of the class (shards.part_of)
    race: dict | None = None  # the leaderboard's race (leaderboard.prepare), run in each lab 07 box
    progress: bool = True  # a progress bar on the terminal
    root: Path = KIT  # the kit graded with: its pristine notebooks, checkers and the kit each box imports

    def __post_init__(self) -> None:
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs <= 0:
            raise ValueError(f"--jobs {self.jobs!r}: must be a positive int")
        if not self.labs:
            raise ValueError("no lab to grade")


@dataclass(frozen=True)
class Gradebook:
    """What a run graded: every row (report.ordered), the whole class's names as this machine found them (before a
    shard's split: a part's facts carry them), and, with a race, what came of each student's planner."""

    rows: list[Row]
    roster: list[str]
    raced: dict[str, dict] | None = None  # student -> the judge's race answer; None without a race
