"""`python -m labkit collect 'HOMES_GLOB' --out returned/ [--labs 02]`: the students' notebooks, from their hub
homes into `returned/<name>/`, the layout `labkit grade` reads.

Each folder the glob matches is one student's home, and its name is the student's (`/home/alice` is alice;
`--strip jupyter-` makes The Littlest JupyterHub's `/home/jupyter-alice` alice too). In each home the lab
notebooks are found by their file names (`02_recompute.ipynb`, as the release bundle's README tells students to
keep them), below the home, hidden files and folders (`.ipynb_checkpoints`, `.local`) left out. Where a home holds
two copies of one lab, the one last modified is taken and the others are named in the report.

Collect runs as root over folders the students control, so every name, link and file in a home is hostile. Rules
(the code points to each where it applies, as `See Rule 2`):

Rule 1. Names are shown, never printed raw: bytes that are not UTF-8 as `\\xNN`, control characters escaped, in
    every line of the report and every message. A name with a newline would otherwise forge a line of the report,
    and one that is not UTF-8 would crash the report.
Rule 2. Nothing is followed out of a home. Folders are opened one at a time, each relative to the one above, with
    O_NOFOLLOW and O_DIRECTORY (not `os.fwalk`, whose Python 3.11 opens a folder following a link and without
    O_NONBLOCK, and whose `onerror` gets no parent folder). A notebook is opened the same way and must be the
    regular file seen while searching (same device and inode), so a link or file swapped in meanwhile is never read.
    A link out of its home is refused and reported; a link inside is skipped (its target, if a notebook, is found
    where it is). A home that is itself a link is refused.
Rule 3. Only the student's own file is collected. A file with more than one hard link (its other name may be a
    classmate's notebook) or owned by someone other than the home's owner is refused and reported, as is what the
    grader would refuse (a file over 16 MiB, a FIFO). Choosing among copies keeps only (modified, path, size,
    identity) of each; only the copy taken is read.
Rule 4. Nothing is hidden: a folder that cannot be read, or that lies more than MOST_DEPTH folders down (a bound on
    open folders and on the search), is reported as not searched.
Rule 5. `--out` must be new or empty, or an earlier run's files would be graded with this run's. Collect refuses
    rather than cleans up: it cannot tell an earlier run's files from other files of the instructor's, and deletes
    nothing.
Rule 6. Everything refused for the whole run is refused before anything is written: two homes taking one student's
    name, and `--out` inside a home (its owner could swap the folders written through for links to anywhere).
Rule 7. Copies are the students' work: written 0600 in folders 0700, as new files (O_EXCL), never through a link.
"""
from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from labkit.course.catalog import LABS
from labkit.course.grade.files import MOST_BYTES

__all__ = ["MOST_DEPTH", "CollectError", "Home", "collect", "shown"]

MOST_DEPTH = 32  # folders below a home searched at most (a handout's notebooks are two or three down)
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO swapped in is opened without waiting, then refused


class CollectError(ValueError):
    """A collection that cannot start: the message names the value and what is allowed."""


@dataclass
class Home:
    """What was collected from one home: its student, the notebooks written, and what was refused or left."""

    path: Path
    student: str  # the folder written to below --out, or the home's name shown (See Rule 1) when refused
    written: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # "<path shown>: why", each refused and reported
    left: list[str] = field(default_factory=list)  # older copies of a lab, not taken, their paths shown

    def line(self) -> str:
        """One line of the report."""
        got = ", ".join(p.name for p in self.written) or "no lab notebook"
        parts = [f"{shown(self.student)} ({shown(self.path)}): {got}"]
        parts += [f"REFUSED {r}" for r in self.refused]
        parts += [f"left an older copy {p}" for p in self.left]
        return "; ".join(parts)


@dataclass(frozen=True)
class _Copy:
    """One copy of a lab notebook below a home, as kept while choosing: never its bytes (See Rule 3)."""

    modified: float
    parts: tuple[str, ...]  # its path below the home, one name per folder, the file's name last
    size: int
    identity: tuple[int, int]  # (st_dev, st_ino): the file opened to be read must be this one (See Rule 2)


