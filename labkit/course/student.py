"""The solution -> student generator: one source of truth per lab.

`solutions/NN_name.ipynb` is authored and executed. From it this module makes
  * `notebooks/NN_name.ipynb`: each `### BEGIN SOLUTION` ... `### END SOLUTION`
    region replaced by a stub raising NotImplementedError("Exercise N.M: ..."),
    outputs and execution counts cleared, and every cell that uses an answer
    (a name an exercise cell defines, or an earlier lab's, imported from labkit.labs)
    tagged `raises-exception`, so Run All in JupyterLab goes past a stub to the
    end of the lab; nbval's `# NBVAL_...` marker lines dropped; everything else identical;
  * `labkit/reference/name.py`: the code cells whose first line is `#| export`,
    markers removed, so benchmarks and later labs import the very text the
    solution shows (docs/design.md, "One truth").
The exercise id and title come from the closest `## Exercise N.M: title`
heading above the region.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
EXPORT = "#| export"
RAISES = "raises-exception"  # JupyterLab (and nbclient) run on past an error in a cell with this tag
CHECKER = "lk.checks.ex_"  # a checker cell: never tagged, its failure must count
NBVAL = re.compile(r"^\s*#\s*NBVAL_\w+\s*$")
HEADING = re.compile(r"^#{2,3}\s+Exercise\s+(\d+\.\d+)\s*[:.\u2014-]\s*(.+?)\s*$", re.M)


class NotebookError(ValueError):
    """A solution notebook the generator cannot turn into a student notebook."""


@dataclass(frozen=True)
class Exercise:
    """The exercise a solution region belongs to: id "2.1" and its heading's title."""

    id: str
    title: str

    def stub(self, indent: str) -> list[str]:
        """Lines that replace the solution region, at the region's indentation."""
        message = json.dumps(f"Exercise {self.id}: {self.title}")
        return [f"{indent}# YOUR CODE HERE\n", f"{indent}raise NotImplementedError({message})\n"]


def read(path: Path) -> nbformat.NotebookNode:
    """Read a notebook, naming the file when it is not a valid notebook."""
    try:
        return nbformat.read(path, as_version=4)
    except (json.JSONDecodeError, nbformat.reader.NotJSONError) as e:
        raise NotebookError(f"{path}: not a valid notebook (invalid JSON: {e})") from None
    except OSError as e:
        raise NotebookError(f"{path}: cannot be read ({e})") from None


def _regions(lines: list[str], where: str) -> list[tuple[int, int]]:
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
    regions = _regions(lines, where)
    if regions and exercise is None:
        raise NotebookError(f"{where}: a solution region with no '## Exercise N.M: title' heading above it")
    for begin, end in reversed(regions):
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        lines[begin : end + 1] = exercise.stub(indent)
    return "".join(lines).rstrip("\n") if regions else source


def export_source(source: str, where: str) -> str:
    """The exported text of a `#| export` cell: first line and markers removed."""
    lines = source.splitlines(keepends=True)
    _regions(lines, where)  # validates
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
    return out


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


