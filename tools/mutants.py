"""Mutation testing, small: plant one plausible bug at a time in a module and run that module's tests.

    .venv/bin/python tools/mutants.py labkit/instruments/ledger.py tests/test_memory.py [--sample 40] [--seed 0]

A mutant flips one comparison (== !=, < <=, > >=, is/is not, in/not in), one
arithmetic operator (+ -, * //, / *), one `and`/`or`, drops one `not`, shifts
one integer constant by one, flips one boolean constant, or deletes one call
statement, in the module's own text: every other character stays, comments
included, so a test that reads the module's source still finds it. Each runs
in a copy of the kit (the tree is never touched), against
the tests given, stopping at the first failure. A mutant the tests do not
kill "survives": either a bug they would let through, or a change that is no
bug at all (an equivalent mutant) — read each one. Prints the survivors, then
one JSON line: {"module", "mutants", "killed", "survived", "timeouts", "errors"}. The tests first run on the
module as it is, and must pass there (else every mutant would count as killed).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWAPS: dict[type, type] = {
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
    ast.And: ast.Or, ast.Or: ast.And,
}


@dataclass(frozen=True)
class Mutant:
    """The index-th mutable site of the module (in ast.walk order) and what is done there."""

    index: int
    line: int
    change: str


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, description) of every place a mutant can be planted."""
    sites: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sites += [(node, f"{type(op).__name__} -> {SWAPS[type(op)].__name__}") for op in node.ops[:1]
                      if type(op) in SWAPS]
        elif isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAPS:
            sites.append((node, f"{type(node.op).__name__} -> {SWAPS[type(node.op)].__name__}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            sites.append((node, "drop `not`"))
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            sites.append((node, f"{node.value} -> {not node.value}"))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append((node, f"{node.value} -> {node.value + 1}"))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            sites.append((node, "delete the call statement"))
    return sites


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of docstring constants (never mutated: they are text)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            out.add(id(body[0]))
    return out


def mutants(source: str) -> list[Mutant]:
    """Every mutant of a module's source."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [Mutant(i, getattr(node, "lineno", 0), change) for i, (node, change) in enumerate(_sites(tree))
            if id(node) not in skip]


OPERATORS: dict[type, str] = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Is: "is",
    ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
    ast.FloorDiv: "//", ast.Div: "/", ast.And: "and", ast.Or: "or",
}


class Text:
    """A module's source, addressed as ast addresses it (line from 1, column in UTF-8 bytes)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col: int) -> int:
        """The character offset of (line, byte column)."""
        return self.starts[line - 1] + len(self.lines[line - 1].encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)


def _operator(text: Text, before: ast.AST, after: ast.AST, op: ast.AST) -> tuple[int, int]:
    """Where op's word or sign is between two operands: what is left once parentheses, spaces, line
    continuations and comments are passed over, which must read as the operator."""
    lo, hi = text.span(before)[1], text.span(after)[0]
    gap = re.sub(r"#[^\n]*", lambda c: " " * len(c.group()), text.source[lo:hi])
    found = list(re.finditer(r"[^\s()\\]+", gap))
    words = " ".join(m.group() for m in found)
    if words != OPERATORS[type(op)]:
        raise ValueError(f"line {before.lineno}: expected {OPERATORS[type(op)]!r} between the operands, "
                         f"found {words!r}")
    return lo + found[0].start(), lo + found[-1].end()


def _edits(text: Text, node: ast.AST) -> list[tuple[int, int, str]]:
    """(start, stop, new text) that plant the mutant at node, applied from the last."""
    if isinstance(node, ast.Compare):
        return [(*_operator(text, node.left, node.comparators[0], node.ops[0]), OPERATORS[SWAPS[type(node.ops[0])]])]
    if isinstance(node, ast.BinOp):
        return [(*_operator(text, node.left, node.right, node.op), OPERATORS[SWAPS[type(node.op)]])]
    if isinstance(node, ast.BoolOp):  # one op for the whole chain: a and b and c
        return [(*_operator(text, a, b, node.op), OPERATORS[SWAPS[type(node.op)]])
                for a, b in zip(node.values, node.values[1:])]
    if isinstance(node, ast.UnaryOp):  # not x -> (x): the parentheses keep `not (a or b)` whole
        start, stop = text.span(node.operand)
        return [(*text.span(node), f"({text.source[start:stop]})")]
    if isinstance(node, ast.Constant):
        return [(*text.span(node), repr((not node.value) if type(node.value) is bool else node.value + 1))]
    return [(*text.span(node), "None")]  # a call statement


def _mutate(node: ast.AST) -> None:
    """Plant the mutant in the tree itself: what the edited text must parse to."""
    if isinstance(node, ast.Compare):
        node.ops[0] = SWAPS[type(node.ops[0])]()
    elif isinstance(node, (ast.BinOp, ast.BoolOp)):
        node.op = SWAPS[type(node.op)]()
    elif isinstance(node, ast.UnaryOp):
        replacement = copy.deepcopy(node.operand)
        node.__class__, node.__dict__ = replacement.__class__, replacement.__dict__
    elif isinstance(node, ast.Constant):
        node.value = (not node.value) if type(node.value) is bool else node.value + 1
    elif isinstance(node, ast.Expr):
        node.value = ast.Constant(value=None)


def apply(source: str, mutant: Mutant) -> str:
    """The module's source with one mutant planted, every other character as it was: comments and layout
    stay, so a test that reads the module's source (inspect.getsource, then a text edit) still finds it.
    ValueError if the edited text does not parse to the mutated tree."""
    tree = ast.parse(source)
    node, change = _sites(tree)[mutant.index]
    text = Text(source)
    out = source
    for start, stop, new in sorted(_edits(text, node), reverse=True):
        out = out[:start] + new + out[stop:]
    _mutate(node)
    if ast.dump(ast.parse(out)) != ast.dump(tree):
        raise ValueError(f"line {mutant.line}: {change}: the edited text is not the mutated module")
    return out


def run(module: Path, tests: list[str], mutant: Mutant | None, source: str, timeout: int) -> str:
    """'killed', 'survived' or 'timeout' for one mutant (None: the module as it is), in a fresh copy of the kit;
    'error' when pytest ended otherwise than pass or fail (interrupted, bad usage, nothing collected)."""
    with tempfile.TemporaryDirectory(prefix="labkit-mutant-") as tmp:
        copy_root = Path(tmp) / "kit"
        shutil.copytree(ROOT, copy_root, ignore=shutil.ignore_patterns(".venv", ".git", "*.pyc", "__pycache__"))
        (copy_root / module).write_text(source if mutant is None else apply(source, mutant))
        env = dict(os.environ, PYTHONPATH=str(copy_root), LABKIT_PROFILE="tiny", PYTHONDONTWRITEBYTECODE="1")
        # its own process group: on a timeout the group is interrupted (pytest's teardown stops the servers its
        # fixtures started), then killed with what is left in it, so a mutant that loops forever in a subprocess
        # does not outlive the run and take a core. A process a test starts in a session of its own (a Jupyter
        # kernel, a browser) is out of reach: it is its fixture's to stop
        run = subprocess.Popen([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                               cwd=copy_root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        try:
            code = run.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.wait(timeout=15)
            return "timeout"
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, signal.SIGKILL)  # anything the tests left running
            run.wait()
    return {0: "survived", 1: "killed"}.get(code, "error")


def main(argv: list[str] | None = None) -> int:
    """Run a sample of one module's mutants against its tests; print survivors and a JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", type=Path, help="a file under labkit/, relative to the kit's root")
    parser.add_argument("tests", nargs="+", help="test files that should catch bugs in it")
    parser.add_argument("--sample", type=int, default=0, help="run this many mutants, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per mutant; longer counts as a timeout")
    parser.add_argument("--lines", type=int, nargs="*", default=[], help="only the mutants on these lines")
    args = parser.parse_args(argv)
    source = (ROOT / args.module).read_text()
    chosen = [m for m in mutants(source) if not args.lines or m.line in args.lines]
    if args.sample and args.sample < len(chosen):
        chosen = sorted(random.Random(args.seed).sample(chosen, args.sample), key=lambda m: m.index)
    baseline = run(args.module, args.tests, None, source, args.timeout)
    if baseline != "survived":  # tests that fail (or do not run) on the module as it is would "kill" every mutant
        print(f"the tests do not pass on {args.module} as it is ({baseline}): fix them or the paths first",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still kills its mutant's group
    results = {"killed": 0, "survived": 0, "timeout": 0, "error": 0}
    for m in chosen:
        verdict = run(args.module, args.tests, m, source, args.timeout)
        results[verdict] += 1
        if verdict != "killed":
            print(f"{verdict}: {args.module}:{m.line}: {m.change}", flush=True)
    print(json.dumps({"module": str(args.module), "mutants": len(chosen), "killed": results["killed"],
                      "survived": results["survived"], "timeouts": results["timeout"], "errors": results["error"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
