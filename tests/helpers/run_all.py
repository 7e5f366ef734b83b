"""Run All, as JupyterLab does it, on a student notebook: `python tests/helpers/run_all.py NOTEBOOK` (exit 1 on a problem).

nbclient stops at the first error of a cell without the `raises-exception` tag, as JupyterLab's Run All does;
LABKIT_CHECKS=show makes checkers report as they do in JupyterLab (printed, not raised). An untouched student
notebook must run to its last cell; its only errors are the stubs' NotImplementedError and the checkers'
"not attempted", every checker reports "not attempted", and no cell shows an object's repr.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from labkit import stubs

ALLOWED = ("NotImplementedError", "NotAttempted")
REPR = re.compile(r"<[\w.]+ (object )?at 0x[0-9a-fA-F]+>")  # <torch._C.Generator at 0x7f...>: a stray value
CHECKER = "lk.checks.ex_"


def problems(path: Path, timeout: int = 600) -> list[str]:
    """What keeps `path` from running to the end with only stub errors; empty when all is well.

    The kernel inherits this process's environment: set LABKIT_CHECKS=show first (`__main__` does)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    found = []
    try:
        client.execute()
    except CellExecutionError as e:
        found.append(f"Run All stopped: {str(e)[-800:]}")
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            if output.output_type == "error" and output.ename not in ALLOWED:
                found.append(f"cell {index}: {output.ename}: {output.evalue[:300]}")
            shown = stubs.message(NotImplementedError(output.get("evalue", "")))
            if output.output_type == "error" and output.ename == "NotImplementedError" and shown and \
                    output.traceback != [shown]:  # a stub shows as one line naming its exercise (labkit.stubs)
                found.append(f"cell {index}: a stub's error shown as a traceback: {output.traceback[:1]}")
        shown = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)
        stray = REPR.search(shown)
        if stray:
            found.append(f"cell {index} shows an object's repr, not a result: {stray.group(0)}")
        if CHECKER in cell.source:
            text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            if "not attempted" not in text:
                found.append(f"cell {index} (a checker) did not report 'not attempted': {text[:300]!r}")
    return found


if __name__ == "__main__":
    os.environ["LABKIT_CHECKS"] = "show"
    failures = problems(Path(sys.argv[1]))
    print("\n".join(failures) or f"{sys.argv[1]}: ran to the end; only stubs and 'not attempted'")
    sys.exit(1 if failures else 0)