def _defined_names(source: str, where: str) -> set[str]:
    """Top-level names a code cell defines (functions, classes, assignments; imports left out)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise NotebookError(f"{where}: not valid Python ({e.msg}, line {e.lineno})") from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _section(cells: list, index: int) -> str:
    """The closest `##` heading above cell `index` (the notebook's title if there is none)."""
    for cell in reversed(cells[:index]):
        if cell.cell_type == "markdown":
            found = re.findall(r"^#{1,3}\s+(.+?)\s*$", cell.source, re.M)
            if found:
                return found[-1]
    return "top"


def _part_header(nb: nbformat.NotebookNode, index: int, exercise: Exercise | None, name: str) -> str:
    """`# Exercise 2.1: title` for an answer cell, `# Given, section "..."` otherwise; and where it comes from."""
    cell = nb.cells[index]
    where = f"{name}, cell {cell.get('id', index)}"
    if exercise is not None and _regions(cell.source.splitlines(keepends=True), where):
        return f"# Exercise {exercise.id}: {exercise.title}  ({where})"
    return f'# Given, section "{_section(nb.cells, index)}"  ({where})'


def reference_module(nb: nbformat.NotebookNode, name: str) -> str | None:
    """Text of the generated module for notebook `name`, or None if it exports nothing.

    Each part is headed by the exercise it answers (or says it is given), with the cell it comes from; two
    export cells defining one top-level name are an error (the later would silently win).
    """
    parts, owner = [], {}
    exercise = None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and HEADING.findall(cell.source):
            exercise = Exercise(*HEADING.findall(cell.source)[-1])
        if cell.cell_type != "code" or not cell.source.startswith(EXPORT):
            continue
        where = f"{name}, cell {cell.get('id', index)}"
        text = export_source(cell.source, where)
        for defined in sorted(_defined_names(text, where)):
            if defined in owner:
                raise NotebookError(f"{name}: cells {owner[defined]} and {cell.get('id', index)} both define "
                                    f"{defined!r}; in the generated module the later would silently win")
            owner[defined] = cell.get("id", index)
        parts.append(_part_header(nb, index, exercise, name) + "\n" + text)
    if not parts:
        return None
    header = (
        f'"""Reference code of {name}, generated by `python -m labkit student`; do not edit.\n\n'
        f"The solution notebook is the source: edit its `{EXPORT}` cells, then run `make student`.\n"
        '"""\n'
    )
    return header + "\n\n".join(parts)


def module_name(notebook: Path) -> str:
    """labkit.reference module file for a notebook: `02_recompute.ipynb` -> `recompute.py`."""
    return re.sub(r"^\d+_", "", notebook.stem) + ".py"


def labs_module(notebook: Path) -> str:
    """Text of `labkit/labs/NAME.py`: the names of a lab's code, from the reference or the student's notebook."""
    module = module_name(notebook)[:-3]
    return (f'"""Lab {notebook.name[:2]}\'s code, the `{EXPORT}` cells of {notebook.name}; generated by '
            f'`python -m labkit student`.\n\n'
            f"The reference answers (labkit.reference.{module}) where the kit ships them, else your own "
            f"{notebook.name}:\nsee labkit/labs/__init__.py.\n\"\"\"\n"
            f"from labkit.labs import lab_code\n\nglobals().update(lab_code({module!r}, {notebook.name!r}))\n")


def _views(solutions: Path, root: Path) -> dict[Path, str]:
    """Every generated file (path -> text), computed in memory before anything is written."""
    views: dict[Path, str] = {}
    for path in sorted(solutions.glob("*.ipynb")):
        nb = read(path)
        name = f"solutions/{path.name}"
        views[root / "notebooks" / path.name] = nbformat.writes(student_view(nb, name)) + "\n"
        module = reference_module(nb, name)
        if module is not None:
            views[root / "labkit" / "reference" / module_name(path)] = module
            views[root / "labkit" / "labs" / module_name(path)] = labs_module(path)
    return views


def write(root: Path) -> list[Path]:
    """Regenerate notebooks/ and labkit/reference/ from solutions/; returns the files written."""
    views = _views(root / "solutions", root)
    for path, text in views.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(views)


def _first_difference(expected: str, path: Path) -> str:
    """Where a stale notebook first differs from its generated view."""
    want = nbformat.reads(expected, as_version=4).cells
    try:
        have = read(path).cells
    except NotebookError as e:
        return str(e)
    for index, (a, b) in enumerate(zip(want, have)):
        if a != b:
            return f"cell {index} differs from the solution's student view"
    return f"has {len(have)} cells, the solution's student view has {len(want)}"


def check(root: Path) -> list[str]:
    """Problems that make notebooks/ or labkit/reference/ stale; empty when current."""
    problems = []
    views = _views(root / "solutions", root)
    for path, text in views.items():
        rel = path.relative_to(root)
        if not path.exists():
            problems.append(f"{rel}: missing")
        elif path.read_text() != text:
            detail = _first_difference(text, path) if path.suffix == ".ipynb" else "differs from the solution's export cells"
            problems.append(f"{rel}: out of date ({detail})")
    for folder in ("reference", "labs"):
        for path in sorted((root / "labkit" / folder).glob("*.py")):
            if path.name != "__init__.py" and path not in views:
                problems.append(f"labkit/{folder}/{path.name}: no solution exports it any more (delete it)")
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        if path not in views:
            problems.append(f"notebooks/{path.name}: no solutions/{path.name} to generate it from")
        for index, cell in enumerate(read(path).cells):
            if BEGIN in cell.source or END in cell.source:
                problems.append(f"notebooks/{path.name}, cell {index}: a solution marker leaked")
            if cell.cell_type == "code" and strip_nbval(cell.source) != cell.source:
                problems.append(f"notebooks/{path.name}, cell {index}: an nbval marker leaked")
    return problems
