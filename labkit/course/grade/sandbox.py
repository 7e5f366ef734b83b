"""The box one submission runs in: bubblewrap, as a user of its own without privileges, the network off, the
grader's files out of reach, every writable place small.

- **Who**: run by root, the box's processes are a uid of their own (``BOX_UID`` + the job slot: two boxes that run
  at once cannot signal or trace each other), set by setpriv before bwrap, so that the host's permissions hold
  inside as for any other user (root-only files stay unreadable). A Python environment that uid cannot reach on
  the host (an interpreter under root's home, 0700) is first bound, by root, in a mount namespace of the box's
  own (``unshare``), onto an empty folder it can reach, and bwrap binds it back at its own path inside. Inside, a
  user namespace that can make no other (``--disable-userns``) and no capabilities (``--cap-drop ALL``): mounts
  cannot be undone, `/` cannot be remounted, nothing outside /tmp can be written, and the box sees no process
  but its own. Run by another user, the box is that user, without capabilities all the same. ``identity()`` says
  which; where root's box cannot run Python, ``unusable()`` says why and nothing is graded.
- **What it sees**: the whole system read-only; the kit's folder (solutions and reference answers), the grader's
  home and the folders of the submissions and of the gradebook each covered by an empty read-only folder; the
  Python environment bound back read-only where a cover hid it (the covers are small tmpfs folders, made
  read-only once the environment is bound inside them); the kit's package a copy of the graded kit (the
  reference answers of the graded lab and later ones left out), read-only; the job the grader built, read-only.
- **Where it writes**: only /tmp and /dev/shm (POSIX shared memory), each a tmpfs of ``TMP_BYTES``; /dev itself
  and /run are read-only (bwrap's own /dev and a cover over /run were tmpfs folders the box could fill without
  bound). A file the grader hides (its signing key, shards.py) is /dev/null to the box.
- **What it may use**: the judge (judge.py) watches the box's processes from outside and kills the box past its
  memory or process limit; the worker caps a file's size and each exercise's address space.
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.env import variables

BOX_UID = 61000  # the first uid of the boxes when the grader runs as root (one per job slot)
TMP_BYTES = 256 * 2**20  # /tmp in the box, in memory: what a submission may write in all
INNER_JOB = "/tmp/job.json"  # where the box sees the grader's job (a read-only file on its tmpfs)
COVER_BYTES = 1 << 16  # a cover over a hidden folder: an empty tmpfs, read-only once the binds inside it are made
BOX_OF = variables.BOX_OF  # set on a box's command line only: the pid namespace it was made from (worker.py, Reach)


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


def _python_paths() -> set[Path]:
    """The folders the Python environment runs from: its prefixes, the interpreter's folder, the user's site."""
    needed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    user = Path(site.getusersitepackages())
    if str(user) in sys.path and user.is_dir():
        needed.add(user.resolve())
    needed.add(Path(sys.executable).resolve().parent)
    return needed


def _closed(path: Path) -> Path | None:
    """The highest folder above or at `path` that a user of no group of its owner cannot enter (no o+x, or for
    `path` itself no o+rx), or None when any user reaches it (ACLs aside: the probe of ``identity`` runs it)."""
    for folder in [*reversed(path.parents), path]:
        need = stat.S_IXOTH | (stat.S_IROTH if folder == path else 0)
        if folder.stat().st_mode & need != need:
            return folder
    return None


@functools.cache
def _staged() -> tuple[tuple[Path, Path], ...]:
    """(a Python folder the box's uid cannot reach, an empty folder it can, where root binds it before dropping
    to that uid): none unless the grader is root. The empty folders are removed when the grader ends."""
    closed = sorted(p for p in _python_paths() if _privileged() and _closed(p) is not None)
    closed = [p for p in closed if not any(q != p and _inside(p, q) for q in closed)]  # inside another: bound with it
    if not closed:
        return ()
    stage = Path(tempfile.mkdtemp(prefix="labkit-python-"))
    stage.chmod(0o755)
    atexit.register(shutil.rmtree, stage, True)
    pairs = []
    for i, path in enumerate(closed):
        (stage / str(i)).mkdir(mode=0o755)
        pairs.append((path, stage / str(i)))
    return tuple(pairs)


_BIND = 'while [ "$1" != -- ]; do mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" || exit 112; shift 2; done; ' \
        'shift; exec "$@"'


def _user(slot: int) -> list[str]:
    """The command prefix that, run by root, binds the staged Python folders in a mount namespace of the box's
    own and drops to the box's uid; none when the grader is not root."""
    if not _privileged():
        return []
    staged = [str(p) for pair in _staged() for p in pair]
    unshare = [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
               _BIND, "sh", *staged, "--"] if staged else []
    return unshare + _setpriv(slot)


