"""`python -m labkit collect HOME... --out returned/ [--labs 02]`: the students' notebooks, from their hub homes
into `returned/<name>/`, the layout `labkit grade` reads, and the class looked at, so that grade gives every
student a row.

The homes are given as the shell expands `/home/*` or as a quoted pattern; each folder given is one student's
home, and its name is the student's (`/home/alice` is alice; `--strip jupyter-` makes The Littlest JupyterHub's
`/home/jupyter-alice` alice too). The class is every home given (or `--roster FILE`'s names) but the home of
whoever collects (`$HOME`, and `$SUDO_USER`'s under sudo) and `--exclude`'s names; what is given and left out
is said.

In each home every notebook below it is looked at, hidden files and folders (`.ipynb_checkpoints`, `.local`)
left out, and told by what it is (labkit/course/identity.py), not by its name: a lab's student view is a
candidate under any name (JupyterLab's `02_recompute-Copy1.ipynb`, `Copy of ...`, spaces), the kit's solution
notebook never is (a clone of the whole repository holds them all), and a notebook named like a lab without a
view's marks is one only where no view of that lab is found. Of several candidates, one with work (a cell
changed since generated) comes before one without, then the newest; the report names the one taken, why, and the
others. What nothing was taken for, and why, is kept in `--out`'s ``CLASS_FILE`` with the class.

Collect runs as root over folders the students control, so every name, link and file in a home is hostile. Rules
(the code points to each where it applies, as `See Rule 2`):

Rule 1. Names are shown, never printed raw: bytes that are not UTF-8 as `\\xNN`, control characters escaped, in
    every line of the report and every message. A name with a newline would otherwise forge a line of the report,
    and one that is not UTF-8 would crash the report.
Rule 2. Nothing is followed out of a home. Folders are opened one at a time, each relative to the one above, with
    O_NOFOLLOW and O_DIRECTORY (not `os.fwalk`, whose Python 3.11 opens a folder following a link and without
    O_NONBLOCK, and whose `onerror` gets no parent folder), and each is closed before its parent's next entry. A
    notebook is opened the same way, relative to its folder, and must be the regular file seen while searching
    (same device and inode), so a link or file swapped in meanwhile is never read. A link out of its home is
    refused and reported; a link inside is skipped (its target, if a notebook, is found where it is). Where a link
    leads is worked out one link at a time, at most MOST_LINKS of them (the kernel's own bound): a longer chain or
    a loop is reported by name, never a crash. A home that is itself a link is refused.
Rule 3. Only the student's own file is collected. A file with more than one hard link (its other name may be a
    classmate's notebook) or owned by someone other than the home's owner is refused and reported, as is what the
    grader would refuse (a file over 16 MiB, a FIFO). Every notebook is read once, to tell what it is, at most
    MOST_NOTEBOOKS a home; only the bytes of the best candidate so far of each lab are kept, and they are what is
    written.
Rule 4. Nothing is hidden: a folder that cannot be read, or that lies more than MOST_DEPTH folders down (a bound on
    open folders and on the search), is reported as not searched, as are the notebooks past MOST_NOTEBOOKS.
Rule 5. `--out` must be new or empty, or an earlier run's files would be graded with this run's. Collect refuses
    rather than cleans up: it cannot tell an earlier run's files from other files of the instructor's, and deletes
    nothing.
Rule 6. Everything refused for the whole run is refused before anything is written: two homes taking one student's
    name, and `--out` inside a home given but that of whoever collects (its owner could swap the folders written
    through for links to anywhere).
Rule 7. Copies are the students' work: written 0600 in folders 0700, as new files (O_EXCL), never through a link;
    under sudo they, their folders, --out and the class file belong to the user who ran it (SUDO_UID), who grades
    them as herself.
"""
from __future__ import annotations

import glob
import json
import os
import pwd
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from labkit.course import identity
from labkit.course.catalog import LABS
from labkit.course.grade.files import CLASS_FILE, MOST_BYTES

