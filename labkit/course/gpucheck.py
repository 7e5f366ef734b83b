"""`python -m labkit gpu-check`: the GPU-only tests, the benchmarks and every lab, each row in a process of its own.

Everything is sized as on a card with 16 GiB free (`--memory`, or $LABKIT_GPU_MEMORY, which also caps the
allocator), so it checks the sizes a T4 would get. The rows (labkit.course.gpurows.ROWS) run one after another in
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

from labkit.course.gpurows import DEFAULT, ROWS, Row, spec_for  # noqa: F401  (spec_for: the tests' and notes')

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "gpu"


def row_command(key: str, out: Path) -> list[str]:
    """The child process that measures row `key` into the file `out`."""
    return [sys.executable, "-m", "labkit.course.gpurows", key, str(out)]


def stem(device: str, memory: str, torch_version: str, today: str, folder: Path) -> Path:
    """docs/gpu/<card>-<memory>-torch<version>-<date>[-n]: a second run on a day never overwrites the first."""
    import re

    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    base = f"{slug}-{memory.lower()}-torch{torch_version.split('+')[0]}-{today}"
    folder.mkdir(parents=True, exist_ok=True)
    return next(p for n in range(1, 1000) if not (p := folder / (base + (f"-{n}" if n > 1 else ""))).exists()
                and not _with(p, ".json").exists() and not _with(p, ".jsonl").exists())


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
        start = time.monotonic()
        proc = self.child = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=allowed)
        except subprocess.TimeoutExpired:
            end_tree(proc)
            return Row(key, f"cut at its time limit, {allowed:.0f} s", "finishes in its limit", False,
                       seconds=round(time.monotonic() - start, 1))
        finally:
            self.child = None
        if not out.exists() or not out.read_text():
            return Row(key, f"its process exited with code {proc.returncode} and wrote no row", "runs", False,
                       seconds=round(time.monotonic() - start, 1))
        found = json.loads(out.read_text())
        found["seconds"] = round(time.monotonic() - start, 1)  # the process's start included
        return Row(**found)

    def interrupted(self, key: str | None) -> None:
        """SIGTERM: end the running row's processes, record it, write the summary."""
        if self.child is not None:
            end_tree(self.child)
        if key is not None:
            self.add(Row(key, "interrupted (SIGTERM) while running", "runs", False))
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

    def on_term(signum: int, frame: Any) -> None:
        run.interrupted(current[0])
        sys.exit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with tempfile.TemporaryDirectory(prefix="gpucheck-") as tmp:
            for key in keys:
                current[0] = key
                out = Path(tmp) / f"{key}.json"
                limit = (limits or {}).get(key, ROWS[key][1] if key in ROWS else 60)
                row = run.measure(key, command(key, out), out, limit)
                row.key = key
                run.add(row)
                current[0] = None
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(memory: str | None = None, seconds: float = 480, only: Sequence[str] = ()) -> int:
    """Run the rows `only` (default: DEFAULT) as on a card with `memory` free (default: $LABKIT_GPU_MEMORY, else
    16GiB) within `seconds`; print the table last; exit 1 if any row failed."""
    import datetime

    import torch

    unknown = [k for k in only if k not in ROWS]
    if unknown:
        print(f"labkit gpu-check: unknown row(s) {', '.join(unknown)}; choose among {', '.join(ROWS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("labkit gpu-check: torch sees no CUDA device; nothing to run here (the CPU suite is `make test`).")
        return 0
    memory = memory or os.environ.get("LABKIT_GPU_MEMORY") or "16GiB"
    os.environ.update(LABKIT_GPU_MEMORY=memory, LABKIT_PROFILE="gpu")  # the rows, the pytest and the lab kernels
    device, today = torch.cuda.get_device_name(), datetime.date.today().isoformat()
    print(f"labkit gpu-check on {device} with torch {torch.__version__}, sized as on a card with {memory} free; "
          f"{seconds:.0f} s in all", flush=True)
    from labkit.env.doctor import doctor

    doctor()
    header = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "date": today,
              "memory": memory, "rows_asked": list(only or DEFAULT), "seconds_allowed": seconds}
    run = Run(stem(device, memory, torch.__version__, today, FOLDER), header, time.monotonic() + seconds)
    run_rows(list(only or DEFAULT), run)
    run.finish()
    return 0 if all(r.ok for r in run.rows) else 1
