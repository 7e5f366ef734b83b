"""The box one submission runs in: bubblewrap, as a user of its own without privileges, the network off, the
grader's files out of reach, every writable place small.

- **Who**: run by root, the box's processes are a uid of their own (``BOX_UID`` + the job slot: two boxes that run
  at once cannot signal or trace each other), set by setpriv before bwrap, where that uid can read the Python
  environment; where it cannot (an interpreter under root's home), the box keeps root's uid outside and is
  uid 65534 inside, with no capabilities. Either way, inside, a user namespace that can make no other
  (``--disable-userns``) and no capabilities (``--cap-drop ALL``): mounts cannot be undone, `/` cannot be
  remounted, nothing outside /tmp can be written, and the box sees no process but its own. Run by another user,
  the box is that user, without capabilities all the same. ``identity()`` says which.
- **What it sees**: the whole system read-only; the kit's folder (solutions and reference answers), the grader's
  home and the folders of the submissions and of the gradebook each covered by an empty read-only folder; the
  Python environment bound back read-only where a cover hid it (the covers are small tmpfs folders, made
  read-only once the environment is bound inside them); the kit's package a copy of the graded kit (the
  reference answers of the graded lab and later ones left out), read-only; the job the grader built, read-only.
- **Where it writes**: only /tmp, a tmpfs of ``TMP_BYTES``.
- **What it may use**: the judge (judge.py) watches the box's processes from outside and kills the box past its
  memory or process limit; the worker caps a file's size and each exercise's address space.
"""
from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BOX_UID = 61000  # the first uid of the boxes when the grader runs as root (one per job slot)
TMP_BYTES = 256 * 2**20  # /tmp in the box, in memory: what a submission may write in all
INNER_JOB = "/tmp/job.json"  # where the box sees the grader's job (a read-only file on its tmpfs)
COVER_BYTES = 1 << 16  # a cover over a hidden folder: an empty tmpfs, read-only once the binds inside it are made


def bwrap() -> str | None:
    """The bubblewrap executable, or None when it is not installed (Debian: apt-get install bubblewrap)."""
    return shutil.which("bwrap")


def _privileged() -> bool:
    return os.geteuid() == 0


_BWRAP = ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent"]


def _setpriv(slot: int) -> list[str]:
    uid = BOX_UID + slot
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--no-new-privs"]


@functools.cache
@functools.cache
def identity() -> str:
    """Who the boxes run as: "own uid" (root drops to BOX_UID + slot), "root without capabilities" (root, whose
    Python environment another uid cannot read), or "the grader's user" (not root)."""
    if not _privileged():
        return "the grader's user"
    probe = [bwrap() or "bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *_BWRAP, sys.executable,
             "-c", "import torch"]
    return "own uid" if subprocess.run(_setpriv(0) + probe, capture_output=True).returncode == 0 else \
        "root without capabilities"


def _user(slot: int) -> list[str]:
    """The command prefix that drops root for the box's own uid (none when the grader is not root, or that uid
    cannot read the Python environment)."""
    return _setpriv(slot) if identity() == "own uid" else []


