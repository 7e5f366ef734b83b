"""Inside the sandbox: run one rebuilt notebook cell by cell and report what each cell did, nothing more.

`python labkit/course/grade/worker.py NOTEBOOK --fd N --cell-timeout S --executed OUT` (run by its path: it imports
neither labkit nor torch, only nbclient; the kernel does the rest) writes one JSON line per code
cell to file descriptor N, a pipe only this process holds (the kernel it starts does not inherit it, so
student code cannot write to it): the cell's index, status (`ok`, `error`, `timeout`, `dead`), the error's
name and value, its stdout, and seconds. The grader outside the sandbox turns these into grades.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _error(cell: nbformat.NotebookNode) -> tuple[str, str]:
    for o in cell.outputs:
        if o.output_type == "error":
            return o.ename, o.evalue
    return "", ""


def run(path: Path, report, cell_timeout: float, executed: Path | None) -> None:
    """Execute `path` in its folder, reporting each code cell to `report` (a text file)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=False,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(path.parent)}})
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                start, status = time.monotonic(), "ok"
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError:
                    status = "error"
                except CellTimeoutError:
                    status = "timeout"
                except DeadKernelError:
                    status = "dead"
                seconds = time.monotonic() - start
                ename, evalue = _error(cell)
                if seconds >= cell_timeout and (status == "error" or ename == "KeyboardInterrupt"):
                    status = "timeout"  # nbclient interrupted it (KeyboardInterrupt, or what the code made of it)
                report.write(json.dumps({"cell": index, "status": status, "ename": ename, "evalue": evalue[:2000],
                                         "stdout": _stdout(cell)[-4000:], "seconds": round(seconds, 2)}) + "\n")
                report.flush()
                if status == "dead":
                    break
        report.write(json.dumps({"done": True}) + "\n")  # the grader trusts the lines only with this one last
        report.flush()
    finally:
        if executed is not None:
            nbformat.write(nb, executed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit/course/grade/worker.py")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--cell-timeout", type=float, required=True)
    parser.add_argument("--executed", type=Path)
    parser.add_argument("--memory", type=int, help="bytes of address space for this process and the kernel")
    args = parser.parse_args(argv)
    if args.memory:
        resource.setrlimit(resource.RLIMIT_AS, (args.memory, args.memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**30, 2**30))  # no file over 1 GiB: the host's disk is not theirs
    # Not dumpable: the kernel (same user, same box) may not open this process's /proc/PID/fd, so it cannot
    # write to the report pipe. PR_SET_DUMPABLE is 4.
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    with os.fdopen(args.fd, "w") as report:
        run(args.notebook, report, args.cell_timeout, args.executed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