def shown(name: str | os.PathLike) -> str:
    """`name` as it may be printed: bytes that are not UTF-8 as `\\xNN`, control characters escaped (See Rule 1)."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _student(home: Path, strip: str) -> str:
    name = home.name.removeprefix(strip) if strip else home.name
    if not name or name.startswith(".") or not name.isprintable():
        raise CollectError(f"{shown(home)}: '{shown(name)}' is not a student's name (empty, hidden or not "
                           "printable), not collected")
    return name


def _link_target(name: str | Path, dirfd: int | None = None) -> str:
    try:
        return os.readlink(name, dir_fd=dirfd)
    except OSError:
        return "?"


def _refusal(info: os.stat_result, owner: int) -> str:
    """Why a file found with a lab's name is not collected, or "" (See Rule 3)."""
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (never read)"
    if info.st_nlink > 1:
        return (f"a file with {info.st_nlink} hard links (another of its names may be a classmate's notebook), "
                "not collected")
    if info.st_uid != owner:
        return f"owned by uid {info.st_uid}, not by the home's owner (uid {owner}), not collected"
    if info.st_size > MOST_BYTES:
        return f"{info.st_size:,} B, over the limit of {MOST_BYTES:,} B for a returned notebook"
    return ""


class _Search:
    """The copies of each lab notebook below one home; links, refusals and folders not searched go to `record`."""

    def __init__(self, home_fd: int, record: Home, names: set[str]) -> None:
        self.record, self.names = record, names
        self.owner = os.fstat(home_fd).st_uid
        self.real_home = Path(os.path.realpath(record.path))
        self.found: dict[str, list[_Copy]] = {}  # per lab notebook's name, its copies that may be taken

    def refuse(self, path: Path, why: str) -> None:
        self.record.refused.append(f"{shown(path)}: {why}")  # See Rule 1

    def folder(self, fd: int, where: Path, parts: tuple[str, ...]) -> None:
        try:  # hidden entries are the home's own (.ipynb_checkpoints, .local)
            names = sorted(n for n in os.listdir(fd) if not n.startswith("."))
        except OSError as e:
            return self.refuse(where, f"a folder that cannot be read ({e.strerror}), not searched")  # See Rule 4
        for name in names:
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since listed
            except OSError as e:
                self.refuse(where / name, f"cannot be examined ({e.strerror})")
                continue
            if stat.S_ISLNK(info.st_mode):
                self.link(fd, where / name)
            elif stat.S_ISDIR(info.st_mode):
                self.descend(fd, where / name, parts + (name,))
            elif name in self.names:
                self.file(info, where / name, parts + (name,))

    def link(self, fd: int, where: Path) -> None:
        target = _link_target(where.name, fd)
        resolved = Path(os.path.realpath(where.parent / target))  # as the kernel would follow it now
        if resolved != self.real_home and self.real_home not in resolved.parents:  # See Rule 2
            self.refuse(where, f"a link out of the home (to {shown(target)}), not followed")

    def descend(self, fd: int, where: Path, parts: tuple[str, ...]) -> None:
        if len(parts) > MOST_DEPTH:
            return self.refuse(where, f"more than {MOST_DEPTH} levels below the home, not searched")  # See Rule 4
        try:
            sub = os.open(where.name, _FOLDER, dir_fd=fd)  # See Rule 2
        except OSError as e:
            return self.refuse(where, f"a folder that cannot be read ({e.strerror}), not searched")
        try:
            self.folder(sub, where, parts)
        finally:
            os.close(sub)

    def file(self, info: os.stat_result, where: Path, parts: tuple[str, ...]) -> None:
        why = _refusal(info, self.owner)
        if why:
            return self.refuse(where, why)
        copy = _Copy(info.st_mtime, parts, info.st_size, (info.st_dev, info.st_ino))
        self.found.setdefault(where.name, []).append(copy)


def _read(home_fd: int, copy: _Copy, owner: int) -> tuple[bytes | None, str]:
    """The copy's bytes, reopened from the home one folder at a time without following a link, or (None, why it
    is refused) (See Rule 2)."""
    opened: list[int] = []
    try:
        fd = home_fd
        for name in copy.parts[:-1]:
            fd = os.open(name, _FOLDER, dir_fd=fd)
            opened.append(fd)
        fd = os.open(copy.parts[-1], _FILE, dir_fd=fd)
        opened.append(fd)
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != copy.identity:
            return None, "replaced while collecting, not read"
        why = _refusal(info, owner)
        if why:
            return None, why
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MOST_BYTES + 1)
        if len(data) > MOST_BYTES:
            return None, f"over the limit of {MOST_BYTES:,} B for a returned notebook"
        return data, ""
    except OSError as e:
        return None, f"cannot be opened without following a link ({e.strerror})"
    finally:
        for fd in opened:
            os.close(fd)


