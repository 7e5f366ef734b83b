"""The command line, `python -m labkit COMMAND`: one small module per group of commands, each adding its parsers and
the functions they call (nbgrader's apps/ are the model). A command parses its arguments and calls the kit; what it
runs lives elsewhere. Nothing here imports torch or Jupyter before a command needs them, so that `--help` and
`doctor` start on any Python (docs/design.md, "The package")."""
from __future__ import annotations

import argparse
import sys

from labkit.cli import bench, doctor, grade, notebooks, release

GROUPS = (doctor, notebooks, bench, release, grade)  # the order `--help` lists their commands in
USAGE = """python -m labkit doctor | sizes [--profile P] [--memory M] [--json] | student [--check] | execute NB... |
site [OUT] | bench NAME [--json] | gpu-check [...] | release OUT [--labs 01,02] | collect HOME... [--out returned] |
grade SUBMISSIONS... [--labs ...] [--shard K/N] | grade merge PART... [--out grades.csv]; COMMAND --help for each"""


def parser() -> argparse.ArgumentParser:
    """`python -m labkit`'s parser: every group's commands."""
    top = argparse.ArgumentParser(prog="python -m labkit", description=USAGE)
    commands = top.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add(commands)
    return top


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; its exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:2] == ["grade", "merge"]:  # a command of its own, with its own options (a folder so named is ./merge)
        return grade.merge_main(words[2:])
    top = parser()
    args, rest = top.parse_known_args(words)
    if rest and not getattr(args, "passes_on", False):  # only gpu-check hands its words on (to tools/gpucheck.py)
        top.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    try:
        return args.run(args)
    except ModuleNotFoundError as e:  # a package of the labs' this Python lacks: the doctor says which, and how
        if (e.name or "labkit").split(".")[0] == "labkit":
            raise
        print(f"labkit {args.command}: needs {e.name}, which this Python does not have: `python -m labkit doctor` "
              "names what is missing and the one command that installs it", file=sys.stderr)
        return 2
