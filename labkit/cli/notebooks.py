"""`student`, `execute` and `site`: the notebooks a lab is written as, and what is generated from them."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def add(commands: argparse._SubParsersAction) -> None:
    """The group's commands."""
    p = commands.add_parser("student", help="regenerate notebooks/, labkit/reference/ and labkit/labs/ from "
                                            "solutions/")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything is out of date")
    p.set_defaults(run=student)
    p = commands.add_parser("execute", help="execute notebooks in place (outputs kept)")
    p.add_argument("notebooks", nargs="+")
    p.set_defaults(run=execute)
    p = commands.add_parser("site", help="the executed solutions as a static reading site (index.html first)")
    p.add_argument("out", nargs="?", default="site", help="folder to write (default site/)")
    p.set_defaults(run=site)


def student(args: argparse.Namespace) -> int:
    """Write the generated views (docs/design.md, "One truth"), or, with --check, say which are out of date."""
    from labkit.course import student as contract, views

    try:
        if args.check:
            return _check(views.check(ROOT))
        for path in views.write(ROOT):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    except contract.NotebookError as e:
        print(f"labkit student: {e}; nothing was written", file=sys.stderr)
        return 2


def _check(problems: list[str]) -> int:
    """Report `student --check`'s problems: 1 when there are any."""
    for p in problems:
        print(f"labkit student --check: {p}", file=sys.stderr)
    if problems:
        if any("out of date" in p or "missing" in p for p in problems):
            print("Regenerate with `make student` (python -m labkit student): it never overwrites a "
                  "notebook that holds answers.", file=sys.stderr)
        return 1
    print("labkit student --check: notebooks/, labkit/reference/ and labkit/labs/ are current")
    return 0


def execute(args: argparse.Namespace) -> int:
    """Execute each notebook in place, saying how long it took."""
    from labkit.course.notebook import execute as run

    for path in args.notebooks:
        print(f"executed {path} in {run(Path(path)):.1f} s")
    return 0


def site(args: argparse.Namespace) -> int:
    """Write the reading site."""
    from labkit.course import site as reading

    pages = reading.build(ROOT / "solutions", Path(args.out))
    print(f"wrote {len(pages)} pages to {args.out}: open {Path(args.out) / 'index.html'}")
    return 0
