"""What a notebook is (labkit/course/identity.py): every lab's student view and solution told apart and named by
lab, whatever the file's name; a view's edits counted; a notebook that is neither is 'other'; bytes from anyone
never raise."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.course import identity, student
from labkit.course.catalog import LABS

ROOT = Path(__file__).resolve().parent.parent
SIGNS = identity.signatures(ROOT)


def _nb(*cells: dict) -> bytes:
    return json.dumps({"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


def _cell(source: str, kind: str = "code", mark: str | None = None) -> dict:
    meta = {"labkit": {"generated": mark}} if mark is not None else {}
    return {"cell_type": kind, "source": source, "metadata": meta}


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.number)
def test_every_labs_view_and_solution_are_told_apart_and_named(lab):
    assert identity.identify(lab.student(ROOT).read_bytes(), SIGNS) == identity.Identity(lab.number, "view", 0)
    assert identity.identify(lab.solution(ROOT).read_bytes(), SIGNS) == identity.Identity(lab.number, "solution", 0)


def test_a_views_edits_and_added_cells_are_counted_and_pasted_markers_keep_it_a_view():
    nb = json.loads((ROOT / "notebooks" / "02_recompute.ipynb").read_text())
    answer = next(c for c in nb["cells"] if "NotImplementedError(\"Exercise" in "".join(c["source"]))
    answer["source"] = "### BEGIN SOLUTION\ndef f():\n    return 1\n### END SOLUTION\n"  # pasted from a solution
    nb["cells"].append(_cell("print('mine')"))  # a cell of her own: no mark
    assert identity.identify(json.dumps(nb).encode(), SIGNS) == identity.Identity("02", "view", 2)


def test_a_lab_is_named_from_a_quarter_of_its_own_digests():
    signs = {"02": frozenset(student.generated_digest(f"cell {i}") for i in range(4)),
             "03": frozenset(student.generated_digest(f"other {i}") for i in range(5))}
    quarter = _nb(_cell("cell 0", "markdown"), _cell("x = 1"))  # 1 of 4 of lab 02's: 0.25
    fifth = _nb(_cell("other 0", "markdown"))  # 1 of 5 of lab 03's: 0.2
    assert identity.identify(quarter, signs) == identity.Identity("02", "other")
    assert identity.identify(fifth, signs) == identity.Identity("", "other")
    both = _nb(_cell("cell 0", "markdown"), *(_cell(f"other {i}", "markdown") for i in range(3)))
    assert identity.identify(both, signs).lab == "03"  # 3/5 over 1/4


def test_a_notebook_of_code_without_markers_or_marks_is_other_and_one_with_markers_a_solution():
    plain = _nb(_cell("import torch\n# BEGIN SOLUTION, in a comment\nx = 1"), _cell("# notes", "markdown"))
    marked = _nb(_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"))
    in_prose = _nb(_cell("### BEGIN SOLUTION", "markdown"))  # markers count in code cells only
    assert identity.identify(plain, SIGNS) == identity.Identity("", "other")
    assert identity.identify(marked, SIGNS) == identity.Identity("", "solution")
    assert identity.identify(in_prose, SIGNS) == identity.Identity("", "other")


@pytest.mark.parametrize("data", [b"", b"\xff\xfe not json", b"[" * 100_000, b'{"cells": 3}', b'{"cells": [1, "x"]}',
                                  b'{"cells": [{"source": 5, "metadata": []}]}', b"null",
                                  b'{"cells": [{"cell_type": "code", "source": ["a", 3], "metadata": {"labkit": 1}}]}'])
def test_bytes_that_are_no_notebook_are_other_and_never_raise(data):
    assert identity.identify(data, SIGNS) == identity.Identity("", "other")
