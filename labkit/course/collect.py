"""`python -m labkit collect 'HOMES_GLOB' --out returned/ [--labs 02]`: the students' notebooks, from their hub
homes into `returned/<name>/`, the layout `labkit grade` reads.

Each folder the glob matches is one student's home, and its name is the student's (`/home/alice` is alice;
`--strip jupyter-` makes The Littlest JupyterHub's `/home/jupyter-alice` alice too). In each home the lab
notebooks are found by their file names (`02_recompute.ipynb`, as the release bundle's README tells students to
keep them), below the home, hidden files and folders (`.ipynb_checkpoints`, `.local`) left out. Where a home holds two copies of
one lab, the one last modified is taken and the others are named in the report.

Nothing of a home is followed out of it: the walk opens every folder relative to the one above it without
following links (`os.fwalk`), and a notebook is opened with O_NOFOLLOW and must be a regular file, so a link
swapped in while collecting is not followed either. A symbolic link that leads out of its home (to another
student's notebook, to the kit's solutions, to /etc) is refused and reported; a link that stays inside is
skipped (its target, if a notebook, is found where it is). A home that is itself a link is refused. What the
grader would refuse (a file over 16 MiB, a FIFO) is refused here too, never read.
"""
from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from labkit.course.catalog import LABS
from labkit.course.grade.files import MOST_BYTES

__all__ = ["CollectError", "Home", "collect"]


class CollectError(ValueError):
    """A collection that cannot start: the message names the value and what is allowed."""


@dataclass
class Home:
    """What was collected from one home: its student, the notebooks written, and what was refused or left."""

    path: Path
    student: str
    written: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # "<path>: why", each refused and reported
    left: list[str] = field(default_factory=list)  # older copies of a lab, not taken

    def line(self) -> str:
        """One line of the report."""
        got = ", ".join(p.name for p in self.written) or "no lab notebook"
        parts = [f"{self.student} ({self.path}): {got}"]
        parts += [f"REFUSED {r}" for r in self.refused]
        parts += [f"left an older copy {p}" for p in self.left]
        return "; ".join(parts)


def _student(home: Path, strip: str) -> str:
    name = home.name.removeprefix(strip) if strip else home.name
    if not name or name.startswith(".") or not name.isprintable():
        raise CollectError(f"{home}: {name!r} is not a student's name (empty, hidden or not printable)")
    return name


def _link_target(dirfd: int, name: str) -> str:
    try:
        return os.readlink(name, dir_fd=dirfd)
    except OSError:
        return "?"


def _leaves(home: Path, where: Path, target: str) -> bool:
    """Whether a link at `where` (inside `home`) pointing at `target` leads out of `home`, resolved as the kernel
    would follow it now."""
    resolved = Path(os.path.realpath(where.parent / target))
    real_home = Path(os.path.realpath(home))
    return resolved != real_home and real_home not in resolved.parents


def _read(dirfd: int, name: str) -> tuple[bytes | None, str]:
    """The file's bytes, opened without following a link, or (None, why it is refused)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
    except OSError as e:
        return None, f"cannot be opened without following a link ({e.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file (never read)"
        if info.st_size > MOST_BYTES:
            return None, f"{info.st_size:,} B, over the limit of {MOST_BYTES:,} B for a returned notebook"
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MOST_BYTES + 1)
        if len(data) > MOST_BYTES:
            return None, f"over the limit of {MOST_BYTES:,} B for a returned notebook"
        return data, ""
    finally:
        os.close(fd)


def _found(home: Path, names: set[str], record: Home) -> dict[str, list[tuple[float, Path, bytes]]]:
    """Per lab notebook name, its copies below `home`: (modified, path, bytes); links and refusals go to
    `record`."""
    found: dict[str, list[tuple[float, Path, bytes]]] = {}
    for top, dirs, files, dirfd in os.fwalk(home, follow_symlinks=False):
        where = Path(top)
        # a link to a folder is listed with the folders, and never descended; hidden entries are the home's own
        entries = sorted(n for n in files + dirs if not n.startswith("."))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in entries:
            try:
                info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(info.st_mode):
                target = _link_target(dirfd, name)
                if _leaves(home, where / name, target):
                    record.refused.append(f"{where / name}: a link out of the home (to {target}), not followed")
                continue
            if name not in names or stat.S_ISDIR(info.st_mode):
                continue
            data, why = _read(dirfd, name)
            if data is None:
                record.refused.append(f"{where / name}: {why}")
                continue
            found.setdefault(name, []).append((info.st_mtime, where / name, data))
    return found


def collect(pattern: str, out: Path, labs: list[str] | None = None, strip: str = "") -> list[Home]:
    """Copy each home's lab notebooks (those of `labs`, default all) to `out/<student>/<notebook>`; one Home per
    folder the glob `pattern` matches, in order of name."""
    chosen = [lab for lab in LABS if labs is None or lab.number in labs]
    names = {lab.notebook for lab in chosen}
    homes = sorted(Path(p) for p in glob.glob(pattern))
    if not homes:
        raise CollectError(f"{pattern!r} matches no folder; give a glob of the students' homes, quoted "
                           "(e.g. '/home/*')")
    out = Path(out)
    real_out = Path(os.path.realpath(out))
    records, students = [], {}
    for home in homes:
        if home.is_symlink():
            records.append(Home(home, home.name, refused=[f"{home}: the home is itself a link (to "
                                                          f"{os.readlink(home)}), not followed"]))
            continue
        if not home.is_dir():
            continue
        if real_out == Path(os.path.realpath(home)) or Path(os.path.realpath(home)) in real_out.parents:
            continue  # the folder written to, matched by the glob
        student = _student(home, strip)
        if student in students:
            raise CollectError(f"{home} and {students[student]} are both student {student!r}; collect them "
                               "apart, or give --strip to name them")
        students[student] = home
        record = Home(home, student)
        for name, copies in sorted(_found(home, names, record).items()):
            copies.sort(key=lambda c: c[0], reverse=True)
            _, path, data = copies[0]
            record.left += [str(c[1]) for c in copies[1:]]
            target = out / student / name
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            record.written.append(target)
        records.append(record)
    return records
