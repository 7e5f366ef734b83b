"""The solution -> student generator: one source of truth per lab.

`solutions/NN_name.ipynb` is authored and executed. From it this module makes
  * `notebooks/NN_name.ipynb`: each `### BEGIN SOLUTION` ... `### END SOLUTION`
    region replaced by a stub raising NotImplementedError("Exercise N.M: ..."),
    outputs and execution counts cleared, and every cell that uses an answer
    (a name an exercise cell defines, or an earlier lab's, imported from labkit.labs)
    tagged `raises-exception`, so Run All in JupyterLab goes past a stub to the
    end of the lab; nbval's `# NBVAL_...` marker lines dropped; everything else identical;
  * (views.py) `labkit/reference/name.py`: the code cells whose first line is `#| export`,
    markers removed, so benchmarks and later labs import the very text the
    solution shows (docs/design.md, "One truth").
The exercise id and title come from the closest `## Exercise N.M: title`
heading above the region.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from labkit.stubs import BEGIN, END, HEADING, stub_lines

RAISES = "raises-exception"  # JupyterLab (and nbclient) run on past an error in a cell with this tag
CHECKER = "lk.checks.ex_"  # a checker cell: never tagged, its failure must count
NBVAL = re.compile(r"^\s*#\s*NBVAL_\w+\s*$")


class NotebookError(ValueError):
    """A solution notebook the generator cannot turn into a student notebook."""


@dataclass(frozen=True)
class Exercise:
    """The exercise a solution region belongs to: id "2.1" and its heading's title."""

    id: str
    title: str

    def stub(self, indent: str) -> list[str]:
        """Lines that replace the solution region, at the region's indentation (the stub contract)."""
        return stub_lines(self.id, self.title, indent)


def read(path: Path) -> nbformat.NotebookNode:
    """Read a notebook, naming the file when it is not a valid notebook."""
    try:
        return nbformat.read(path, as_version=4)
    except (json.JSONDecodeError, nbformat.reader.NotJSONError) as e:
        raise NotebookError(f"{path}: not a valid notebook (invalid JSON: {e})") from None
    except OSError as e:
        raise NotebookError(f"{path}: cannot be read ({e})") from None


def solution_regions(lines: list[str], where: str) -> list[tuple[int, int]]:
    """(begin, end) line indices of the solution regions; errors name the line."""
    regions, begin = [], None
    for i, line in enumerate(lines):
        marker = line.strip()
        if marker == BEGIN:
            if begin is not None:
                raise NotebookError(f"{where}, line {i + 1}: {BEGIN} inside the region opened on line {begin + 1}")
            begin = i
        elif marker == END:
            if begin is None:
                raise NotebookError(f"{where}, line {i + 1}: {END} without a {BEGIN} before it")
            regions.append((begin, i))
            begin = None
    if begin is not None:
        raise NotebookError(f"{where}, line {begin + 1}: {BEGIN} is never closed by {END}")
    return regions


def stub_source(source: str, exercise: Exercise | None, where: str) -> str:
    """The student version of one code cell's source."""
    lines = source.splitlines(keepends=True)
    regions = solution_regions(lines, where)
    if regions and exercise is None:
        raise NotebookError(f"{where}: a solution region with no '## Exercise N.M: title' heading above it")
    for begin, end in reversed(regions):
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        lines[begin : end + 1] = exercise.stub(indent)
    return "".join(lines).rstrip("\n") if regions else source


def export_source(source: str, where: str) -> str:
    """The exported text of a `#| export` cell: first line and markers removed."""
    lines = source.splitlines(keepends=True)
    solution_regions(lines, where)  # validates
    kept = [l for l in lines[1:] if l.strip() not in (BEGIN, END)]
    return "".join(kept).strip("\n") + "\n"


def strip_nbval(source: str) -> str:
    """`source` without nbval's marker lines (`# NBVAL_IGNORE_OUTPUT`): they steer the tests of the solutions
    and mean nothing to a student."""
    return "".join(line for line in source.splitlines(keepends=True) if not NBVAL.match(line))


def student_view(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The student notebook of solution `nb` (a new object; `nb` is untouched)."""
    out = nbformat.from_dict(json.loads(json.dumps(nb)))
    exercise = None
    answers: dict[int, str] = {}  # answer cell index -> its solution source
    for index, cell in enumerate(out.cells):
        if cell.cell_type == "markdown":
            found = HEADING.findall(cell.source)
            if found:
                exercise = Exercise(*found[-1])
        elif cell.cell_type == "code":
            stubbed = stub_source(cell.source, exercise, f"{name}, cell {index}")
            if stubbed != cell.source:
                answers[index] = cell.source
            cell.source = strip_nbval(stubbed)
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)  # docs/design.md, "Quiet diffs"
    for index in uses_answers(out.cells, answers, name):
        tags = out.cells[index].metadata.setdefault("tags", [])
        if RAISES not in tags:
            tags.append(RAISES)
    for cell in out.cells:  # what the generator wrote, so that it can tell a student's edit from a stale view
        cell.metadata["labkit"] = {"generated": generated_digest(cell.source)}
    return out


def generated_digest(source: str) -> str:
    """The digest a generated cell carries of its source (nbgrader keeps a checksum the same way)."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names a cell binds at top level, names it reads anywhere, function bodies included)."""
    binds: set[str] = set()
    todo = list(tree.body)
    while todo:  # top-level statements, into if/for/with/try blocks but not into function or class bodies
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            binds |= {(a.asname or a.name).split(".")[0] for a in node.names}
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                binds.add(child.id)
            elif isinstance(child, (ast.stmt, ast.expr, ast.excepthandler, ast.comprehension, ast.withitem)) \
                    and not isinstance(child, ast.Lambda):
                todo.append(child)
    reads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return binds, reads


def uses_answers(cells: list, answers: dict[int, str], name: str) -> list[int]:
    """Indices of the code cells that raise while an exercise is a stub: the stub cells whose stub runs at top level,
    and every cell reading a name an answer cell binds or labkit.labs provides (transitively); checker cells
    are left out (their failure is the grade)."""
    tainted: set[str] = set()
    found = []
    for index, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError as e:
            raise NotebookError(f"{name}, cell {index}: not valid Python ({e.msg}, line {e.lineno})") from None
        binds, reads = _names(tree)
        from_reference = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                          and (node.module or "").startswith(("labkit.reference", "labkit.labs")) for a in node.names}
        if index in answers:
            tainted |= binds | _names(ast.parse(answers[index]))[0]  # what the solution binds, the stub may not
            if any(isinstance(node, ast.Raise) for node in tree.body):
                found.append(index)
        elif CHECKER in cell.source:
            continue
        elif reads & tainted:
            tainted |= binds
            found.append(index)
        tainted |= from_reference
    return found
