"""Each lab's checkers keep one table of hints (docs/design.md, "Checkers"): every hint is used from it."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from labkit.course.catalog import LABS as CATALOG

# every lab whose checkers are a package keeps a hints module (lab 00's one checker is a module of its own)
LABS = [lab.checks for lab in CATALOG if (Path(__file__).resolve().parent.parent / lab.checks.replace(".", "/")).is_dir()]


@pytest.mark.parametrize("package", LABS)
def test_every_hint_is_used_and_no_hint_is_typed_twice(package):
    assert len(LABS) == len(CATALOG) - 1
    hints = importlib.import_module(f"{package}.hints")
    folder = Path(importlib.import_module(package).__file__).parent
    code = "".join(p.read_text() for p in folder.glob("*.py") if p.name != "hints.py")
    names = [n for n in vars(hints) if n.isupper() and isinstance(getattr(hints, n), str)]
    in_tables = {h for _, h in getattr(hints, "KNOWN_ERRORS", ())}
    unused = [n for n in names if f"H.{n}" not in code and getattr(hints, n) not in in_tables]
    assert not unused, f"hints never used: {unused}"
    values = [getattr(hints, n) for n in names]
    assert len(set(values)) == len(values), "the same hint text under two names"
    for literal in values:  # a hint typed again in a checker instead of taken from the table
        assert f'"{literal[:40]}' not in code and f"'{literal[:40]}" not in code, literal