__all__ = ["CLASS_FILE", "MOST_DEPTH", "MOST_LINKS", "MOST_NOTEBOOKS", "Collection", "CollectError", "Home",
           "collect", "own_homes", "read_roster", "shown"]

MOST_DEPTH = 32  # folders below a home searched at most (a handout's notebooks are two or three down)
MOST_LINKS = 40  # links followed in working out where one leads (Linux's MAXSYMLINKS): past it, a chain or a loop
MOST_NOTEBOOKS = 256  # notebooks read per home at most (a full clone of the kit holds 16)
MOST_SAID = 12  # refusals a home's line shows, but of notebooks (all shown); the class file keeps them all
_NOTEBOOK = {lab.number: lab.notebook for lab in LABS}  # "02" -> "02_recompute.ipynb"
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO swapped in is opened without waiting, then refused


class CollectError(ValueError):
    """A collection that cannot start: the message names the value and what is allowed."""


@dataclass
class Home:
    """One student of the class: the home, what was taken from it and why, what was refused or left."""

    path: Path | None  # None: a name of --roster with no home among those given
    student: str  # the folder written to below --out, or the home's name shown (See Rule 1) when refused
    written: list[Path] = field(default_factory=list)
    taken: dict[str, str] = field(default_factory=dict)  # lab -> "<path shown> (what it is; why it was taken)"
    refused: list[str] = field(default_factory=list)  # "<path shown>: why", each refused and reported
    left: list[str] = field(default_factory=list)  # "<path shown> (what it is)": candidates not taken
    nothing: dict[str, str] = field(default_factory=dict)  # lab -> why nothing of it was taken

    def line(self) -> str:
        """One line of the report."""
        got = [f"{_NOTEBOOK[lab]} from {taken}" for lab, taken in self.taken.items()]
        where = shown(self.path) if self.path is not None else "no home"
        parts = [f"{shown(self.student)} ({where}): {', '.join(got) or 'no lab notebook'}"]
        others = 0  # refusals of what is not a notebook: past MOST_SAID of them, counted, not shown
        for refused in self.refused:
            notebook = refused.split(": ")[0].lower().endswith(".ipynb")
            others += not notebook
            if notebook or others <= MOST_SAID:
                parts.append(f"REFUSED {refused}")
        if others > MOST_SAID:
            parts.append(f"and {others - MOST_SAID} more links or folders refused (all in --out's {CLASS_FILE})")
        parts += [f"left {p}" for p in self.left]
        if self.path is None:
            parts += sorted(set(self.nothing.values()))
        return "; ".join(parts)


@dataclass
class Collection:
    """A run of collect: the class (one Home per student, in order of name) and what was given but left out."""

    homes: list[Home]
    left_out: list[str]  # "<path shown>: why", each given and not in the class
    labs: list[str]  # the labs collected

    def record(self) -> dict:
        """The class as `labkit grade` reads it (files.read_class): every student, and per lab, why nothing
        was taken where nothing was."""
        return {"collected": self.labs, "students": {
            h.student: {"home": shown(h.path) if h.path is not None else None, "taken": h.taken,
                        "nothing": h.nothing, "refused": h.refused} for h in self.homes}}


@dataclass(frozen=True)
class _Copy:
    """A candidate notebook below a home, as kept while choosing: never its bytes (See Rule 3)."""

    parts: tuple[str, ...]  # its path below the home, one name per folder, the file's name last
    modified: float
    what: identity.Identity
    exact: bool  # named exactly as its lab's notebook

    @property
    def tier(self) -> int:
        """2: a view with work; 1: a view untouched; 0: named like the lab, without a view's marks."""
        return 0 if self.what.kind != "view" else 1 + (self.what.edited > 0)

    def rank(self) -> tuple:
        return (self.tier, self.modified, self.exact, self.parts)

    def describe(self) -> str:
        if self.what.kind == "view":
            edited = self.what.edited
            return f"Lab {self.what.lab}'s student view, " + (
                f"{edited} cell{'s' * (edited != 1)} edited or added" if edited else "untouched")
        return "named like the lab, without a student view's marks"


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


