"""A box's memory counted wherever it is held, and its CPU share kept (labkit/course/grade/watch.py, sandbox.py).

Each test runs a planted hog in a real box (bubblewrap, as `labkit grade` makes it) twice: watched from outside
alone, as when the grader may make no control group (an ordinary user, cgroup v2 only), and in control groups that
the kernel keeps (root, cgroup v1, as here), the watch's limits out of the way. The hogs hold 224 MiB against a
limit of 128 MiB, much of it in memory no process's Pss shows (a memfd written, never mapped; a file in the box's
/dev/shm; one in its /tmp), and the box must be ended for it; memory held once but seen twice (a memfd both open and
mapped, a /dev/shm file mapped) must not end a box under its limit; spinners past a box's CPU share are held to it.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from labkit.course.grade import sandbox
from labkit.course.grade.watch import BURST, POLL, Watch

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))
MiB = 2**20
LIMIT = 128 * MiB  # the box's memory
HOG = 224 * MiB  # what a hog holds: well over LIMIT, and under the size of the box's /tmp and /dev/shm
assert LIMIT < HOG < sandbox.TMP_BYTES
PROCESSES = 64

# what each hog does with `n` bytes, then it says "held" and sleeps: the box must be ended before it wakes
HOGS = {
    "memfd": "fd = os.memfd_create('hog')\nfor _ in range(n // MiB): os.write(fd, b'x' * MiB)",
    "dev_shm": "f = open('/dev/shm/hog', 'wb')\nfor _ in range(n // MiB): f.write(b'x' * MiB)\nf.flush()",
    "tmp": "f = open('/tmp/hog', 'wb')\nfor _ in range(n // MiB): f.write(b'x' * MiB)\nf.flush()",
    "dev_shm_deleted": "f = open('/dev/shm/hog', 'wb')\nos.unlink('/dev/shm/hog')\n"
                       "for _ in range(n // MiB): f.write(b'x' * MiB)\nf.flush()",
    "shared_anonymous": "m = mmap.mmap(-1, n)\nfor i in range(0, n, 4096): m[i] = 1",
    "memfd_mapped_closed": "fd = os.memfd_create('hog')\nos.ftruncate(fd, n)\nm = mmap.mmap(fd, n)\nos.close(fd)\n"
                           "for i in range(0, n, 4096): m[i] = 1",
}
# held once, mapped too: counted once (a box under its limit lives)
ONCE = {
    "memfd_open_and_mapped": "fd = os.memfd_create('hog')\nos.ftruncate(fd, n)\nm = mmap.mmap(fd, n)\n"
                             "for i in range(0, n, 4096): m[i] = 1",
    "dev_shm_mapped": "f = open('/dev/shm/hog', 'w+b')\nf.truncate(n)\nm = mmap.mmap(f.fileno(), n)\n"
                      "for i in range(0, n, 4096): m[i] = 1",
}


def _program(body: str, n: int, seconds: float) -> str:
    return (f"import mmap, os, sys, time\nMiB = 2**20\nn = {n}\n{body}\nprint('held', flush=True)\n"
            f"time.sleep({seconds})\nprint('woke', flush=True)\n")


@functools.cache
def _kit() -> Path:
    """A copy of the kit's package where the box's uid can read it, as the grader copies it (a checkout in a
    folder only root may enter, `mktemp -d`'s 0700, is no package a box can bind)."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-test-kit-"))
    folder.chmod(0o755)
    atexit.register(shutil.rmtree, folder, True)
    shutil.copytree(ROOT / "labkit", folder / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    return folder / "labkit"


def _box(inner: list[str]) -> list[str]:
    """The command line of a box as the grader makes it (a copy of the kit's package as its kit), running `inner`."""
    box = sandbox.Box.make(_kit(), [ROOT], 1, "tiny")
    job = Path(tempfile.mkstemp(suffix=".json")[1])
    job.write_text(json.dumps({}))
    job.chmod(0o644)
    return box.argv(_kit(), job, 0, inner)


def _run(program: str, memory: int, cgroups: bool,
         cpus: float | None = None) -> tuple[subprocess.Popen, Watch, list[str], str]:
    """Run `program` in a box, watched (limits `memory` and `cpus`) or, with `cgroups`, in control groups the kernel
    keeps (the watch's memory limit out of the way); (the box, its watch, the limits the kernel saw hit, what the
    program printed)."""
    groups = sandbox.Cgroups(f"labkit-test-{os.getpid()}-{time.monotonic_ns()}", PROCESSES, memory, cpus) \
        if cgroups else None
    if cgroups and not (groups.keeps("memory") and (cpus is None or groups.keeps("cpu"))):
        groups.remove()
        pytest.skip("no control groups here (root with cgroup v1's memory and cpu hierarchies)")
    argv = _box([sys.executable, "-c", program])
    proc = subprocess.Popen(groups.entering(argv) if groups else argv, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    watch = Watch(proc, 2**40 if cgroups else memory, PROCESSES,
                  None if groups is not None and groups.keeps("cpu") else cpus)
    try:
        proc.wait(timeout=120)
    finally:
        watch.kill()
        watch.stop()
    hits = groups.hits() if groups else []
    if groups:
        groups.remove()
    return proc, watch, hits, proc.stdout.read()


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("cgroups", [False, True], ids=["watched", "cgroups"])
@pytest.mark.parametrize("hog", HOGS)
def test_a_box_holding_more_than_its_limit_anywhere_is_ended(hog, cgroups):
    proc, watch, hits, said = _run(_program(HOGS[hog], HOG, 30), LIMIT, cgroups)
    assert "woke" not in said and proc.returncode != 0, (said, proc.returncode)
    if cgroups:
        assert "its memory limit" in hits, hits
    else:
        assert watch.why.startswith("memory over the box's limit"), (watch.why, said)


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("hog", ONCE)
def test_memory_held_once_and_mapped_too_is_counted_once(hog):
    """0.6 of the limit in a memfd or a /dev/shm file that is also mapped: its pages are in the file and in the
    process's Pss; counted twice, the box would be ended at 1.2 of its limit."""
    proc, watch, _, said = _run(_program(ONCE[hog], 6 * LIMIT // 10, 2), LIMIT, cgroups=False)
    assert "woke" in said and proc.returncode == 0 and watch.why == "", (said, watch.why)


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("cgroups", [False, True], ids=["watched", "cgroups"])
def test_a_box_is_held_to_its_cpu_share(cgroups):
    """Three processes spinning for 10 s in a box with a share of 0.02 CPU: together they use at most that share of
    the box's time and one burst (the watch's ``BURST``, and what three processes spin in one ``POLL`` before it
    looks), where unheld they use several CPU-seconds (each says its own, process_time), even on a machine as
    loaded as this one gets (a box's session is its own autogroup: about one CPU over the sessions that run)."""
    spin = ("import os, time\nend = time.time() + 10\nfor _ in range(2):\n    if os.fork() == 0: break\n"
            "while time.time() < end: pass\nprint('spun', time.process_time(), flush=True)\n")
    start = time.monotonic()
    proc, watch, _, said = _run(spin, 2**31, cgroups, cpus=0.02)
    wall = time.monotonic() - start
    used = sum(float(line.split()[1]) for line in said.splitlines() if line.startswith("spun"))
    assert said.count("spun") == 3 and proc.returncode == 0, (said, proc.returncode)
    assert used <= 0.02 * wall + BURST + 3 * POLL + 0.5, (used, wall)
    if not cgroups:
        assert watch.stops > 0