def unusable() -> str | None:
    """Why the box cannot be made here (bubblewrap missing, too old, no user namespaces, no setpriv for root),
    or None when it can."""
    if bwrap() is None:
        return "bubblewrap (bwrap) is not installed: labkit grade runs each submission in it " \
               "(Debian/Ubuntu: apt-get install bubblewrap)"
    if _privileged() and shutil.which("setpriv") is None:
        return "run as root, labkit grade drops to a uid of its own with setpriv (util-linux), which is not installed"
    probe = subprocess.run(_user(0) + [bwrap(), "--ro-bind", "/", "/", *_BWRAP, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bubblewrap cannot make the box here ({probe.stderr.strip()[:200]}); it needs bubblewrap 0.8 " \
               "or newer and user namespaces"
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@dataclass
class Box:
    """What every box of one grading run shares."""

    package: Path  # where labkit is imported from (a copy of the graded kit is bound here)
    hidden: list[Path]  # folders covered by empty ones
    env: dict[str, str]

    @classmethod
    def make(cls, package: Path, hidden: list[Path], threads: int, profile: str) -> "Box":
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
               "LABKIT_PROFILE": profile, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
               "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/home/.matplotlib", "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        resolved = sorted({p.resolve() for p in hidden if p.exists()}, key=lambda p: len(p.parts))
        return cls(package.resolve(), resolved, env)

    def restores(self) -> list[Path]:
        """Paths the Python environment needs that a cover hides: bound back read-only."""
        needed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
        user = Path(site.getusersitepackages())
        if str(user) in sys.path and user.is_dir():
            needed.add(user.resolve())
        needed.add(Path(sys.executable).resolve().parent)
        kit = self.package.parent
        return sorted((p for p in needed if not _inside(kit, p) and any(_inside(p, h) for h in self.hidden + [Path("/tmp")])),
                      key=lambda p: len(p.parts))

    def argv(self, kit: Path, job: Path, slot: int, inner: list[str]) -> list[str]:
        """The command line running `inner` in a box: `kit` (a copy of the package) bound read-only as the package,
        `job` read-only at INNER_JOB."""
        args = [bwrap() or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
        for sockets in ("/run", "/var/run"):  # the host's sockets (D-Bus, docker): read-only does not stop connect()
            if os.path.isdir(sockets) and not os.path.islink(sockets):
                args += ["--tmpfs", sockets]
        for hidden in self.hidden:
            args += ["--size", str(COVER_BYTES), "--tmpfs", str(hidden)]
        for path in self.restores():
            args += ["--ro-bind", str(path), str(path)]
        args += ["--ro-bind", str(kit), str(self.package)]
        for hidden in self.hidden:
            args += ["--remount-ro", str(hidden)]
        args += ["--ro-bind", str(job), INNER_JOB, "--dir", "/tmp/home",
                 "--chdir", "/tmp", *_BWRAP, "--new-session", "--clearenv"]
        if identity() == "root without capabilities":
            args += ["--uid", "65534", "--gid", "65534"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        return _user(slot) + args + ["--"] + inner


class Cgroups:
    """Limits on the whole box, kept by the kernel where the grader may make control groups (root, cgroup v1's pids
    and memory hierarchies, or v2 with those controllers): no more than `processes` tasks and `memory` bytes for
    every process of the box together. Where it may not, the judge's Watch polls the same limits from outside."""

    V1 = Path("/sys/fs/cgroup")

    def __init__(self, name: str, processes: int, memory: int) -> None:
        self.groups: list[Path] = []
        for controller, files in (("pids", {"pids.max": processes}),
                                  ("memory", {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory})):
            base = self.V1 / controller
            if not (base / "cgroup.procs").is_file() or not os.access(base, os.W_OK):
                continue
            group = base / name
            try:
                group.mkdir()
                for key, value in files.items():
                    if (group / key).exists():
                        (group / key).write_text(str(value))
            except OSError:
                continue
            self.groups.append(group)

    @property
    def active(self) -> bool:
        return bool(self.groups)

    def entering(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into every group, so the box's first process (and so each
        process it makes) is counted from its start; adding bwrap's pid after it started would miss the children it
        forks at once."""
        if not self.groups:
            return argv
        enter = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 111; shift; n=$((n-1)); done;'
                 ' exec "$@"')
        return ["/bin/sh", "-c", enter, "sh", str(len(self.groups)), *map(str, self.groups), *argv]

    def hits(self) -> list[str]:
        """Which limit the box ran into, as the kernel counted: "its process limit", "its memory limit"."""
        found = []
        for group in self.groups:
            for name, marker, what in (("pids.events", "max", "its process limit"),
                                       ("memory.oom_control", "oom_kill", "its memory limit")):
                try:
                    counts = dict(line.split() for line in (group / name).read_text().splitlines() if line.strip())
                except (OSError, ValueError):
                    continue
                if int(counts.get(marker, 0)):
                    found.append(what)
        return found

    def remove(self) -> None:
        """Remove the groups, once the box's last process is gone (the kernel reaps them a moment after bwrap)."""
        for group in self.groups:
            for _ in range(40):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def kept_by() -> str:
    """Who keeps each box's memory and process limits: "the kernel (cgroups)" where the grader may make control
    groups, else "a watch from outside (polled)"."""
    probe = Cgroups(f"labkit-probe-{os.getpid()}", 1, 2**20)
    probe.remove()
    return "the kernel (cgroups)" if probe.active else "a watch from outside (polled)"