def _resolve(path: Path) -> Path | None:
    """Where `path` leads, every link on the way followed as the kernel would, one at a time: None past MOST_LINKS
    links (a chain that long, or a loop). `os.path.realpath` recurses per link, and a long chain raised
    RecursionError (See Rule 2)."""
    todo = list(reversed(Path(os.path.abspath(path)).parts[1:]))
    done, links = Path("/"), 0
    while todo:
        part = todo.pop()
        if part == "..":
            done = done.parent
            continue
        step = done / part
        try:
            is_link = stat.S_ISLNK(os.lstat(step).st_mode)
        except OSError:  # not there (or not reachable): the rest is taken as written
            is_link = False
        if not is_link:
            done = step
            continue
        links += 1
        target = _link_target(step)
        if links > MOST_LINKS or target == "?":
            return None
        if os.path.isabs(target):
            done = Path("/")
        todo.extend(reversed([p for p in Path(target).parts if p not in ("/", ".")]))
    return done


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _lab_named(name: str, stems: dict[str, str]) -> str:
    """The lab a file's name says, however decorated (`Copy of 02_recompute (1).ipynb`), or ""."""
    words = "_" + re.sub(r"[^0-9a-z]+", "_", name.lower().removesuffix(".ipynb")) + "_"
    return next((lab for stem, lab in stems.items() if f"_{stem}_" in words), "")


def _refusal(info: os.stat_result, owner: int) -> str:
    """Why a notebook is not read, or "" (See Rule 3)."""
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
    """The candidate notebooks of each lab below one home, the best one's bytes kept; links, refusals and folders
    not searched go to `record`, each with the lab it concerns ("": none)."""

    def __init__(self, home_fd: int, record: Home, labs: list[str], signs: dict[str, frozenset[str]]) -> None:
        self.record, self.labs, self.signs = record, labs, signs
        self.stems = {lab.notebook.removesuffix(".ipynb"): lab.number for lab in LABS}
        self.owner = os.fstat(home_fd).st_uid
        self.real_home = _resolve(record.path)
        self.copies: dict[str, list[_Copy]] = {}  # lab -> its candidates
        self.best: dict[str, tuple[_Copy, bytes]] = {}  # lab -> the best candidate so far, and its bytes
        self.about: dict[str, list[str]] = {}  # lab -> what was refused or not taken of it ("": of no lab)
        self.read = self.unread = 0

    def refuse(self, path: Path, why: str, lab: str = "") -> None:
        line = f"{shown(path)}: {why}"  # See Rule 1
        self.record.refused.append(line)
        self.about.setdefault(lab, []).append(line)

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
            elif name.lower().endswith(".ipynb"):
                self.notebook(fd, info, where / name, parts + (name,))

    def link(self, fd: int, where: Path) -> None:
        target = _link_target(where.name, fd)
        lab = _lab_named(where.name, self.stems) if where.name.lower().endswith(".ipynb") else ""
        resolved = _resolve(where)  # as the kernel would follow it now; See Rule 2
        if resolved is None:
            self.refuse(where, f"a chain of more than {MOST_LINKS} links, or a loop (to {shown(target)}), not "
                               "followed", lab)
        elif self.real_home is None or not _inside(resolved, self.real_home):
            self.refuse(where, f"a link out of the home (to {shown(target)}), not followed", lab)

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

    def notebook(self, fd: int, info: os.stat_result, where: Path, parts: tuple[str, ...]) -> None:
        named = _lab_named(where.name, self.stems)
        why = _refusal(info, self.owner)
        if why:
            return self.refuse(where, why, named) if named else None  # another notebook, not read: no lab's
        if self.read >= MOST_NOTEBOOKS:
            self.unread += 1  # See Rule 4
            return
        self.read += 1
        data, why = _read_at(fd, where.name, (info.st_dev, info.st_ino), self.owner)
        if data is None:
            return self.refuse(where, why, named)
        what = identity.identify(data, self.signs)
        lab = what.lab or named
        if lab not in self.labs:
            return  # no lab collected here
        if what.kind == "solution":
            return self.refuse(where, f"the kit's solution notebook of Lab {lab} (it holds the answer markers, "
                                      "### BEGIN SOLUTION, and none of a student view's marks): never collected "
                                      "as a student's work", lab)
        copy = _Copy(parts, info.st_mtime, what if what.lab else identity.Identity(lab, what.kind, what.edited),
                     where.name == _NOTEBOOK[lab])
        self.copies.setdefault(lab, []).append(copy)
        if lab not in self.best or copy.rank() > self.best[lab][0].rank():
            self.best[lab] = (copy, data)

    def finish(self) -> None:
        if self.unread:
            self.refuse(self.record.path, f"{self.unread} notebooks past the first {MOST_NOTEBOOKS} (in order of "
                                          "path), not examined")


