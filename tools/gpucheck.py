"""`python -m labkit gpu-check` (that is, `python tools/gpucheck.py`): the GPU-only tests, the benchmarks and every
lab, each row in a process of its own. A maintainers' tool of the kit's checkout (it runs tests/ and writes
docs/gpu/), not part of the package students and instructors install.

Everything is sized as on a card with 16 GiB free (`--memory`, or $LABKIT_GPU_MEMORY, which also caps the
allocator), so it checks the sizes a T4 would get. The rows (tools/gpurows.py, ROWS) run one after another in
order of importance, each in a child process with its own time limit, all within `--seconds` (480 by default, so a
run fits a device lease of 15 minutes, start-up included): a row cut by its limit, or not started for want of time,
is a failed row that says so. After each row one JSON line is written and flushed to docs/gpu/<card>-<memory>-
torch<version>-<date>.jsonl, so a run that is killed keeps what it measured; SIGTERM ends the running row's processes,
records it as interrupted and writes the summary. At the end: the table, and the whole run as <same name>.json.
`--only KEY...` reruns some rows (`--list` names them). Without CUDA it says so and exits 0: the GPU code paths are
unit-tested on CPU as far as a CPU allows.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[1:1] = [p for p in (str(HERE), str(ROOT)) if p not in sys.path]  # gpurows beside it; the checkout's labkit

from gpurows import DEFAULT, ROWS, Row  # noqa: E402
from labkit.env import variables  # noqa: E402

FOLDER = ROOT / "docs" / "gpu"


def row_command(key: str, out: Path) -> list[str]:
    """The child process that measures row `key` into the file `out`."""
    return [sys.executable, str(HERE / "gpurows.py"), key, str(out)]


def stem(device: str, memory: str, torch_version: str, today: str, folder: Path) -> Path:
    """docs/gpu/<card>-<memory>-torch<version>-<date>[-n]: a second run on a day never overwrites the first."""
    import re

    slug = lambda text: re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")  # noqa: E731
    base = f"{slug(device)}-{slug(memory)}-torch{torch_version.split('+')[0]}-{today}"
    folder.mkdir(parents=True, exist_ok=True)
    n = 1
    while _with(folder / _numbered(base, n), ".json").exists() or _with(folder / _numbered(base, n), ".jsonl").exists():
        n += 1
    return folder / _numbered(base, n)


def _numbered(base: str, n: int) -> str:
    """The n-th run of a day: base, base-2, base-3, ..."""
    return base if n == 1 else f"{base}-{n}"


def _with(path: Path, suffix: str) -> Path:
    """`path` with `suffix` added (not replaced: "torch2.11.0-2026-12-04" has dots of its own)."""
    return path.parent / (path.name + suffix)


class Run:
    """One gpu-check run: rows measured in child processes, each appended to the JSON lines file as it ends."""

    def __init__(self, path: Path, header: dict[str, Any], deadline: float) -> None:
        self.path, self.header, self.deadline = path, header, deadline
        self.rows: list[Row] = []
        self.child: subprocess.Popen | None = None
        self.start = time.monotonic()
        self.lines: TextIO = _with(path, ".jsonl").open("a")
        self._write({"header": header})

    def _write(self, obj: dict[str, Any]) -> None:
        self.lines.write(json.dumps(obj) + "\n")
        self.lines.flush()
        os.fsync(self.lines.fileno())

    def add(self, row: Row) -> None:
        """Keep `row` and write its line now."""
        self.rows.append(row)
        self._write(dataclasses.asdict(row))
        mark = "ok" if row.ok else "FAILED"
        print(f"gpu-check row {mark}: {row.name}: {row.value} ({row.seconds:.0f} s)", flush=True)

    def measure(self, key: str, command: list[str], out: Path, limit: float) -> Row:
        """Run `command` (which writes row `key` to `out`) with `limit` seconds; its row, or why there is none."""
        left = self.deadline - time.monotonic()
        if left < 10:
            return Row(key, f"not run: out of time ({max(0, left):.0f} s of the run's limit left)", "runs", False)
        allowed = min(limit, left)
        which = "its time limit" if allowed == limit else "the run's time left"
        out.unlink(missing_ok=True)  # a row is what this child wrote, never an earlier one's
        start = time.monotonic()
        proc = self.child = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=allowed)
        except subprocess.TimeoutExpired:
            end_tree(proc)
            return Row(key, f"cut at {which}, {allowed:.0f} s", "finishes in its limit", False,
                       seconds=round(time.monotonic() - start, 1))
        except BaseException:  # Ctrl-C, or anything else: its own session would outlive this process
            end_tree(proc)
            raise
        finally:
            self.child = None
        if not out.exists() or not out.read_text():
            return Row(key, f"its process exited with code {proc.returncode} and wrote no row", "runs", False,
                       seconds=round(time.monotonic() - start, 1))
        found = json.loads(out.read_text())
        found["seconds"] = round(time.monotonic() - start, 1)  # the process's start included
        return Row(**found)

    def interrupted(self, key: str | None, why: str = "SIGTERM") -> None:
        """A signal: end the running row's processes, record it, write the summary."""
        if self.child is not None:
            end_tree(self.child)
        if key is not None:
            self.add(Row(key, f"interrupted ({why}) while running", "runs", False, key=key))
        self.finish()

    def finish(self) -> Path:
        """The whole run as one JSON file beside the lines; the table printed."""
        seconds = time.monotonic() - self.start
        summary = {**self.header, "seconds": round(seconds, 1), "ok": bool(self.rows) and all(r.ok for r in self.rows),
                   "rows": [dataclasses.asdict(r) for r in self.rows]}
        out = _with(self.path, ".json")
        out.write_text(json.dumps(summary, indent=1) + "\n")
        self.lines.close()
        print_table(self.rows, seconds)
        print(f"written: {out} and {_with(self.path, '.jsonl').name} (commit them: measured figures on a real card)")
        return out


