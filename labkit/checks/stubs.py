"""How a stub shows in a notebook: one line naming the exercise, not a traceback that looks like a bug.

The student generator (labkit.course.student) replaces each solution with
`raise NotImplementedError("Exercise N.M: title")`. A cell that uses an
answer not written yet runs into that stub; in a kernel, `import labkit`
registers a handler that prints what it is and what to do. The error stays
a NotImplementedError (Run All goes on past the cell's `raises-exception`
tag, and tests see the same exception); any other NotImplementedError gets
IPython's usual traceback.
"""
from __future__ import annotations

import re
from typing import Any

STUB = re.compile(r"^Exercise (\d+\.\d+): (.+)$")


def message(error: BaseException) -> str | None:
    """The line a stub's error is shown as; None for any other error."""
    found = STUB.match(str(error)) if isinstance(error, NotImplementedError) else None
    if found is None:
        return None
    number, title = found.groups()
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
