"""`release` and `collect`: the bundle handed out, and the students' notebooks collected back from their homes."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def add(commands: argparse._SubParsersAction) -> None:
    """The group's commands."""
    p = commands.add_parser("release", help="write the student bundle of some labs, without their reference answers")
    p.add_argument("out", help="a new (or empty) folder")
    p.add_argument("--labs", help="comma-separated lab numbers, in order, none skipped (default: all)")
    p.set_defaults(run=release)
    p = commands.add_parser("collect", help="copy the students' lab notebooks from their homes into OUT/<name>/, "
                                            "never following a link out of a home; the class is kept for grade")
    p.add_argument("homes", nargs="+", help="the students' home folders: /home/* as the shell expands it, or a "
                                            "quoted pattern '/home/*' (each folder's name is the student's; your "
                                            "own home, $HOME, is left out)")
    p.add_argument("--out", default="returned", help="a new folder to fill (default returned/), as grade reads it: "
                                                     "outside every student's home (your own home will do)")
    p.add_argument("--labs", help="comma-separated lab numbers to collect (default: all)")
    p.add_argument("--strip", default="", help="a prefix of the home folders' names to drop (jupyter- on The "
                                               "Littlest JupyterHub)")
    p.add_argument("--exclude", action="extend", type=lambda names: names.split(","), default=[], metavar="NAME",
                   help="a home that is no student's (a teaching assistant), by folder or student name; again, or "
                        "comma-separated, for more (one value each, so that the homes after it stay homes)")
    p.add_argument("--roster", metavar="FILE", help="the class, one student's name a line: a name without a home "
                                                    "is a missing row of the gradebook, a home not on it left out")
    p.set_defaults(run=collect)


def release(args: argparse.Namespace) -> int:
    """Write the bundle of the labs asked for, saying which answers it leaves out."""
    from labkit.course import release as bundle

    try:
        chosen = bundle.parse_labs(args.labs, bundle.labs(ROOT))
        notebooks = bundle.write(ROOT, Path(args.out), chosen)
    except bundle.ReleaseError as e:
        print(f"labkit release: {e}", file=sys.stderr)
        return 2
    print(f"wrote the student bundle of lab {', '.join(chosen)} to {args.out}: "
          f"{', '.join(p.name for p in notebooks)}; left out the reference answers "
          f"{', '.join(bundle.withheld(ROOT, chosen, bundle=True))}")
    if bundle.START not in chosen:
        print(f"labkit release: {bundle.CARRIED}")
    return 0


def collect(args: argparse.Namespace) -> int:
    """Copy the class's notebooks into --out, a line per home; 1 when not one notebook was found."""
    from labkit.course import collect as homes, release as bundle

    try:
        labs = bundle.parse_labs(args.labs, bundle.labs(ROOT), in_order=False) if args.labs else None
        roster = homes.read_roster(Path(args.roster)) if args.roster else None
        found = homes.collect(args.homes, Path(args.out), labs, args.strip, args.exclude or [], roster)
    except (homes.CollectError, bundle.ReleaseError) as e:
        print(f"labkit collect: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the roster, or --out, cannot be read or written
        print(f"labkit collect: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    for line in found.left_out:
        print(f"labkit collect: left out {line}")
    for home in found.homes:
        print(f"labkit collect: {home.line()}")
    print(f"labkit collect: {_collected(found, args.out, homes.CLASS_FILE)}")
    return 0 if any(h.written for h in found.homes) else 1


def _collected(found: Any, out: str, class_file: str) -> str:
    """collect's last line: how many students and notebooks, and the command that grades them."""
    written = sum(len(h.written) for h in found.homes)
    empty = sum(not h.written for h in found.homes)
    return (f"{len(found.homes)} students in the class, {written} notebooks of {len(found.homes) - empty} of them "
            f"into {out}" + (f"; {empty} with nothing collected, each a `missing` row of the gradebook, with why "
                             f"(above, and in {Path(out) / class_file})" if empty else "")
            + f": grade with `python -m labkit grade {out}`")
