"""Each lab's checkers keep one table of hints (docs/design.md, "Checkers"): every hint is used from it."""
from __future__ import annotations

import importlib
import re
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


def _normal(text: str) -> str:
    """Text to compare code in: whitespace dropped, and every one-letter name the same (`t` for `x` hides no
    answer)."""
    return re.sub(r"\s+", "", re.sub(r"\b[A-Za-z]\b", "_", text))


def _answer_lines(notebook: Path) -> list[str]:
    """Every line of the notebook's answer regions, comments and whitespace dropped (``_normal``)."""
    import nbformat

    from labkit.stubs import BEGIN, END

    lines, inside = [], False
    for cell in nbformat.read(notebook, as_version=4).cells:
        for line in cell.source.splitlines():
            if BEGIN in line or END in line:
                inside = BEGIN in line
                continue
            code = _normal(line.split("#")[0])
            if inside and code:
                lines.append(code)
    return lines


LINE = 12  # a whole line of an answer this long (whitespace dropped) a hint may not hold: `return out` says nothing
LEAK = 28  # nor a piece of one this long (an API's name alone, `torch.enable_grad()`, is a pointer, not the answer)


@pytest.mark.parametrize("lab", CATALOG, ids=[lab.number for lab in CATALOG])
def test_no_hint_repeats_a_piece_of_its_labs_answers(lab):
    """A hint teaches where to look; one that holds a line of the solution's code (LINE characters or more,
    whitespace dropped) or a piece of one (LEAK or more), that the student's notebook does not show anyway,
    hands the answer over."""
    import difflib

    import nbformat

    root = Path(__file__).resolve().parent.parent
    module = importlib.import_module(f"{lab.checks}.hints" if lab.checks in LABS else lab.checks)
    hints = [v for n, v in vars(module).items() if n.isupper() and isinstance(v, str)]
    hints += [h for _, h in getattr(module, "KNOWN_ERRORS", ())]
    shown = _normal("".join(c.source for c in nbformat.read(lab.student(root), as_version=4).cells))
    answers = _answer_lines(lab.solution(root))
    assert answers
    found = []
    for hint in hints:
        text = _normal(hint)
        for line in answers:
            m = difflib.SequenceMatcher(None, text, line, autojunk=False).find_longest_match(0, len(text), 0, len(line))
            piece = text[m.a:m.a + m.size]
            if (m.size >= LEAK or m.size == len(line) >= LINE) and piece not in shown:
                found.append((piece, hint))
    assert not found, "hints that repeat the answer:\n" + "\n".join(f"  {p!r} in {h!r}" for p, h in found)


STRICT = ["03"]  # labs whose hints hold no line of an answer even where the prose shows it (issue 46)


@pytest.mark.parametrize("number", STRICT)
def test_no_hint_writes_an_answer_line(number):
    """A hint points, it does not write: no hint holds a whole line of the answers (LINE characters or more,
    whitespace dropped), not even one the lab's text shows, which a hint would hand over ready to paste."""
    lab = next(lab for lab in CATALOG if lab.number == number)
    module = importlib.import_module(f"{lab.checks}.hints")
    hints = [v for n, v in vars(module).items() if n.isupper() and isinstance(v, str)]
    answers = [line for line in _answer_lines(lab.solution(Path(__file__).resolve().parent.parent)) if len(line) >= LINE]
    found = [(line, hint) for hint in hints for line in answers if line in _normal(hint)]
    assert not found, "hints that write an answer line:\n" + "\n".join(f"  {a!r} in {h!r}" for a, h in found)