def _write(out: Path, student: str, name: str, data: bytes) -> Path:
    """A new file `out/student/name`, private to whoever collects (See Rule 7)."""
    folder = out / student
    if not folder.is_dir():
        os.mkdir(folder, 0o700)
    target = folder / name
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return target


def _take(record: Home, home_fd: int, owner: int, name: str, copies: list[_Copy], out: Path) -> None:
    """The newest copy that can be read, written to `out`; the others named as left, or refused."""
    copies.sort(key=lambda c: (c.modified, c.parts), reverse=True)
    for i, copy in enumerate(copies):
        data, why = _read(home_fd, copy, owner)
        if data is None:
            record.refused.append(f"{shown(record.path.joinpath(*copy.parts))}: {why}")
            continue
        record.written.append(_write(out, record.student, name, data))
        record.left += [shown(record.path.joinpath(*c.parts)) for c in copies[i + 1:]]
        return


def _collect_home(record: Home, names: set[str], out: Path) -> None:
    """The lab notebooks of one home, found and written, everything else said in `record`."""
    try:
        home_fd = os.open(record.path, _FOLDER)  # a home swapped for a link since it was checked is not followed
    except OSError as e:
        record.refused.append(f"{shown(record.path)}: the home cannot be opened as a folder ({e.strerror})")
        return
    try:
        search = _Search(home_fd, record, names)
        search.folder(home_fd, record.path, ())
        for name, copies in sorted(search.found.items()):
            _take(record, home_fd, search.owner, name, copies, out)
    finally:
        os.close(home_fd)


def _check_out(out: Path) -> None:
    """Refuse an --out that is not a folder or holds anything (See Rule 5)."""
    if os.path.lexists(out) and not out.is_dir():
        raise CollectError(f"--out {shown(out)} is not a folder; give a new folder to collect into")
    if out.is_dir():
        held = sorted(os.listdir(out))
        if held:
            raise CollectError(f"--out {shown(out)} is not empty ({len(held)} entries, e.g. {shown(held[0])}): "
                               "an earlier run's files would be graded with this run's; choose a new folder or "
                               "empty it yourself (collect deletes nothing: it cannot tell an earlier run's files "
                               "from your others)")


def _homes(pattern: str, out: Path, strip: str) -> list[Home]:
    """One Home per folder the glob matches, in order of name, each named (or refused) before anything is written
    (See Rule 6)."""
    paths = sorted(Path(p) for p in glob.glob(pattern))
    if not paths:
        raise CollectError(f"{pattern!r} matches no folder; give a glob of the students' homes, quoted "
                           "(e.g. '/home/*')")
    real_out = Path(os.path.realpath(out))
    records, students = [], {}
    for home in paths:
        if home.is_symlink():
            records.append(Home(home, shown(home.name), refused=[
                f"{shown(home)}: the home is itself a link (to {shown(_link_target(home))}), not followed"]))
            continue
        real = Path(os.path.realpath(home))
        if not home.is_dir() or real == real_out:
            continue  # a file, or the (empty: See Rule 5) folder written to, matched by the glob
        if real in real_out.parents:
            raise CollectError(f"--out {shown(out)} is inside the home {shown(home)}, whose owner could turn the "
                               "folders written through into links; collect into a folder outside every home")
        try:
            student = _student(home, strip)
        except CollectError as e:
            records.append(Home(home, shown(home.name), refused=[str(e)]))
            continue
        if student in students:
            raise CollectError(f"{shown(home)} and {shown(students[student])} are both student {student!r}; "
                               "collect them apart, or give --strip to name them")
        students[student] = home
        records.append(Home(home, student))
    return records


def collect(pattern: str, out: Path, labs: list[str] | None = None, strip: str = "") -> list[Home]:
    """Copy each home's lab notebooks (those of `labs`, default all) to `out/<student>/<notebook>`; one Home per
    folder the glob `pattern` matches, in order of name."""
    names = {lab.notebook for lab in LABS if labs is None or lab.number in labs}
    out = Path(out)
    _check_out(out)
    records = _homes(pattern, out, strip)
    os.makedirs(out, 0o700, exist_ok=True)
    for record in records:
        if not record.refused:  # a home refused while naming is reported, never searched
            _collect_home(record, names, out)
    return records
