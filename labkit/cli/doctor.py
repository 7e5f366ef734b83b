"""`doctor` and `sizes`: the machine the labs run on, and the sizes each profile gives them."""
from __future__ import annotations

import argparse
import sys


def add(commands: argparse._SubParsersAction) -> None:
    """The group's commands."""
    commands.add_parser("doctor", help="check this environment; exit 1 if something is broken").set_defaults(
        run=doctor)
    p = commands.add_parser("sizes", help="the sizes a profile uses and each lab's predicted peak memory")
    p.add_argument("--profile", choices=("tiny", "cpu", "gpu"), help="default: the active profile")
    p.add_argument("--memory", help="gpu: size for this much free memory (16GiB, 24GB, ...) instead of this GPU's")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=sizes)


def doctor(args: argparse.Namespace) -> int:
    """Print the doctor's report: 0 when nothing is broken, else 1 (it runs without torch, to say so)."""
    from labkit.env.doctor import main

    return main()


def sizes(args: argparse.Namespace) -> int:
    """Print the sizes of a profile (the gpu one fitted to --memory or to this GPU) and each lab's peak."""
    import json

    try:
        figures = _figures(args.profile, args.memory)
    except ValueError as e:
        print(f"labkit sizes: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"profile {figures['profile']}: {figures['note']}")
    print("  " + ", ".join(f"{k}={v}" for k, v in figures["sizes"].items()))
    for lab, peak in figures["labs"].items():
        print(f"  lab {lab}: predicted peak {peak / 2**30:7.2f} GiB")
    return 0


def _figures(name: str | None, memory: str | None) -> dict:
    """The sizes `sizes` prints, as JSON; a ValueError names a profile or memory it cannot size."""
    from dataclasses import asdict

    from labkit.env import sizing
    from labkit.env.profile import gpu_choice, profile, sizes as sizes_of

    name = name or profile()
    if memory is not None and name != "gpu":
        raise ValueError(f"--memory sizes the gpu profile; profile {name!r} has fixed sizes")
    if name == "gpu":
        return (sizing.choose(memory) if memory is not None else gpu_choice()).as_json()
    size = sizes_of(name)
    return {"memory_bytes": None, "profile": name, "scale": 0, "sizes": asdict(size), "labs": sizing.lab_peaks(size),
            "fraction": None, "note": f"the {name} profile's fixed sizes"}
