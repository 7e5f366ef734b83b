"""A stub's NotImplementedError shows as one line naming its exercise; other errors keep their traceback."""
from __future__ import annotations

import pytest

from labkit import stubs
from labkit.course import student


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


def test_other_errors_are_left_to_ipython():
    class Shell:
        def __init__(self):
            self.calls = []

        def showtraceback(self, exc_tuple, tb_offset=None):
            self.calls.append(("traceback", exc_tuple[0]))

        def _showtraceback(self, etype, value, stb):
            self.calls.append(("one line", stb))

    shell = Shell()
    assert stubs._show(shell, NotImplementedError, NotImplementedError("mine"), None) is None
    stub = NotImplementedError("Exercise 1.2: count the bytes")
    assert stubs._show(shell, NotImplementedError, stub, None) == [stubs.message(stub)]
    assert shell.calls == [("traceback", NotImplementedError), ("one line", [stubs.message(stub)])]
    # in a kernel: tests/helpers/run_all.py checks every stub error of every student notebook shows as this one line


def test_the_stub_the_generator_writes_is_the_one_the_grader_finds_and_the_checkers_tell():
    lines = stubs.stub_lines("3.4", "the optimal schedule", "    ")
    assert stubs.IN_SOURCE.findall("".join(lines)) == ["3.4"]
    namespace: dict = {}
    with pytest.raises(NotImplementedError) as info:
        exec("def f():\n" + "".join(lines) + "\nf()", namespace)
    assert stubs.stub_of(info.value) == ("3.4", "the optimal schedule")
    assert stubs.stub_of(NotImplementedError("not a stub")) is None
