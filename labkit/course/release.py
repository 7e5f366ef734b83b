"""`python -m labkit release OUT [--labs 01,02]`: the kit an instructor hands out, without the answers still due.

The bundle holds the student notebooks of the released labs, the `labkit` package, the install rules
(tools/kit.mk as its Makefile), pyproject.toml, environment.yml, constraints.txt (the tested versions) and a
short README. The package keeps the
reference answers of the labs before the first released one (their answers are due) and leaves out those of
the released labs and every later lab. A later lab that builds on an earlier released one imports it through
`labkit.labs`, which then runs the student's own notebook (labkit/labs/__init__.py).

Labs are released in order with none skipped, so each released lab finds every earlier lab's code: due labs
as reference answers, released ones as the student's. Every bundle carries lab 00 (START) as well: its doctor
cell, its profiles and the way exercises work are what every later lab assumes a student has seen; its one
exercise's answer is withheld with the released labs' (no later lab imports it).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat

from labkit.course import student
from labkit.course.catalog import LABS

STUDENT_README = """# Activation checkpointing, hands on: {labs}

On a JupyterHub whose image has torch and Jupyter, in a terminal in this folder:

```sh
make hub     # the kit into this server's Python (never its torch); then open the notebooks in this JupyterLab
```

(Where the hub's image was built from this folder, the kit is there already: skip it.) On a laptop:

```sh
make lab     # creates .venv, installs torch and the kit, serves JupyterLab on http://127.0.0.1:8888
```

Start with `notebooks/00_start_here.ipynb` (a few seconds): it checks your environment and shows how the
exercises and their checkers work. To choose a profile or a GPU share on a hub, call
`lk.use(profile="cpu")` or `lk.use(gpu_memory="12GiB")` right after `import labkit as lk`, before anything else.

Open `notebooks/` and work through the labs in order. Each exercise has a
`## Exercise N.M` heading, a function to write in place of its
`raise NotImplementedError(...)` stub, and a checker cell after it,
`lk.checks.ex_N_M(...)`, that prints one line when your answer is right, or
what it checked, expected against got, and a hint.

Write your answers in the exercise cells themselves: grading takes those cells
from your notebook and everything else from the original, so code you add in
new cells, or changes to other cells, are not graded.

What to hand in: each lab's notebook, saved, under its own file name
({names}), in a folder named after you (`yourname/{first}`): the
grader takes your name from that folder and the lab from the notebook.
Keep the cells' ids (copy the file; do not paste its cells into a new one).

A lab that builds on an earlier one of this kit (Lab 03 on Lab 02's
`checkpoint`) imports the earlier lab's code from your own notebook, in the
same folder: finish the earlier lab first, and restart the kernel after you
change it.

`make doctor` checks the environment (torch, widgets, plotting) and says how to
fix what it finds.
"""


START = "00"  # the lab every bundle carries
CARRIED = (f"lab {START} (00_start_here: the environment check, the profiles, how an exercise is checked) is carried "
           "in every bundle, its answer withheld: every later lab assumes a student has run it")


class ReleaseError(ValueError):
    """A release that cannot be made: the message names the value and what is allowed."""


def labs(root: Path) -> dict[str, Path]:
    """The kit's labs by number ("02"), each its solution notebook (the catalog's labs)."""
    return {lab.number: lab.solution(root) for lab in LABS}


def parse_labs(text: str | None, available: dict[str, Path], in_order: bool = True) -> list[str]:
    """The labs `--labs 01,02` names (all when None): known, and (`in_order`, for a release) with none skipped."""
    if text is None:
        return list(available)
    chosen = sorted({f"{int(t):02d}" if t.strip().isdigit() else t.strip() for t in text.split(",") if t.strip()})
    unknown = [c for c in chosen if c not in available]
    if not chosen or unknown:
        raise ReleaseError(f"--labs {text!r}: {'no lab named' if not chosen else 'unknown lab ' + ', '.join(unknown)}; "
                           f"the kit has labs {', '.join(available)}")
    if not in_order:
        return chosen
    order = list(available)
    expected = order[order.index(chosen[0]): order.index(chosen[0]) + len(chosen)]
    if chosen != expected:
        missing = sorted(set(expected) - set(chosen))
        raise ReleaseError(f"--labs {text!r} skips lab {', '.join(missing)}: labs are released in order, none skipped, "
                           "so each later lab finds the earlier ones' code")
    return chosen


def carried(chosen: list[str]) -> list[str]:
    """The labs a bundle of `chosen` holds: lab START first, then `chosen`."""
    return chosen if START in chosen else [START, *chosen]


def withheld(root: Path, chosen: list[str], bundle: bool = False) -> list[str]:
    """labkit/reference modules left out for `chosen`: those of the released labs and every later one (the grader
    hides these); `bundle`: also those of the labs a bundle carries besides (lab START's)."""
    extra = set(carried(chosen)) - set(chosen) if bundle else set()
    return [f"{lab.module}.py" for lab in LABS if lab.number >= chosen[0] or lab.number in extra]


def package(root: Path, dest: Path, chosen: list[str]) -> Path:
    """Copy the labkit package to `dest/labkit` without the withheld reference answers; returns the copy."""
    copy = dest / "labkit"
    shutil.copytree(root / "labkit", copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in withheld(root, chosen, bundle=True):
        (copy / "reference" / name).unlink(missing_ok=True)
    return copy


def write(root: Path, out: Path, chosen: list[str]) -> list[Path]:
    """Write the bundle for labs `chosen` into `out` (new or empty); returns the notebooks written."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out}: exists and is not an empty folder; give a new one")
    available = labs(root)
    out.mkdir(parents=True, exist_ok=True)
    package(root, out, chosen)
    notebooks = []
    for number in carried(chosen):
        path = available[number]
        nb = student.student_view(student.read(path), f"solutions/{path.name}")
        target = out / "notebooks" / path.name
        target.parent.mkdir(exist_ok=True)
        nbformat.write(nb, target)
        notebooks.append(target)
    for name in ("pyproject.toml", "environment.yml", "constraints.txt"):
        shutil.copy(root / name, out / name)
    shutil.copy(root / "tools" / "kit.mk", out / "Makefile")
    titles = ", ".join(f"{n} {re.sub(r'^[0-9]+_', '', available[n].stem).replace('_', ' ')}" for n in chosen)
    names = [available[n].name for n in chosen]
    (out / "README.md").write_text(STUDENT_README.format(labs=titles, names=", ".join(f"`{n}`" for n in names),
                                                         first=names[0]))
    return notebooks
