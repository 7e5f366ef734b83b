"""Each lab's checkers keep one table of hints (docs/design.md, "Checkers"): every hint is used from it."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

LABS = ["labkit.checks.lab01", "labkit.checks.lab02", "labkit.checks.lab03", "labkit.checks.lab04",
        "labkit.checks.lab05", "labkit.checks.lab06", "labkit.checks.lab07"]


@pytest.mark.parametrize("package", LABS)
def test_every_hint_is_used_and_no_hint_is_typed_twice(package):
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
