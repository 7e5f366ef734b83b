"""One layering, written once (docs/design.md, "The package") and held here: every import in labkit/, lazy ones
and importlib.import_module of a name included, goes where the table allows, and no import cycle joins labkit's
modules. The table is read from the design note itself, so the two cannot drift apart."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN_NOTE = ROOT / "docs" / "design.md"
ROW = re.compile(r"^\| ([a-z ]+) \| (`labkit[^|]*) \| ([^|]+) \|$", re.M)
ROOT_PACKAGE = "labkit"  # a row's `labkit` is the package's own __init__.py, not everything inside it


@dataclass(frozen=True)
class Import:
    """One import in a labkit module: who imports, what, where."""

    source: str  # the importing module, "labkit.planners.advice"
    target: str  # the imported module, "labkit.labs.pitfalls" (a package's submodule when `from pkg import sub`)
    path: str  # the importing file, relative to the repository
    line: int


def table(text: str) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(group -> its module prefixes, group -> the groups it may import) from the design note's table."""
    prefixes, allowed = {}, {}
    rows = [line for line in text.split("## The package", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| ") and not line.startswith(("| group", "| ---"))]
    found = ROW.findall(text)
    assert len(found) == len(rows), f"docs/design.md's table has {len(rows)} rows, {len(found)} of them readable"
    for group, modules, may in found:
        prefixes[group] = re.findall(r"`([\w.]+)`", modules)
        allowed[group] = {g.strip() for g in may.split(",")} - {"—"}
    for group, may in allowed.items():
        if may == {"everything"}:
            allowed[group] = set(prefixes)
    unknown = {g for may in allowed.values() for g in may} - set(prefixes)
    assert prefixes and not unknown, f"docs/design.md's table names no group {unknown or ''} it defines"
    return prefixes, allowed


def group_of(module: str, prefixes: Mapping[str, list[str]]) -> str | None:
    """The group whose longest module prefix `module` starts with; the root package only as itself."""
    best = None
    for group, names in prefixes.items():
        for name in names:
            inside = module == name or (name != ROOT_PACKAGE and module.startswith(name + "."))
            if inside and (best is None or len(name) > len(best[1])):
                best = (group, name)
    return best[0] if best else None


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


UNREADABLE = "<a name computed at run time>"


def imports(sources: Mapping[str, str], root: Path = ROOT) -> Iterator[Import]:
    """Every import of labkit by the given files (path relative to `root` -> text), lazy ones included."""
    modules = {module_name(root / p, root) for p in sources}
    for rel, text in sources.items():
        source = module_name(root / rel, root)
        package = source if rel.endswith("__init__.py") else source.rpartition(".")[0]
        for node in ast.walk(ast.parse(text)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from .x import y
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from pkg import sub` imports the submodule; `from mod import name`, the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "import_module", "__import__"):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    targets = [arg.value]
                elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant) \
                        and str(arg.values[0].value).startswith("labkit."):
                    targets = [str(arg.values[0].value).rstrip(".")]  # f"labkit.reference.{name}": its prefix
                else:
                    yield Import(source, UNREADABLE, rel, node.lineno)  # refused below: the test cannot follow it
            for target in targets:
                if target == "labkit" or target.startswith("labkit."):
                    yield Import(source, target, rel, node.lineno)


def generated_edges(sources: Mapping[str, str], root: Path = ROOT) -> Iterator[Import]:
    """The import each generated labkit/labs/NAME.py makes at run time: lab_code("NAME") imports
    labkit.reference.NAME where the kit has it."""
    for rel, text in sources.items():
        found = re.search(r"lab_code\('(\w+)'", text)
        if rel.startswith("labkit/labs/") and found:
            yield Import(module_name(root / rel, root), f"labkit.reference.{found.group(1)}", rel, 1)


def violations(sources: Mapping[str, str], design: str) -> list[str]:
    """Each import the table does not allow: 'file:line: a imports b, but group X may import only ...'."""
    prefixes, allowed = table(design)
    found = []
    for imp in imports(sources):
        mine, theirs = group_of(imp.source, prefixes), group_of(imp.target, prefixes)
        if imp.target == UNREADABLE:
            found.append(f"{imp.path}:{imp.line}: {imp.source} imports a name computed at run time, which this test "
                         "cannot check against docs/design.md's table; import it by its name")
        elif mine is None or theirs is None:
            found.append(f"{imp.path}:{imp.line}: {imp.source} or {imp.target} is in no group of docs/design.md's "
                         "table; add it to a row")
        elif theirs != mine and theirs not in allowed[mine]:
            found.append(f"{imp.path}:{imp.line}: {imp.source} ({mine}) imports {imp.target} ({theirs}), but "
                         f"{mine} may import only {', '.join(sorted(allowed[mine])) or 'nothing of labkit'} "
                         "(docs/design.md, \"The package\")")
    return found


def cycles(sources: Mapping[str, str]) -> list[list[str]]:
    """The import cycles among labkit's modules (each found once, from its first module). Python also imports a
    module's parent packages first; those implicit edges are left out, as every import checker leaves them out:
    each package's __init__ importing its own modules would close a cycle through every module inside it."""
    modules = {module_name(ROOT / p, ROOT) for p in sources}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in [*imports(sources), *generated_edges(sources)]:
        if imp.target in modules and not (imp.source == "labkit.labs" and imp.target.startswith("labkit.reference")):
            graph[imp.source].add(imp.target)
    found, state = [], {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                found.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m, [m])
    return found


def kit_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "labkit").rglob("*.py"))}


# ---------------------------------------------------------------- the kit as it is
def test_every_import_goes_where_the_table_allows():
    assert violations(kit_sources(), DESIGN_NOTE.read_text()) == []


def test_no_import_cycle_among_labkit_modules():
    assert cycles(kit_sources()) == []


def test_every_generated_lab_module_is_an_edge_to_its_reference():
    sources = kit_sources()
    generated = [p for p in sources if p.startswith("labkit/labs/") and not p.endswith("__init__.py")]
    edges = {i.path for i in generated_edges(sources)}
    assert generated and set(generated) == edges


def test_only_labkit_labs_imports_the_reference_answers():
    reaching = sorted({f"{i.path}:{i.line}" for i in imports(kit_sources())
                       if i.target.startswith("labkit.reference") and not i.source.startswith(("labkit.labs",
                                                                                               "labkit.reference"))})
    assert reaching == []


def test_importing_labkit_imports_no_lab_s_code():
    code = "import labkit, sys; print(sorted(m for m in sys.modules if m.startswith(('labkit.labs', 'labkit.reference'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[]"


def test_importing_labkit_leaves_the_drawing_libraries_until_a_lab_draws():
    code = ("import labkit as lk, sys; drawing = ('matplotlib', 'ipywidgets')\n"
            "print(sorted(m for m in drawing if m in sys.modules))\n"
            "lk.plots; print(sorted(m for m in drawing if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split() == ["[]", "['matplotlib']"]


def test_labkit_keeps_at_most_eight_files_at_its_top_level():
    top = sorted(p.name for p in (ROOT / "labkit").glob("*.py"))
    assert len(top) <= 8, top


# ---------------------------------------------------------------- the checks can fail
@pytest.mark.parametrize("where, planted, rule", [
    ("labkit/models/gpt.py", "from labkit.planners import advise", "models may import only nothing of labkit"),
    ("labkit/instruments/meter.py", "def f():\n    from labkit.labs.recompute import checkpoint",
     "instruments may import only env, models"),
    ("labkit/plans/plan.py", "import importlib\nimportlib.import_module('labkit.bench')", "plans may import only"),
    ("labkit/env/doctor.py", "def f():\n    from labkit import course", "env may import only models"),
])
def test_a_planted_upward_import_is_named_with_its_file_line_and_rule(where, planted, rule):
    sources = kit_sources()
    sources[where] += "\n" + planted + "\n"
    found = violations(sources, DESIGN_NOTE.read_text())
    line = len(sources[where].splitlines())  # the planted import's last line
    assert len(found) == 1 and found[0].startswith(f"{where}:") and rule in found[0], found
    assert int(found[0].split(":")[1]) in (line, line - 1)


def test_a_planted_cycle_is_found():
    sources = kit_sources()
    sources["labkit/env/gpuinfo.py"] += "\nfrom labkit.env import doctor\n"  # doctor imports gpuinfo
    assert ["labkit.env.doctor", "labkit.env.gpuinfo", "labkit.env.doctor"] in cycles(sources)


def test_a_new_module_in_no_row_is_named():
    sources = kit_sources()
    sources["labkit/stray.py"] = "from labkit.course import grade\n"  # not the surface: the root is only itself
    (found,) = violations(sources, DESIGN_NOTE.read_text())
    assert found.startswith("labkit/stray.py:1: labkit.stray or labkit.course.grade is in no group")


def test_an_import_by_a_computed_name_is_refused():
    sources = kit_sources()
    sources["labkit/models/gpt.py"] += "\nimport importlib\nname = 'labkit.' + 'course'\nimportlib.import_module(name)\n"
    (found,) = violations(sources, DESIGN_NOTE.read_text())
    assert "imports a name computed at run time" in found