def _read_at(fd: int, name: str, seen: tuple[int, int], owner: int) -> tuple[bytes | None, str]:
    """The bytes of `name` in the folder `fd`, opened without following a link, if it is the file `seen` (device,
    inode) and still passes; else (None, why) (See Rule 2)."""
    try:
        file = os.open(name, _FILE, dir_fd=fd)
    except OSError as e:
        return None, f"cannot be opened without following a link ({e.strerror})"
    try:
        info = os.fstat(file)
        if (info.st_dev, info.st_ino) != seen:
            return None, "replaced while collecting, not read"
        why = _refusal(info, owner)
        if why:
            return None, why
        with os.fdopen(file, "rb", closefd=False) as f:
            data = f.read(MOST_BYTES + 1)
    finally:
        os.close(file)
    if len(data) > MOST_BYTES:
        return None, f"over the limit of {MOST_BYTES:,} B for a returned notebook"
    return data, ""


def _write(out: Path, student: str, name: str, data: bytes) -> Path:
    """A new file `out/student/name`, private to whoever collects (See Rule 7)."""
    folder = out / student
    if not folder.is_dir():
        os.mkdir(folder, 0o700)
        _give(folder)
    target = folder / name
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    _give(fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return target


def collector() -> tuple[int, int] | None:
    """Who the copies are for where that is not who writes them: under sudo, the user who ran it (SUDO_UID,
    SUDO_GID), so that she grades them as herself; None otherwise."""
    uid, gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    return (int(uid), int(gid)) if os.geteuid() == 0 and uid.isdigit() and gid.isdigit() else None


def _give(where: Path | int) -> None:
    """`where` (a path, never followed, or an open file) to the collector, where there is one (See Rule 7)."""
    owner = collector()
    if owner is not None:
        os.chown(where, *owner, **({} if isinstance(where, int) else {"follow_symlinks": False}))


def _why_taken(copies: list[_Copy]) -> str:
    """Why the first of `copies` (best first) was taken over the others."""
    first, rest = copies[0], copies[1:]
    if not rest:
        return "the only candidate"
    if first.tier > max(c.tier for c in rest):
        return {2: "the only one with work", 1: "the only student view"}[first.tier]
    alike = 1 + sum(c.tier == first.tier for c in rest)
    return f"the newest of {alike} " + {2: "with work", 1: "untouched student views", 0: "without marks"}[first.tier]


def _nothing(search: _Search, lab: str) -> str:
    """Why nothing of `lab` was taken from the home searched."""
    about = search.about.get(lab, [])
    if about:
        return f"no notebook of Lab {lab} taken: " + "; ".join(about)
    general = search.about.get("", [])
    where = shown(search.record.path)
    return f"no notebook of Lab {lab} found below {where}" + (
        f" (not searched or not followed: {'; '.join(general)})" if general else "")


def _take(search: _Search, out: Path) -> None:
    """Each lab's best candidate written to `out`; the others named as left; what nothing was taken for, why."""
    record = search.record
    for lab in search.labs:
        copies = sorted(search.copies.get(lab, []), key=_Copy.rank, reverse=True)
        if not copies:
            record.nothing[lab] = _nothing(search, lab)
            continue
        best, data = search.best[lab]
        record.written.append(_write(out, record.student, _NOTEBOOK[lab], data))
        record.taken[lab] = f"{shown(record.path.joinpath(*best.parts))} ({best.describe()}; {_why_taken(copies)})"
        record.left += [f"{shown(record.path.joinpath(*c.parts))} ({c.describe()})" for c in copies[1:]]


def _collect_home(record: Home, labs: list[str], signs: dict[str, frozenset[str]], out: Path) -> None:
    """The lab notebooks of one home, found and written, everything else said in `record`."""
    try:
        home_fd = os.open(record.path, _FOLDER)  # a home swapped for a link since it was checked is not followed
    except OSError as e:
        record.refused.append(f"{shown(record.path)}: the home cannot be opened as a folder ({e.strerror})")
        record.nothing = dict.fromkeys(labs, record.refused[-1])
        return
    try:
        search = _Search(home_fd, record, labs, signs)
        search.folder(home_fd, record.path, ())
        search.finish()
        _take(search, out)
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


def own_homes() -> list[Path]:
    """The homes of whoever runs collect: `$HOME`, and under sudo (whose HOME is root's) `$SUDO_USER`'s."""
    found = [Path(os.environ["HOME"])] if os.environ.get("HOME") else []
    try:
        found += [Path(pwd.getpwnam(os.environ["SUDO_USER"]).pw_dir)] if os.environ.get("SUDO_USER") else []
    except KeyError:
        pass
    return found


def _given(homes: list[str]) -> list[Path]:
    """The paths given, a quoted pattern expanded as the shell would (`'/home/*'`), in order of name, each once."""
    paths: list[str] = []
    for arg in homes:
        if glob.has_magic(arg) and not os.path.lexists(arg):
            matched = glob.glob(arg)
            if not matched:
                raise CollectError(f"{shown(arg)} matches nothing; give the students' homes (/home/*, as the shell "
                                   "expands it, or a quoted pattern)")
            paths += matched
        else:
            paths.append(arg)
    return sorted({Path(os.path.abspath(p)) for p in paths})


def read_roster(path: Path) -> list[str]:
    """The names of a roster file: one a line, blank lines and `#` comments left out. A CollectError names a line
    that is not a student's name, or a name given twice."""
    names: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        name = line.strip()
        if not name or name.startswith("#"):
            continue
        if name.startswith(".") or "/" in name or not name.isprintable():
            raise CollectError(f"--roster {shown(path)}, line {number}: {shown(name)!r} is not a student's name "
                               "(one name a line, as the home's folder is named after --strip; not hidden, no /)")
        if name in names:
            raise CollectError(f"--roster {shown(path)}, line {number}: {name!r} is given twice")
        names.append(name)
    return names


@dataclass
class _Choice:
    """Who was given and who of them is the class: filled by _homes, before anything is written."""

    out: Path
    strip: str
    own: list[Path]
    exclude: set[str]
    roster: list[str] | None
    homes: list[Home] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    students: dict[str, Path] = field(default_factory=dict)
    excluded: set[str] = field(default_factory=set)  # the names of --exclude that matched a home

    def leave(self, path: Path, why: str) -> None:
        self.left_out.append(f"{shown(path)}: {why}")

    def keep_out_of(self, home: Path, real: Path, real_out: Path) -> None:
        """Refuse an --out inside `home`, unless it is the home of whoever collects (See Rule 6)."""
        if _inside(real_out, real) and real not in self.own:
            raise CollectError(f"--out {shown(self.out)} is inside the home {shown(home)}, whose owner could turn "
                               "the folders written through into links; collect into a folder outside every home "
                               "but your own")

    def take(self, home: Path) -> None:
        """One path given: a student of the class, or left out and said why."""
        if home.is_symlink():
            return self.linked(home)
        if not home.is_dir():
            return self.leave(home, "not a folder, so no one's home" if os.path.lexists(home) else "no such folder")
        real, real_out = _resolve(home), _resolve(self.out)
        if real is None or real_out is None:
            raise CollectError(f"{shown(home if real is None else self.out)}: a chain of more than {MOST_LINKS} "
                               "links, or a loop, on the way to it; give the folder it leads to")
        if real == real_out:
            return self.leave(home, "the --out folder")
        self.keep_out_of(home, real, real_out)
        if real in self.own:
            return self.leave(home, OWN_HOME)
        self.admit(home)

    def linked(self, home: Path) -> None:
        """A home that is itself a link: never followed, yet left out as any home is (yours, --exclude, not on
        --roster), else its student's row, refused, under the name --strip gives it."""
        if _resolve(home) in self.own:
            return self.leave(home, OWN_HOME)
        self.admit(home, f"{shown(home)}: the home is itself a link (to {shown(_link_target(home))}), not followed")

    def admit(self, home: Path, refused: str | None = None) -> None:
        """`home`'s student in the class, unless --exclude or --roster leaves them out; `refused`: why nothing
        of theirs is collected."""
        try:
            student = _student(home, self.strip)
        except CollectError as e:
            self.homes.append(Home(home, shown(home.name), refused=[str(e)]))
            return
        if student in self.exclude or home.name in self.exclude:
            self.excluded |= {student, home.name} & self.exclude
            return self.leave(home, "--exclude")
        if self.roster is not None and student not in self.roster:
            return self.leave(home, f"{student!r} is not on --roster")
        if student in self.students:
            raise CollectError(f"{shown(home)} and {shown(self.students[student])} are both student {student!r}; "
                               "collect them apart, or give --strip to name them")
        self.students[student] = home
        self.homes.append(Home(home, student, refused=[refused] if refused else []))


OWN_HOME = "your own home ($HOME), never a student's (--exclude NAME leaves out others)"


def _homes(given: list[Path], choice: _Choice) -> None:
    """The class: one Home per student, in order of name, each named (or refused) before anything is written,
    and the roster's names without a home (See Rule 6)."""
    for home in given:
        choice.take(home)
    choice.left_out += [f"--exclude {shown(n)}: no such home among those given"
                        for n in sorted(choice.exclude - choice.excluded)]
    for name in choice.roster or []:
        if name not in choice.students:
            choice.homes.append(Home(None, name))
    choice.homes.sort(key=lambda h: h.student)


def _write_class(out: Path, found: Collection) -> None:
    """The class, for `labkit grade`: a new file, private, as the copies are (See Rule 7)."""
    fd = os.open(out / CLASS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    _give(fd)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(found.record(), f, indent=1, ensure_ascii=False)


def collect(homes: list[str], out: Path, labs: list[str] | None = None, strip: str = "",
            exclude: list[str] = (), roster: list[str] | None = None, own: list[Path] | None = None) -> Collection:
    """Copy each student's lab notebooks (those of `labs`, default all) to `out/<student>/<notebook>` and record
    the class in `out/CLASS_FILE`. `homes`: the folders given (or patterns); `own`: the homes of whoever collects,
    left out (default `own_homes()`); `roster`: the class's names, where not every home given."""
    chosen = [lab.number for lab in LABS if labs is None or lab.number in labs]
    out = Path(os.path.abspath(out))
    _check_out(out)
    choice = _Choice(out, strip, [p for p in map(_resolve, own if own is not None else own_homes()) if p],
                     set(exclude), roster)
    _homes(_given(homes), choice)
    if not choice.homes:
        raise CollectError(f"no student's home among those given ({len(choice.left_out)} left out: "
                           f"{'; '.join(choice.left_out[:3])}); give the students' homes, /home/* say")
    signs = identity.signatures(Path(__file__).resolve().parents[2])
    os.makedirs(out, 0o700, exist_ok=True)
    _give(out)
    for record in choice.homes:
        if record.path is None:
            record.nothing = dict.fromkeys(chosen, f"{record.student!r} is on --roster, and no home given is theirs")
        elif record.refused:  # a home refused while naming is reported, never searched
            record.nothing = dict.fromkeys(chosen, record.refused[0])
        else:
            _collect_home(record, chosen, signs, out)
    found = Collection(choice.homes, choice.left_out, chosen)
    _write_class(out, found)
    return found