def end_tree(proc: subprocess.Popen) -> None:
    """End `proc` and every process under it (a lab's kernel runs in a session of its own): SIGTERM, a moment,
    then SIGKILL; reaped."""
    try:
        import psutil

        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - already gone, or no psutil: the process group is all there is
        tree = []
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for p in tree:
            try:
                p.send_signal(sig)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            if not any(_alive(p) for p in tree):
                return
        except subprocess.TimeoutExpired:
            continue


def _alive(p: Any) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:  # noqa: BLE001
        return False


def print_table(rows: Sequence[Row], seconds: float) -> None:
    """The summary table, last."""
    width = max([len(r.name) for r in rows] + [5])
    print(f"\nlabkit gpu-check summary ({seconds:.0f} s)")
    print(f"{'check':{width}}  ok    {'seconds':>7}  {'measured':60}  bar")
    for r in rows:
        print(f"{r.name:{width}}  {'yes' if r.ok else 'NO ':4}  {r.seconds:7.0f}  {r.value:60}  {r.bar}")


def run_rows(keys: Sequence[str], run: Run, command=row_command, limits: dict[str, float] | None = None) -> None:
    """Measure each row of `keys` in its own process, in order; SIGTERM handled (see Run.interrupted)."""
    current: list[str | None] = [None]
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # a lease ending, Ctrl-C, a closed terminal

    def on_signal(signum: int, frame: Any) -> None:
        for sig in signals:  # a second signal must not re-enter while the first writes the record
            signal.signal(sig, signal.SIG_IGN)
        run.interrupted(current[0], signal.Signals(signum).name)
        sys.exit(128 + signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        with tempfile.TemporaryDirectory(prefix="gpucheck-") as tmp:
            for n, key in enumerate(keys):
                current[0] = key
                out = Path(tmp) / f"{n}-{key}.json"
                limit = (limits or {}).get(key, ROWS[key][1] if key in ROWS else 60)
                row = run.measure(key, command(key, out), out, limit)
                row.key, current[0] = key, None  # measured: a signal from here on interrupts no row
                run.add(row)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _in_child(code: str) -> str:
    """What `code` prints, run by this Python in a process of its own (its stderr passed through)."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout


def main(memory: str | None = None, seconds: float = 480, only: Sequence[str] = ()) -> int:
    """Run the rows `only` (default: DEFAULT) as on a card with `memory` free (default: $LABKIT_GPU_MEMORY, else
    16GiB) within `seconds`; print the table last; exit 1 if any row failed."""
    import datetime

    import torch

    unknown = [k for k in only if k not in ROWS]
    if unknown:
        print(f"labkit gpu-check: unknown row(s) {', '.join(unknown)}; choose among {', '.join(ROWS)}", file=sys.stderr)
        return 2
    if len(set(only)) != len(only):
        print(f"labkit gpu-check: --only names a row twice: {' '.join(only)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():  # asks the driver; creates no CUDA context
        print("labkit gpu-check: torch sees no CUDA device; nothing to run here (the CPU suite is `make test`).")
        return 0
    memory = memory or variables.read(variables.GPU_MEMORY) or "16GiB"
    variables.set_gpu_run(memory)  # the rows, the pytest and the lab kernels inherit it
    # the device's name and the doctor from a child: a CUDA context in this process would sit beside every row's
    device = _in_child("import torch; print(torch.cuda.get_device_name())").strip() or "unknown GPU"
    today = datetime.date.today().isoformat()
    print(f"labkit gpu-check on {device} with torch {torch.__version__}, sized as on a card with {memory} free; "
          f"{seconds:.0f} s in all", flush=True)
    print(_in_child("from labkit.env.doctor import doctor; doctor()"), flush=True)
    header = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "date": today,
              "memory": memory, "rows_asked": list(only or DEFAULT), "seconds_allowed": seconds}
    run = Run(stem(device, memory, torch.__version__, today, FOLDER), header, time.monotonic() + seconds)
    run_rows(list(only or DEFAULT), run)
    run.finish()
    return 0 if all(r.ok for r in run.rows) else 1


def cli(argv: list[str] | None = None) -> int:
    """`python -m labkit gpu-check [--memory M] [--seconds S] [--only ROW...] [--list]`: parse, then run."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m labkit gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", help="size everything as on a card with this much free "
                                         "(default: $LABKIT_GPU_MEMORY, else 16GiB)")
    parser.add_argument("--seconds", type=float, default=480, help="time for the whole run; rows not started by "
                                                                   "then fail as not run (480)")
    parser.add_argument("--only", nargs="+", metavar="ROW", help="run only these rows, in this order (see --list)")
    parser.add_argument("--list", action="store_true", help="name the rows and their time limits, then exit")
    args = parser.parse_args(argv)
    if args.list:
        for key, (_, limit) in ROWS.items():
            print(f"{key:10} limit {limit:4.0f} s{'' if key in DEFAULT else '  (only when asked: --only ' + key + ')'}")
        return 0
    return main(args.memory, args.seconds, args.only or ())


if __name__ == "__main__":
    sys.exit(cli())
