"""The kit's own notes: every citation points at a heading or rule that exists in the repository."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTES = ("docs/design.md", "CONTRIBUTING.md")
CITATION = re.compile(r"(docs/design\.md|CONTRIBUTING\.md),? \"([^\"]+)\"")
# notes that live outside the repository, where a maintainer who clones the kit cannot read them
OUTSIDE = re.compile(r"\b(DESIGN|STYLE|EXAMPLES|FACTS)\b|\.\./shared")  # with .md or without
RULE = re.compile(r"\bRule ([A-Z0-9])\b")


def _sources() -> list[Path]:
    """Hand-written and generated text of the kit: code, tests, tools, notes, notebooks, Makefile."""
    files = [*ROOT.glob("labkit/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("tools/*.py"),
             *ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("solutions/*.ipynb"),
             *ROOT.glob("notebooks/*.ipynb"), ROOT / "Makefile", ROOT / "tools" / "kit.mk", ROOT / "pyproject.toml"]
    return sorted(f for f in files if f.is_file() and f.name != "test_docs.py")  # this file holds examples


def _headings(note: str) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", (ROOT / note).read_text(), re.M)}


def test_the_notes_exist():
    for note in NOTES:
        assert (ROOT / note).is_file(), note


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_citations_point_at_headings_that_exist(path):
    text = path.read_text()
    for note, heading in CITATION.findall(text):
        assert heading in _headings(note), f"{path.relative_to(ROOT)} cites {note}, {heading!r}: no such heading"
    outside = OUTSIDE.search(text)
    assert outside is None, f"{path.relative_to(ROOT)} cites {outside.group(0)!r}, which is not in the repository"


@pytest.mark.parametrize("path", sorted(ROOT.glob("labkit/**/*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_rules_cited_in_a_file_are_written_in_it(path):
    text = path.read_text()
    defined = set(re.findall(r"^\s*(?:#\s*)?Rule ([A-Z0-9])\b", text, re.M))  # a rule starts its line
    for rule in set(RULE.findall(text)):
        assert rule in defined, f"{path.relative_to(ROOT)} cites Rule {rule} but does not write it down"


def test_the_checker_catches_a_dangling_citation(tmp_path):
    """The pattern finds citations as code writes them (a test that could not fail would be worse than none)."""
    found = CITATION.findall('Rules (see docs/design.md, "No such heading"):')
    assert found == [("docs/design.md", "No such heading")] and "No such heading" not in _headings("docs/design.md")
    assert OUTSIDE.search("(DESIGN.md, \"One truth\")") and OUTSIDE.search("STYLE rule 8")
    assert OUTSIDE.search("at step 150, see\nFACTS).") and OUTSIDE.search("FACTS.md")
    assert all(OUTSIDE.search(f"as {n} says") and OUTSIDE.search(f"({n}.md)") for n in ("DESIGN", "STYLE", "EXAMPLES"))
    assert not OUTSIDE.search("docs/design.md, the design, a style of examples, facts")
