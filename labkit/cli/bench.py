"""`bench` and `gpu-check`: the benchmarks' figures, and the maintainers' run of everything on a GPU."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_CHECK = ROOT / "tools" / "gpucheck.py"  # a maintainers' tool: in the kit's checkout, not in what students get


def add(commands: argparse._SubParsersAction) -> None:
    """The group's commands."""
    p = commands.add_parser("bench", help="run one benchmark and print its figures")
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=bench)
    p = commands.add_parser("gpu-check", add_help=False,
                            help="maintainers, on a GPU: GPU-only tests, benchmarks and every lab, each row in its "
                                 "own process; a JSON line per row under docs/gpu/ (tools/gpucheck.py; its --help)")
    p.set_defaults(run=gpu_check, passes_on=True)  # every word after it is tools/gpucheck.py's


def bench(args: argparse.Namespace) -> int:
    """Run benchmark NAME (`grade`: the grader's own, which lives with the grader, above bench)."""
    if args.name != "grade":
        from labkit.bench import main

        return main(args.name, as_json=args.json)
    import json

    from labkit.course.grade.bench import grade_bench

    figures = grade_bench()
    print(json.dumps(figures) if args.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))
    return 0


def gpu_check(args: argparse.Namespace) -> int:
    """Become tools/gpucheck.py with the words given (the same process: its signals are the run's)."""
    if not GPU_CHECK.is_file():
        print(f"labkit gpu-check: a maintainers' tool of the kit's checkout ({GPU_CHECK.relative_to(ROOT)}), "
              "not in this copy of the kit", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, str(GPU_CHECK), *args.rest])
    return 2  # not reached
