"""A returned notebook, rebuilt from the pristine one: only its answer cells are the student's.

The pristine student notebook of a lab is the grading copy. Its answer cells (those holding an exercise stub)
are matched by cell id in the returned file and take that cell's source; every other cell, checker cells
included, with all metadata and tags, comes from the pristine copy, and no output or execution count of the
returned file is kept. Answer cells are read for what an answer has no business doing (`scan`), and cut to
their definitions for the program a box runs (`program`): grading runs no statement of the student's but the
functions and classes a checker calls.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labkit.stubs import EXPORT, IN_SOURCE

CHECKER = re.compile(r"\blk\.checks\.ex_(\d+)_(\d+)\(")
CALL = re.compile(r"\blk\.checks\.(ex_\d+_\d+)\(([\w\s,]*)\)")  # a checker cell's call: the names it passes
SHADOWED = {"lk", "labkit", "_labkit_guard"}  # names the checker cells rely on
# What an answer never needs: the grader's and checkers' insides, IPython's error machinery, tracing, reloading.
FORBIDDEN_NAMES = {"get_ipython", "settrace", "setprofile", "set_custom_exc", "input_transformers_cleanup",
                   "input_transformers_post", "ast_transformers", "_labkit_guard", "__code__", "__defaults__",
                   "__kwdefaults__", "__globals__", "__closure__", "cell_contents", "__builtins__", "__import__",
                   "reload", "ctypes", "_state"}
WATCHED_ROOTS = {"lk", "labkit", "builtins", "sys"}  # no attribute of these is an answer's to set
WATCHED_OWNERS = {"torch", "torch.Tensor", "torch.nn.Module", "torch.nn.functional", "torch.autograd",
                  "torch.autograd.Function", "torch.testing", "torch.utils.checkpoint", "np", "numpy", "math", "os"}


def _watched(dotted: str) -> bool:
    """Is `dotted` (a.b.c) an attribute of something the checkers rely on?"""
    return dotted.split(".")[0] in WATCHED_ROOTS or dotted.rpartition(".")[0] in WATCHED_OWNERS


@dataclass
class Pristine:
    """A lab's grading copy: its notebook, its exercises in order, and which cells answer or check which."""

    lab: str
    nb: nbformat.NotebookNode
    exercises: list[str] = field(default_factory=list)
    answers: dict[str, list[str]] = field(default_factory=dict)  # cell id -> exercises it answers
    checkers: dict[str, list[str]] = field(default_factory=dict)  # cell id -> exercises it checks
    calls: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # exercise -> (checker, names passed)

    @classmethod
    def read(cls, lab: str, path: Path) -> "Pristine":
        nb = nbformat.read(path, as_version=4)
        self = cls(lab, nb)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            stubs = IN_SOURCE.findall(cell.source)
            checks = [f"{a}.{b}" for a, b in CHECKER.findall(cell.source)]
            if stubs:
                self.answers[cell.id] = sorted(set(stubs))
            if checks:
                self.checkers[cell.id] = checks
                self.exercises += [e for e in checks if e not in self.exercises]
                for name, args in CALL.findall(cell.source):
                    ex = name.removeprefix("ex_").replace("_", ".")
                    self.calls[ex] = (name, [a.strip() for a in args.split(",") if a.strip()])
        return self


