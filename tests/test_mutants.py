"""tools/mutants.py plants each mutant in the module's own text: comments and layout stay, so tests that read a
module's source (test_checks_lab03 plants bugs in optimal_tables' source by text) run on every mutant."""
from __future__ import annotations

import ast
import difflib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "tools" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutants"] = module
    spec.loader.exec_module(module)
    return module


SOURCE = '''\
def f(a: int, b: list) -> int:
    """Docstring 1."""
    # a comment that stays
    if not (a > 1 and a in b):  # trailing
        print("√ no")
    return (a  # split over lines
            * 2) // (b[-1] is not None)
'''


@pytest.mark.parametrize("module", ["labkit/reference/sqrt_n.py", None])
def test_every_mutant_changes_only_its_own_text(module):
    tool = _tool()
    source = SOURCE if module is None else (ROOT / module).read_text()
    found = tool.mutants(source)[::1 if module is None else 5]  # a fifth of a module's: every kind, in seconds
    assert found
    for m in found:
        out = tool.apply(source, m)
        changed = [line for line in difflib.unified_diff(source.splitlines(), out.splitlines(), n=0, lineterm="")
                   if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        assert len(changed) <= 2 * 3, (m, changed)  # a deleted call may span lines; nothing else moves
        assert ast.dump(ast.parse(out)) != ast.dump(ast.parse(source)), m  # it is a mutant (apply: the mutant's)
        # every comment of the module is still there, but those inside a deleted call statement
        kept = [line.split("#", 1)[1] for line in out.splitlines() if "#" in line]
        assert len(kept) >= len([line for line in source.splitlines() if "#" in line]) - 3, m


def test_each_kind_of_mutant_reads_as_planted():
    tool = _tool()
    planted = {m.change: tool.apply(SOURCE, m) for m in tool.mutants(SOURCE)}
    assert "    if (a > 1 and a in b):  # trailing" in planted["drop `not`"]
    assert "    if not (a > 1 or a in b):  # trailing" in planted["And -> Or"]
    assert "    if not (a >= 1 and a in b):  # trailing" in planted["Gt -> GtE"]
    assert "    if not (a > 1 and a not in b):  # trailing" in planted["In -> NotIn"]
    assert "            // 2) // (b[-1] is not None)" in planted["Mult -> FloorDiv"]
    assert "            * 2) // (b[-1] is None)" in planted["IsNot -> Is"]
    assert "        None\n" in planted["delete the call statement"]
    assert "    # a comment that stays\n" in planted["delete the call statement"]
    assert '"""Docstring 1."""' in planted["1 -> 2"]  # text is never mutated
