"""A stub's NotImplementedError shows as one line naming its exercise; other errors keep their traceback."""
from __future__ import annotations

import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from labkit import student, stubs


def test_the_stub_the_generator_writes_is_recognised():
    ns: dict = {}
    with pytest.raises(NotImplementedError) as raised:
        exec("".join(student.Exercise("2.3", "re-enter the forward's autocast").stub("")), ns)
    error = raised.value
    line = stubs.message(error)
    assert line.startswith("NotImplementedError: this cell needs Exercise 2.3 (re-enter the forward's autocast)")
    assert "in lab 02's notebook, under '## Exercise 2.3', run that cell, then run this one again" in line
    assert stubs.message(NotImplementedError("not yet")) is None
    assert stubs.message(RuntimeError("Exercise 2.3: x")) is None


@pytest.mark.slow
def test_in_a_kernel_a_stub_is_one_line_and_still_a_not_implemented_error():
    stub = "".join(student.Exercise("1.2", "count the bytes").stub("    "))
    nb = new_notebook(cells=[new_code_cell("import labkit"), new_code_cell(f"def f():\n{stub}\nf()"),
                             new_code_cell("raise NotImplementedError('mine')")])
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    (shown,), (other,) = nb.cells[1].outputs, nb.cells[2].outputs
    assert shown.ename == "NotImplementedError" and shown.evalue == "Exercise 1.2: count the bytes"
    assert shown.traceback == [stubs.message(NotImplementedError(shown.evalue))]
    assert other.ename == "NotImplementedError" and len(other.traceback) > 1  # IPython's usual traceback
