"""The kit's environment variables, LABKIT_*: each named, read and set here only (tests/test_cli_light.py holds
every other module of labkit/ to that), so that one file says what a process's environment can change.

- LABKIT_PROFILE: tiny, cpu or gpu, over the profile found (labkit.env.profile)
- LABKIT_GPU_MEMORY: the GPU share the gpu profile sizes for and caps the allocator at ("12GiB")
- LABKIT_AUTOCAST: bfloat16 or none, over the profile's autocast
- LABKIT_CHECKS: raise or show, over a checker's guess of the frontend (labkit.checks.base.interactive)
- LABKIT_NOTEBOOKS: the folder a handed-out kit looks for a student's notebooks in first (labkit.labs)
- LABKIT_BOX_OF: set on a grading box's command line only, the pid namespace the box was made from
  (labkit.course.grade.worker, Reach)
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PROFILE = "LABKIT_PROFILE"
GPU_MEMORY = "LABKIT_GPU_MEMORY"
AUTOCAST = "LABKIT_AUTOCAST"
CHECKS = "LABKIT_CHECKS"
NOTEBOOKS = "LABKIT_NOTEBOOKS"
BOX_OF = "LABKIT_BOX_OF"
NAMES = (PROFILE, GPU_MEMORY, AUTOCAST, CHECKS, NOTEBOOKS, BOX_OF)


def read(name: str) -> str:
    """The variable `name` (one of NAMES) as this process has it, stripped; empty when unset."""
    if name not in NAMES:
        raise ValueError(f"{name!r} is not one of the kit's variables: {', '.join(NAMES)}")
    return os.environ.get(name, "").strip()


def checks_mode() -> str:
    """$LABKIT_CHECKS when it is raise or show, else empty (the checker guesses)."""
    mode = read(CHECKS)
    return mode if mode in ("raise", "show") else ""


def notebooks() -> Path | None:
    """The folder $LABKIT_NOTEBOOKS names, None when unset."""
    folder = read(NOTEBOOKS)
    return Path(folder) if folder else None


def box_of() -> str:
    """$LABKIT_BOX_OF: the pid namespace this process's box was made from ("pid:[...]"), empty outside a box."""
    return read(BOX_OF)


def for_child(environ: Mapping[str, str], profile: str | None = None, box_of: str | None = None) -> dict[str, str]:
    """A copy of `environ` for a process the kit starts: LABKIT_PROFILE set to `profile` (when given), and
    LABKIT_BOX_OF to `box_of` when given, else left out (a process outside a box is never said to be in one)."""
    child = {k: v for k, v in environ.items() if k != BOX_OF}
    if profile is not None:
        child[PROFILE] = profile
    if box_of is not None:
        child[BOX_OF] = box_of
    return child


def set_gpu_run(memory: str) -> None:
    """This process and what it starts run on the gpu profile sized for `memory` ("16GiB"): gpu-check's rows."""
    os.environ.update({GPU_MEMORY: memory, PROFILE: "gpu"})