def match(submission: nbformat.NotebookNode, pristine: Pristine) -> float:
    """The share of the pristine notebook's text cells found unchanged in the submission (1.0: all of them).

    Text, not cell ids: the labs number their cells alike (c000, c001, ...), and students rarely edit the prose."""
    def texts(nb):
        return {"".join(c.source) if isinstance(c.get("source"), list) else c.get("source", "")
                for c in nb.cells if c.get("cell_type") == "markdown"}
    mine = texts(pristine.nb)
    return len(mine & texts(submission)) / max(1, len(mine))


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def scan(source: str, withheld: frozenset[str] = frozenset()) -> list[str]:
    """What an answer cell does that an answer has no business doing, one phrase each (empty: nothing).

    `withheld`: the labkit.reference modules of the graded lab and later ones (`recompute`), whose import is the
    answer; an earlier lab's reference ships with the kit and may be used."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # it will fail when run, and be graded as such
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                answer = parts[:2] == ["labkit", "reference"] and (len(parts) < 3 or parts[2] in withheld)
                if answer or name.startswith(("labkit.course", "labkit.checks", "ctypes")):
                    found.append(f"imports {name}")
            if isinstance(node, ast.ImportFrom) and node.module == "labkit":
                found += [f"imports labkit.{a.name}" for a in node.names if a.name in ("checks", "course")]
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and _watched(_dotted(target)):
                    found.append(f"assigns {_dotted(target)}")
                elif isinstance(target, ast.Subscript) and _watched(_dotted(target.value) + ".x"):
                    found.append(f"assigns an item of {_dotted(target.value)}")
                elif isinstance(target, ast.Name) and target.id in SHADOWED:
                    found.append(f"rebinds {target.id}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in SHADOWED:
            found.append(f"rebinds {node.name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and (_watched(_dotted(node.args[0]) + ".x") or _dotted(node.args[0]) in WATCHED_ROOTS):
                found.append(f"calls {node.func.id} on {_dotted(node.args[0])}")
        elif isinstance(node, ast.Attribute) and _dotted(node).split(".")[:2] in (["lk", "checks"], ["labkit", "checks"]) \
                and _dotted(node).count(".") == 1:  # the checkers (and their oracles) are no answer's to call
            found.append(f"uses {_dotted(node)}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            found.append(f"uses .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                any(f"labkit.reference.{m}" in node.value for m in withheld):
            found.append("names a withheld labkit.reference module in a string")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                any(name in node.value for name in ("labkit.checks", "labkit.course", "labkit/checks", "labkit/course")):
            found.append("names the checkers or the grader in a string")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "vars") \
                and node.args and _dotted(node.args[0]).split(".")[0] in ("lk", "labkit"):
            found.append(f"calls {node.func.id} on {_dotted(node.args[0])}")
        elif isinstance(node, ast.Attribute) and _dotted(node) == "sys.modules":
            found.append("reads sys.modules")
    return sorted(set(found))


@dataclass
class Rebuilt:
    """The notebook to run, and what the rebuild learnt: answer cell ids found, and scan findings per exercise."""

    nb: nbformat.NotebookNode
    found: set[str]
    flags: dict[str, list[str]]
    lost: set[str] = field(default_factory=set)  # exercises whose answer cell is not in the returned file


def _answer_source(source: str) -> str:
    """The student's cell as run: nbval's comment markers dropped (they mean nothing to the grader)."""
    return "\n".join(line for line in source.splitlines() if not re.match(r"\s*#\s*NBVAL_", line))


def rebuild(submission: nbformat.NotebookNode, pristine: Pristine, withheld: frozenset[str] = frozenset()) -> Rebuilt:
    """The pristine notebook with the submission's answer cells put in (by id); see the module docstring."""
    returned = {c.get("id"): c for c in submission.cells if c.get("cell_type") == "code"}
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(pristine.nb), as_version=4))
    found, flags = set(), {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        role = "given"
        if cell.id in pristine.answers:
            role = "answer"
            mine = returned.get(cell.id)
            if mine is not None and isinstance(mine.get("source"), (str, list)):
                source = mine.source if isinstance(mine.source, str) else "".join(mine.source)
                cell.source = _answer_source(source)
                found.add(cell.id)
                for finding in scan(cell.source, withheld):
                    for ex in pristine.answers[cell.id]:
                        flags.setdefault(ex, []).append(finding)
        elif cell.id in pristine.checkers:
            role = "checker"
        cell.outputs, cell.execution_count = [], None
        cell.metadata["labkit_grade"] = {"role": role, "exercises": pristine.answers.get(cell.id)
                                         or pristine.checkers.get(cell.id) or []}
    lost = {ex for cid, exercises in pristine.answers.items() if cid not in found for ex in exercises}
    return Rebuilt(nb, found, flags, lost)


# ---------------------------------------------------------------- the program a box runs
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _runs_nothing(node: ast.AST) -> bool:
    """An assignment to plain names whose value calls nothing (a table of constants, an alias): safe at load."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    plain = all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Starred, ast.Store)) for t in targets
                for n in ast.walk(t))
    return plain and not any(isinstance(n, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Lambda))
                             for n in ast.walk(node.value))


def definitions(source: str) -> tuple[str, int]:
    """The answer cell's definitions only (imports, functions, classes, assignments that call nothing), and how
    many top-level statements were left out: grading runs no student code but what a checker calls. A cell that
    does not parse is kept whole, so that its SyntaxError is what grading reports."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, 0
    kept = [n for n in tree.body if isinstance(n, DEFINITIONS) or _runs_nothing(n)]
    return ast.unparse(ast.Module(body=kept, type_ignores=[])), len(tree.body) - len(kept)


def program(built: "Rebuilt", pristine: Pristine) -> tuple[list[dict], dict[str, int]]:
    """The lab's `#| export` cells in order, as the box runs them: given cells as the kit has them, answer cells as
    the student returned them, cut to their definitions; and per exercise how many statements were left out."""
    cells, dropped = [], {}
    for cell in built.nb.cells:
        if cell.cell_type != "code":
            continue
        exercises = pristine.answers.get(cell.id, [])
        pristine_source = next(c.source for c in pristine.nb.cells if c.get("id") == cell.id)
        if not pristine_source.startswith(EXPORT):
            continue
        if exercises:
            source, left_out = definitions(cell.source)
            for ex in exercises:
                dropped[ex] = dropped.get(ex, 0) + left_out
        else:
            source = pristine_source
        cells.append({"id": cell.id, "exercises": exercises, "source": source})
    return cells, dropped
