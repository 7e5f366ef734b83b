"""Command line: python -m labkit doctor | student [--check] | execute NB... | bench NAME [--json] | gpu-check."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _student(args: argparse.Namespace) -> int:
    from labkit import student

    try:
        if args.check:
            problems = student.check(ROOT)
            for p in problems:
                print(f"labkit student --check: {p}", file=sys.stderr)
            if problems:
                print("Regenerate with `make student` (python -m labkit student).", file=sys.stderr)
                return 1
            print("labkit student --check: notebooks/ and labkit/reference/ are current")
            return 0
        for path in student.write(ROOT):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    except student.NotebookError as e:
        print(f"labkit student: {e}; nothing was written", file=sys.stderr)
        return 2


def _execute(args: argparse.Namespace) -> int:
    from labkit.notebook import execute

    for path in args.notebooks:
        seconds = execute(Path(path))
        print(f"executed {path} in {seconds:.1f} s")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from labkit.doctor import main

    return main()


def _bench(args: argparse.Namespace) -> int:
    from labkit.bench import main

    return main(args.name, as_json=args.json)


def _gpu_check(args: argparse.Namespace) -> int:
    from labkit.gpucheck import main

    return main()


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one subcommand; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check this environment; exit 1 if something is broken").set_defaults(run=_doctor)
    p = sub.add_parser("student", help="regenerate notebooks/ and labkit/reference/ from solutions/")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything is out of date")
    p.set_defaults(run=_student)
    p = sub.add_parser("execute", help="execute notebooks in place (outputs kept)")
    p.add_argument("notebooks", nargs="+")
    p.set_defaults(run=_execute)
    p = sub.add_parser("bench", help="run one benchmark and print its figures")
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_bench)
    sub.add_parser("gpu-check", help="GPU-only tests and benchmarks, summary table last").set_defaults(run=_gpu_check)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
