"""The exercise contract: the markers a solution's cells carry, and what an exercise's stub is, written once for
everyone who makes or meets one.

A solution marks an exercise with a `## Exercise N.M: title` heading (``HEADING``) and its answer between
``BEGIN`` and ``END`` (nbgrader's markers); a code cell whose first line is ``EXPORT`` is the lab's code that
later labs import (labkit.labs). The student generator (labkit.course.student) replaces each solution region with ``stub_lines``: `# YOUR CODE
HERE` and `raise NotImplementedError("Exercise N.M: title")`. The checkers (labkit.checks.base) tell a stub from
any other error by ``stub_of``; the grader (labkit.course.grade) finds the stub cells of a pristine notebook by
``IN_SOURCE``. In a kernel, `import labkit` registers a handler (``install``) that shows a stub's error as one
line naming the exercise and what to do, not a traceback that looks like a bug. The error stays a
NotImplementedError (Run All goes on past the cell's `raises-exception` tag, and tests see the same exception);
any other NotImplementedError gets IPython's usual traceback.
"""
from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["BEGIN", "END", "EXPORT", "HEADING", "IN_SOURCE", "stub_message", "stub_lines", "stub_of", "message",
           "install"]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
EXPORT = "#| export"
HEADING = re.compile(r"^#{2,3}\s+Exercise\s+(\d+\.\d+)\s*[:.\u2014-]\s*(.+?)\s*$", re.M)  # id, title

_MESSAGE = re.compile(r"^Exercise (\d+\.\d+): (.+)$")
IN_SOURCE = re.compile(r'raise NotImplementedError\("Exercise (\d+\.\d+)')  # a stub in a cell's source


def stub_message(exercise: str, title: str) -> str:
    """The stub's error message for Exercise `exercise` ("2.1") titled `title`."""
    return f"Exercise {exercise}: {title}"


def stub_lines(exercise: str, title: str, indent: str) -> list[str]:
    """The lines that replace a solution region, at the region's indentation."""
    return [f"{indent}# YOUR CODE HERE\n",
            f"{indent}raise NotImplementedError({json.dumps(stub_message(exercise, title))})\n"]


def stub_of(error: BaseException) -> tuple[str, str] | None:
    """(exercise, title) when `error` is a stub's NotImplementedError; None for any other error."""
    found = _MESSAGE.match(str(error)) if isinstance(error, NotImplementedError) else None
    return None if found is None else (found.group(1), found.group(2))


def message(error: BaseException) -> str | None:
    """The line a stub's error is shown as; None for any other error."""
    found = stub_of(error)
    if found is None:
        return None
    number, title = found
    lab = f"{int(number.split('.')[0]):02d}"
    return (f"NotImplementedError: this cell needs Exercise {number} ({title}), which is not written yet. "
            f"Write it in lab {lab}'s notebook, under '## Exercise {number}', run that cell, then run this "
            f"one again.")


def _show(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> Any:
    line = message(value)
    if line is None:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    shell._showtraceback(etype, value, [line])
    return [line]


def install() -> bool:
    """Show stubs' errors as one line in this IPython kernel; False (nothing done) outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "_showtraceback"):
        return False
    shell.set_custom_exc((NotImplementedError,), _show)
    return True
