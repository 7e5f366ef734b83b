"""No exercise's answer ships as library code (docs/design.md, "The package"): every answer region of every solution,
its AST normalised (local names renamed in order of appearance, docstrings dropped), is compared with every run of
as many statements in every function shipped outside labkit/reference/ (and the generated labkit/labs/); a match
fails, naming both. The same search finds each answer region in labkit/reference/, so it can find one."""
from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from labkit.course.catalog import LABS
from labkit.stubs import BEGIN, END

ROOT = Path(__file__).resolve().parent.parent
LEAST_NODES = 6  # a region smaller than this (a bare `return x`) would match too much to mean anything


@dataclass(frozen=True)
class Answer:
    where: str  # "solutions/06_pitfalls.ipynb, cell c006"
    shape: tuple[str, ...]  # each statement, normalised
    nodes: int


def _bound(tree: ast.AST) -> set[str]:
    """Names a function (or region) binds: its parameters, assignment and loop targets, comprehension variables."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


class _Rename(ast.NodeTransformer):
    """Local names to v0, v1, ... in order of appearance; globals (torch, math, max) keep theirs."""

    def __init__(self, local: set[str]) -> None:
        self.local, self.names = local, {}

    def _new(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}") if name in self.local else name

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(self._new(node.id), node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._new(node.arg)
        return self.generic_visit(node)


def _docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def normalised(statements: list[ast.stmt], local: set[str]) -> tuple[str, ...]:
    rename = _Rename(local)
    kept = [s for s in statements if not _docstring(s)]
    trees = [rename.visit(ast.parse(ast.unparse(s)).body[0]) for s in kept]  # a copy: the caller's AST untouched
    return tuple(ast.dump(t, annotate_fields=False, include_attributes=False) for t in trees)


def answers() -> Iterator[Answer]:
    """Every answer region of every solution, normalised with the names its enclosing function binds as locals."""
    for lab in LABS:
        nb = nbformat.read(lab.solution(ROOT), as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code" or BEGIN not in cell.source:
                continue
            lines = [line for line in cell.source.splitlines() if not line.startswith("#|")]
            tree = ast.parse("\n".join(lines).replace(BEGIN, "pass").replace(END, "pass"))
            begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
            ends = [i for i, line in enumerate(lines) if line.strip() == END]
            for n, (begin, end) in enumerate(zip(begins, ends)):
                region = ast.parse(textwrap.dedent("\n".join(lines[begin + 1:end]))).body
                enclosing = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                             and n.lineno <= begin + 1 <= n.end_lineno]
                local = _bound(enclosing[-1]) if enclosing else set()
                local |= _bound(ast.Module(body=region, type_ignores=[]))
                yield Answer(f"solutions/{lab.notebook}, cell {cell.id}, region {n + 1}", normalised(region, local),
                             sum(1 for s in region for _ in ast.walk(s)))


def _bodies(tree: ast.AST) -> Iterator[tuple[str, list[ast.stmt], set[str]]]:
    """(function name, a statement list inside it, the function's local names) for every function of a module."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local = _bound(fn)
            for node in ast.walk(fn):
                for field in ("body", "orelse", "finalbody"):
                    block = getattr(node, field, None)
                    if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                        yield fn.name, block, local


def matches(folder_files: list[Path], wanted: list[Answer]) -> list[str]:
    """'answer where == file:function' for every answer whose normalised statements some function holds."""
    found = []
    shapes = {}
    for a in wanted:
        shapes.setdefault(len(a.shape), {}).setdefault(a.shape, []).append(a)
    for path in folder_files:
        for name, block, local in _bodies(ast.parse(path.read_text())):
            body = [s for s in block if not _docstring(s)]
            for k, by_shape in shapes.items():
                for i in range(len(body) - k + 1):
                    for a in by_shape.get(normalised(body[i:i + k], local), []):
                        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                        found.append(f"{a.where} == {shown}:{name}")
    return sorted(set(found))


ANSWERS = [a for a in answers() if a.nodes >= LEAST_NODES]


def _shipped() -> list[Path]:
    """Every module of labkit but the generated ones (labkit/reference/*, labkit/labs/NAME.py)."""
    generated = [*(ROOT / "labkit" / "reference").glob("*.py"), *(ROOT / "labkit" / "labs").glob("*.py")]
    keep = {ROOT / "labkit" / "labs" / "__init__.py"}
    return [p for p in sorted((ROOT / "labkit").rglob("*.py")) if p not in generated or p in keep]


def test_every_exercise_has_an_answer_region_worth_comparing():
    regions = list(answers())
    assert len(regions) >= 26 and all(a.shape for a in regions)
    small = [a.where for a in regions if a.nodes < LEAST_NODES]
    assert not small, f"answer regions too small to compare: {small}"


def test_no_function_shipped_outside_the_reference_holds_an_answer():
    assert matches(_shipped(), ANSWERS) == []


def test_the_search_finds_every_exported_answer_in_its_reference_module():
    """The reference modules hold every exported answer: the same search must find each one there."""
    found = matches(sorted((ROOT / "labkit" / "reference").glob("*.py")), ANSWERS)
    assert {f.split(" == ")[0] for f in found} == {a.where for a in ANSWERS}


@pytest.mark.parametrize("renamed", [False, True], ids=["verbatim", "names changed"])
def test_an_answer_planted_in_the_library_is_found(tmp_path, renamed):
    recommend = (ROOT / "labkit" / "reference" / "pitfalls.py").read_text().split("def recommend", 1)[1]
    planted = "def recommend" + recommend
    if renamed:
        planted = re.sub(r"\bs\b", "situation", re.sub(r"\bfits\b", "ok", planted))
    lib = tmp_path / "advice.py"
    lib.write_text("from labkit.plans import Situation\n\n\n" + planted)
    assert matches([lib], ANSWERS) == ["solutions/06_pitfalls.ipynb, cell c050, region 1 == advice.py:recommend"]