def _source(path: Path) -> Path:
    """Where bwrap, run as the box's uid, finds `path`: in its staged folder, if root staged it (or a folder
    above it)."""
    for closed, stage in _staged():
        if _inside(path, closed):
            return stage / path.relative_to(closed)
    return path


def _staged_binds(bound: Sequence[Path] = (), covered: Sequence[Path] = ()) -> tuple[list[str], list[Path]]:
    """bwrap's arguments that show each staged Python folder (but those in `bound`, bound already) at its own
    path inside the box, under an empty folder where the host's is closed to the box's uid (unless one of
    `covered` covers it already); and the empty folders they add."""
    args: list[str] = []
    covers: list[Path] = []
    for path, stage in _staged():
        if any(_inside(path, b) for b in bound):
            continue
        top = _closed(path)
        if top is not None and top != path and not any(_inside(top, c) for c in [*covered, *covers]):
            args += ["--size", str(COVER_BYTES), "--tmpfs", str(top)]
            covers.append(top)
        args += ["--ro-bind", str(stage), str(path)]
    return args, covers


@functools.cache
def identity() -> str:
    """Who the boxes run as: "own uid" (root drops to BOX_UID + slot), "the grader's user" (not root), or, where
    root's box cannot run Python (a folder of the environment closed to another uid below a place it reaches),
    "none: the box's uid cannot run Python" (``unusable`` refuses)."""
    if not _privileged():
        return "the grader's user"
    probe = [bwrap() or "bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *_staged_binds()[0],
             *_BWRAP, sys.executable, "-c", "import torch"]
    return "own uid" if subprocess.run(_user(0) + probe, capture_output=True).returncode == 0 else \
        "none: the box's uid cannot run Python"


