"""A box's processes watched from outside it (judge.py): the memory they hold, how many they are, the CPU they
take. The box is killed past its memory or process limit, and stopped for a while past its CPU share.

**Memory is counted wherever the box holds it**, with or without a memory cgroup (sandbox.Cgroups, kept by the
kernel where the grader may make one), as the sum of:

- each process's proportional set size (Pss: a page shared with its forks counted once among them), less the
  shared memory it maps that is counted below;
- the box's own tmpfs folders (its /tmp, its /dev/shm, where POSIX shared memory lives, bwrap's /dev): what each
  holds, files deleted but still open included, as statvfs sees it from inside the box (/proc/PID/root); a tmpfs is
  the box's where the judge's own mount namespace has no such file system;
- the memfds its processes hold open (memory that is a file in no folder), each once;
- what is left of its shared mappings (a shared anonymous mapping, a memfd whose descriptor was closed): their Pss,
  from /proc/PID/smaps, read only for a process that maps shared memory.

It does not see System V shared memory that no process maps (the box's IPC namespace is its own, and reading it
from outside needs privileges), nor a memfd in flight in a socket; a memory cgroup counts those too.

**A CPU share** (`cpus`: the grader's share of the machine, its cores over --jobs) that the box cannot exceed: where
the kernel keeps a cpu cgroup for the box (sandbox.Cgroups: cpu.cfs_quota_us) it enforces it; otherwise this watch
does. Every poll it sums the CPU time of the box's processes (/proc/PID/stat: their own and that of the children
they reaped) and, once the box has run more than its share since it started plus ``BURST`` CPU-seconds ahead, it
stops every process of the box (SIGSTOP, which no process can catch) until its share has caught up, then lets them
go on (SIGCONT). It does not bound what a box uses within one poll (``POLL``: at most the machine's cores for that
long), nor the kernel's work on the box's behalf that no process of it is charged for.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

__all__ = ["POLL", "BURST", "Watch"]

POLL = 0.2  # seconds between two looks at the box
BURST = 1.0  # CPU-seconds a box may run ahead of its share before it is stopped
_TICK = os.sysconf("SC_CLK_TCK")
_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ ([0-9a-f]+):([0-9a-f]+) (\d+)")  # an smaps header's dev, inode

Device = tuple[int, int]  # (major, minor)


def tmpfs_of(pid: int | str) -> list[tuple[Device, str]]:
    """The tmpfs file systems mounted in the mount namespace of process `pid`: (device, mount point)."""
    found = []
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            for line in f:
                mine, _, theirs = line.partition(" - ")
                fields = mine.split()
                if theirs.split()[:1] == ["tmpfs"] and len(fields) > 4:
                    major, minor = fields[2].split(":")
                    point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])  # \040: a space
                    found.append(((int(major), int(minor)), point))
    except (OSError, ValueError):
        pass
    return found


class Watch:
    """The box's processes, from outside: their memory and number, killed together when over a limit; stopped
    while past their CPU share (`cpus`, None: kept by the kernel, or none)."""

    def __init__(self, proc: subprocess.Popen, memory: int, processes: int, cpus: float | None = None) -> None:
        self.proc, self.memory, self.processes, self.cpus = proc, memory, processes, cpus
        self.why = ""  # why the box was killed, "" while it was not
        self.stops = 0  # how many times the box was stopped for its CPU share
        self._host = {device for device, _ in tmpfs_of("self")}  # the judge's tmpfs: never the box's
        self._boxes: dict[str, list[tuple[Device, str]]] = {}  # mount namespace -> the box's tmpfs in it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> dict[int, float]:
        """Every process of the box, with the CPU-seconds it and the children it reaped used."""
        children: dict[int, list[int]] = {}
        cpu: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        after = f.read().rsplit(b")", 1)[1].split()  # after the name: field 3 on
                    children.setdefault(int(after[1]), []).append(int(entry))
                    cpu[int(entry)] = sum(int(t) for t in after[11:15]) / _TICK  # utime stime cutime cstime
                except (OSError, ValueError, IndexError):
                    continue
        found, todo = {}, [self.proc.pid]
        while todo:
            pid = todo.pop()
            found[pid] = cpu.get(pid, 0.0)
            todo += children.get(pid, [])
        return found

    def _box_tmpfs(self, pid: int) -> list[tuple[Device, str]]:
        """The tmpfs of `pid`'s mount namespace that are the box's own (none in the judge's namespace)."""
        try:
            space = os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            return []
        if space not in self._boxes:  # once a poll for all the processes of one namespace (see held)
            self._boxes[space] = [(d, point) for d, point in tmpfs_of(pid) if d not in self._host]
        return self._boxes[space]

    def held(self, pids: list[int]) -> int:
        """Bytes the box's processes `pids` hold: see the module's note."""
        self._boxes.clear()  # each namespace's tmpfs read once a poll (a box's first poll can meet bwrap mid-setup)
        total, devices, memfds = 0, set(), set()
        for pid in pids:
            for device, point in self._box_tmpfs(pid):
                if device in devices:
                    continue
                try:
                    fs = os.statvfs(f"/proc/{pid}/root{point}")
                    if os.stat(f"/proc/{pid}/root{point}").st_dev != os.makedev(*device):
                        continue  # another mount on top of it: not the tmpfs seen
                except OSError:
                    continue
                devices.add(device)
                total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
            total += _memfds(pid, memfds)
        return total + sum(_pss(pid, devices, memfds) for pid in pids)

    def _run(self) -> None:
        credit, last = (BURST, None)
        while not self._stop.wait(POLL) and self.proc.poll() is None:
            tree = self._tree()
            pids = list(tree)
            held = self.held(pids)
            if held > self.memory or len(pids) > self.processes:
                self.why = (f"memory over the box's limit ({held / 2**30:.1f} GiB > {self.memory / 2**30:g} GiB)"
                            if held > self.memory else f"{len(pids)} processes, over the box's limit of "
                                                       f"{self.processes}")
                self.kill()
                return
            if self.cpus:
                now, used = time.monotonic(), sum(tree.values())
                if last is not None:
                    credit = min(BURST, credit + self.cpus * (now - last[0])) - max(0.0, used - last[1])
                last = (now, used)
                if credit < 0:
                    self._pause(-credit / self.cpus)
                    credit, last = 0.0, (time.monotonic(), sum(self._tree().values()))

    def _pause(self, seconds: float) -> None:
        """Stop every process of the box for `seconds` (those it forks meanwhile too), then let them go on."""
        stopped: set[int] = set()
        try:
            for _ in range(2):  # once more: a process forked while the others were being stopped
                for pid in set(self._tree()) - stopped:
                    _signal(pid, signal.SIGSTOP)
                    stopped.add(pid)
            self.stops += 1
            self._stop.wait(seconds)
        finally:
            for pid in stopped:
                _signal(pid, signal.SIGCONT)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _memfds(pid: int, seen: set[tuple[int, int]]) -> int:
    """Bytes of the memfds `pid` holds open that are not in `seen` (then added to it, by device and inode)."""
    total = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                continue
            info = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
    return total


def _pss(pid: int, tmpfs: set[Device], memfds: set[tuple[int, int]]) -> int:
    """The process's proportional set size (else its RSS), less its mappings of memory counted already: files of
    the box's tmpfs (`tmpfs`: their devices) and the memfds held open (`memfds`: device and inode)."""
    found = _rollup(pid)
    if found is None:
        try:
            with open(f"/proc/{pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0
    pss, shmem = found
    if not shmem:
        return pss
    counted = {(os.major(d), os.minor(d), i) for d, i in memfds} | {(*d, None) for d in tmpfs}
    twice, mapping = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                header = _MAPPING.match(line)
                if header:
                    device = (int(header[1], 16), int(header[2], 16))
                    mapping = (*device, None) in counted or (*device, int(header[3])) in counted
                elif mapping and line.startswith("Pss:"):
                    twice += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return max(0, pss - twice)


def _rollup(pid: int) -> tuple[int, int] | None:
    """(Pss, Pss_Shmem) in bytes from /proc/PID/smaps_rollup, or None where it cannot be read."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("Pss", "Pss_Shmem"):
                    fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return (fields["Pss"], fields.get("Pss_Shmem", 0)) if "Pss" in fields else None