def unusable() -> str | None:
    """Why the box cannot be made here (bubblewrap missing, too old, no user namespaces, no setpriv for root),
    or None when it can."""
    if bwrap() is None:
        return "bubblewrap (bwrap) is not installed: labkit grade runs each submission in it " \
               "(Debian/Ubuntu: apt-get install bubblewrap)"
    if _privileged() and shutil.which("setpriv") is None:
        return "run as root, labkit grade drops to a uid of its own with setpriv (util-linux), which is not installed"
    if not _pid_namespace():  # the box's worker is told it is one by this (worker.py, Reach); without it, it ends
        return "/proc/self/ns/pid cannot be read here (no /proc, or not Linux's): a box's worker could not be told " \
               "from a process outside any box"
    # the box itself first: where no box can be made (no user namespaces), identity()'s probe fails too
    probe = subprocess.run(_user(0) + [bwrap(), "--ro-bind", "/", "/", *_BWRAP, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return userns_off(probe.stderr) or \
            f"bubblewrap cannot make the box here ({probe.stderr.strip()[:200]}); it needs bubblewrap 0.8 or newer " \
            "and user namespaces"
    if identity().startswith("none"):
        return (f"run as root, labkit grade runs each box as uid {BOX_UID} and more, which cannot run this Python "
                f"({sys.executable}): make its environment readable by other users, or grade as another user")
    return None


# The settings that turn unprivileged user namespaces off, each with the value that turns them on: Debian's and
# Ubuntu's switch, the kernel's count (0: none), and Ubuntu 24.04's AppArmor restriction.
USERNS_SETTINGS = (("kernel.unprivileged_userns_clone", "0", "1"), ("user.max_user_namespaces", "0", "15000"),
                   ("kernel.apparmor_restrict_unprivileged_userns", "1", "0"))
# what bubblewrap says when it cannot make the user namespace or map the uid into it (bubblewrap.c); a mount or
# another step failing with "Operation not permitted" is another failure, reported as bwrap printed it
_USERNS_WORDS = ("new namespace", "user namespace", "uid map")


def _sysctl(name: str, root: Path = Path("/proc/sys")) -> str | None:
    try:
        return (root / name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def userns_off(stderr: str, proc_sys: Path = Path("/proc/sys")) -> str | None:
    """One line when bubblewrap failed for want of unprivileged user namespaces (its `stderr` says so): the setting
    that is off, or a container that forbids them, and what to do; None for any other failure."""
    if not any(word in stderr.lower() for word in _USERNS_WORDS):
        return None
    off = [(name, value, on) for name, value, on in USERNS_SETTINGS if _sysctl(name, proc_sys) == value]
    where = ", ".join(f"{name} is {value}" for name, value, _ in off) or \
        "kernel.unprivileged_userns_clone and user.max_user_namespaces allow them, so the container (a hub's pod: " \
        "its seccomp profile) forbids them"
    turn_on = " and ".join(f"sysctl -w {name}={on}" for name, _, on in off) or "a container that allows them"
    return (f"unprivileged user namespaces are off here ({where}; bwrap: {stderr.strip().splitlines()[-1][:120]}), "
            f"so bubblewrap cannot make a box: grade on another machine where they are on (a workstation or a CI "
            f"runner; as root on a host: {turn_on}), not in the hub's pods (docs/instructors.md, \"Where to grade\")")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@dataclass
class Box:
    """What every box of one grading run shares."""

    package: Path  # where labkit is imported from (a copy of the graded kit is bound here)
    hidden: list[Path]  # folders covered by empty ones, and files shown as /dev/null
    env: dict[str, str]

    @classmethod
    def make(cls, package: Path, hidden: list[Path], threads: int, profile: str) -> "Box":
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
               "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/home/.matplotlib", "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        env = variables.for_child(env, profile=profile)
        resolved = sorted({p.resolve() for p in hidden if p.exists()}, key=lambda p: len(p.parts))
        return cls(package.resolve(), resolved, env)

    def restores(self) -> list[Path]:
        """Paths the Python environment needs that a cover hides: bound back read-only (those staged by root
        from where it staged them)."""
        needed = _python_paths()
        kit = self.package.parent
        return sorted((p for p in needed if not _inside(kit, p) and any(_inside(p, h) for h in self.hidden + [Path("/tmp")])),
                      key=lambda p: len(p.parts))

    def argv(self, kit: Path, job: Path, slot: int, inner: list[str]) -> list[str]:
        """The command line running `inner` in a box: `kit` (a copy of the package) bound read-only as the package,
        `job` read-only at INNER_JOB."""
        args = [bwrap() or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--size", str(TMP_BYTES), "--tmpfs", "/dev/shm"]
        empty = [Path("/dev")]  # read-only once everything inside is mounted
        for sockets in ("/run", "/var/run"):  # the host's sockets (D-Bus, docker): read-only does not stop connect()
            if os.path.isdir(sockets) and not os.path.islink(sockets):
                args += ["--size", str(COVER_BYTES), "--tmpfs", sockets]
                empty.append(Path(sockets))
        for hidden in self.hidden:
            if hidden.is_dir():
                args += ["--size", str(COVER_BYTES), "--tmpfs", str(hidden)]
            elif not any(_inside(hidden, h) for h in self.hidden if h != hidden):  # a file (not covered already)
                args += ["--ro-bind", "/dev/null", str(hidden)]
        restored = self.restores()
        for path in restored:
            args += ["--ro-bind", str(_source(path)), str(path)]
        more, covers = _staged_binds(restored, self.hidden)
        args += more
        args += ["--ro-bind", str(kit), str(self.package)]
        for hidden in [*(h for h in self.hidden if h.is_dir()), *covers, *empty]:
            args += ["--remount-ro", str(hidden)]
        args += ["--ro-bind", str(job), INNER_JOB, "--dir", "/tmp/home",
                 "--chdir", "/tmp", *_BWRAP, "--new-session", "--clearenv"]
        for key, value in variables.for_child(self.env, box_of=_pid_namespace()).items():
            args += ["--setenv", key, value]
        return _user(slot) + args + ["--"] + inner


def _pid_namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]"); "" where /proc does not say (unusable() then refuses to
    make a box: its worker would take itself to be outside any box)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


class Cgroups:
    """Limits on the whole box, kept by the kernel where the grader may make control groups (root, with cgroup
    v1's pids, memory and cpu hierarchies): no more than `processes` tasks and `memory` bytes (its tmpfs and shared
    memory included: the kernel charges a page to the group that touched it) for every process of the box
    together, and `cpus` CPUs of time per period (CFS's quota). Where it may not (cgroup v2 only, too), the judge's
    Watch (watch.py) keeps the same limits from outside."""

    V1 = Path("/sys/fs/cgroup")
    PERIOD = 100_000  # microseconds: CFS's quota is `cpus` periods of CPU time in each

    def __init__(self, name: str, processes: int, memory: int, cpus: float | None = None) -> None:
        self.groups: list[Path] = []
        quota = {"cpu.cfs_period_us": self.PERIOD, "cpu.cfs_quota_us": max(1000, int((cpus or 0) * self.PERIOD))}
        for controller, files in [("pids", {"pids.max": processes}),
                                  ("memory", {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory}),
                                  *([("cpu", quota)] if cpus else [])]:
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

    def keeps(self, controller: str) -> bool:
        """Whether the kernel keeps this box's limit of `controller` ("pids", "memory", "cpu")."""
        return any(group.parent.name == controller for group in self.groups)

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

    @classmethod
    def remove_left(cls, prefix: str) -> None:
        """Remove the groups whose names start with `prefix` (those of a judge that was ended), once empty."""
        for controller in ("pids", "memory", "cpu"):
            base = cls.V1 / controller
            groups = sorted(base.glob(prefix + "*")) if base.is_dir() else []
            leftover = cls.__new__(cls)
            leftover.groups = [g for g in groups if g.is_dir()]
            leftover.remove()

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
