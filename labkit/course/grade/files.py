"""The returned files: which are graded, under what name, read how.

Only regular files are graded: a symlink (to the kit's solution, to a classmate's notebook), a FIFO, a device or
a file over ``MOST_BYTES`` is that student's row, refused, never read. Folders are searched without following
links; a link to a folder found there is named on the terminal (``linked_folders``), not graded: a room linked in
from another disk is said to be left out, and a name's `#N` never depends on the links beside it. A student's
name is the file's path below the folder it was found in: the folder when the file is named like a lab
(`alice/02_recompute.ipynb` is alice; a lab's file right in a folder given, `alice/`, is named by that folder).
Files listed one by one (the shell's `returned/*/02_recompute.ipynb`) are named as if the folder that holds all
their students' folders had been given, so a class is named alike however its files are given; a listed file not
named like a lab is its own name. A file given twice (by its folder and by itself) is graded once. Names
are unique per lab (two files that would take one name are both kept, the second `alice#2`, and a ``note`` says
so), printable, their bytes that are not UTF-8 escaped.

A class collected by `labkit collect` keeps, in its folder, the class it looked at (``CLASS_FILE``): every student,
and per lab why nothing of it was taken where nothing was. A student of it with no file of a lab graded is that
lab's row all the same (``absent``): `missing`, with collect's why, so that the gradebook has every student.

Names are given in one order, whatever the order of the arguments (``_canonical``): by each file's path as given
(made absolute, no link resolved), below the folder all the files share, then by the name. Machines that grade
parts of one class (--shard) may list its files in other orders (a glob, `find`) and mount it at other places; all
of them give each file the same name, `#2` included, and so the same part. The mount point is above the shared
folder, so it changes no order; a link is not resolved, because where it points (a student's folder linked to
another disk) may differ from machine to machine, while the paths as given cannot differ without the names, which
are made from them, differing too. Two keys tie only for one path given twice (by its folder and by itself), and
the name breaks the tie; a file given twice by two paths (through a link) is graded once, under the first.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CLASS_FILE", "MOST_BYTES", "Returned", "absent", "discover", "linked_folders", "read_class", "read_text"]

MOST_BYTES = 16 * 2**20  # a returned notebook's size at most (a lab's student notebook is well under 1 MiB)
CLASS_FILE = ".labkit-class.json"  # the class `labkit collect` looked at, in its --out (a hidden name: no student's)


@dataclass(frozen=True)
class Returned:
    """One returned file: its path, the student it is graded for, and why it is refused ("" when it is not)."""

    path: Path
    student: str
    refused: str = ""
    note: str = ""  # why the student is not named as its path says (another file took that name), or ""


def _printable(text: str) -> str:
    """`text` with control characters escaped (a name is a gradebook cell and a line on the terminal)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _name(path: Path, base: Path | None, stems: set[str]) -> str:
    """The student `path` is graded for, found below `base` (None: listed, not named like a lab)."""
    if base is not None and path.parent == base and path.stem in stems and base.name:
        base = base.parent  # `alice/` given, alice/02_recompute.ipynb in it: alice, as when `returned/` is given
    rel = path.relative_to(base) if base is not None else Path(path.name)
    parts = list(rel.parts)
    if Path(parts[-1]).stem in stems and len(parts) > 1:  # alice/02_recompute.ipynb: the folder names the student
        parts = parts[:-1]
    else:
        parts[-1] = Path(parts[-1]).stem
    raw = "/".join(parts)
    return _printable(os.fsencode(raw).decode("utf-8", "backslashreplace"))


def _listed_base(listed: list[Path], stems: set[str]) -> Path | None:
    """The folder that holds the folders of every listed file named like a lab (`returned/` for the shell's
    `returned/*/02_recompute.ipynb`; for one file, the folder above its own), or None when none is."""
    holders = [p.parent.parent for p in listed if p.stem in stems and p.parent != p.parent.parent]
    return Path(os.path.commonpath(holders)) if holders else None


def _refusal(path: Path) -> str:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "missing: no such file"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link, not a file of the student's (only regular files are graded)"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a FIFO, a device or a socket is never read)"
    if info.st_size > MOST_BYTES:
        return f"{info.st_size:,} B, over the limit of {MOST_BYTES:,} B for a returned notebook"
    return ""


def _walk(folder: Path) -> list[Path]:
    """Every *.ipynb below `folder`, links not followed, checkpoint copies left out, in order."""
    found = []
    for top, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        found += [Path(top) / f for f in sorted(files) if f.endswith(".ipynb")]
    return found


def linked_folders(paths: list[Path]) -> list[Path]:
    """The links to folders below the folders given, none searched (see the module's note), so that a room or a
    student's folder linked in from elsewhere is named, not left out without a word; those below a hidden folder
    (a virtual environment's lib64, a cache) are left out, as no lab is handed in there."""
    found = []
    for given in paths:
        if not os.path.isdir(given) or os.path.islink(given):
            continue
        for top, dirs, _ in os.walk(given, followlinks=False):
            found += [Path(top) / d for d in sorted(dirs) if os.path.islink(Path(top) / d) and not d.startswith(".")]
            dirs[:] = [d for d in dirs if not d.startswith(".")]
    return found


def _canonical(found: list[tuple[Path, Path | None]], stems: set[str]) -> list[tuple[Path, Path | None]]:
    """`found` in the order names are given in: by each file's path as given, below the folder all of them share
    (links not resolved: a student's folder that links elsewhere sorts where it is given, not where it points),
    then by the name (one file given twice, by its folder and by itself: one name wins)."""
    common = Path(os.path.commonpath([p for p, _ in found])) if found else Path("/")
    keys = [(p.relative_to(common).parts, _name(p, holder, stems)) for p, holder in found]
    return [entry for _, entry in sorted(zip(keys, found), key=lambda pair: pair[0])]


def _clash(taken: set[str], lab: str) -> bool:
    """A name taken for the labs `taken` cannot be given for `lab`: the same lab, or either known only from the
    notebook's content ("")."""
    return bool(taken) and (not lab or "" in taken or lab in taken)


def discover(paths: list[Path], stems: set[str]) -> list[Returned]:
    """The files named (as given) and found below the folders named, each with a unique student name."""
    paths = [Path(os.path.abspath(p)) for p in paths]  # one form, so that folders compare and names are relative
    listed = [p for p in paths if not (p.is_dir() and not p.is_symlink())]
    base = _listed_base(listed, stems)
    found: list[tuple[Path, Path | None]] = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            found += [(p, path) for p in _walk(path)]
        else:
            found.append((path, base if path.stem in stems and base is not None else None))
    labs_of: dict[str, set[str]] = {}  # a name taken -> the labs it was taken for ("": a lab known from content only)
    first: dict[str, Path] = {}  # a name -> the file that took it first
    seen: set[tuple[str, str]] = set()  # (the file's folder, links resolved; its own name): a file given twice
    returned = []
    for path, holder in _canonical(found, stems):  # see the module's note: names alike on every machine
        key = (os.path.realpath(path.parent), path.name)
        if key in seen:
            continue
        seen.add(key)
        name = _name(path, holder, stems)
        lab = path.name[:2] if path.stem in stems else ""
        unique, n = name, 1
        while _clash(labs_of.get(unique, set()), lab):  # "bob#2" may be a file's own name: the next free one
            n += 1
            unique = f"{name}#{n}"
        labs_of.setdefault(unique, set()).add(lab)
        first.setdefault(name, path)
        note = f"{path} is graded as {unique}: {name} is {first[name]}" if unique != name else ""
        returned.append(Returned(path, unique, _refusal(path), note))
    return returned


def read_text(path: Path) -> str:
    """The file's text, opened without following a link and read up to MOST_BYTES (it was checked, and may have
    been swapped since)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MOST_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MOST_BYTES:
        raise OSError(f"over the limit of {MOST_BYTES:,} B")
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Recorded:
    """One student of a class `labkit collect` recorded: where the class is, and what was taken or not, by lab."""

    folder: Path  # the class's folder (collect's --out)
    taken: dict[str, str]  # lab -> the file taken, as collect said it
    nothing: dict[str, str]  # lab -> why nothing of it was taken
    collected: frozenset[str]  # the labs collect looked for


def read_class(paths: list[Path], stems: set[str]) -> dict[str, Recorded]:
    """The class `labkit collect` recorded (its CLASS_FILE) in the folders given, or in the folder that holds the
    files listed, by student; {} where there is none. A record that is not collect's is refused (ValueError),
    naming the file."""
    folders = {Path(os.path.abspath(p)) for p in paths if os.path.isdir(p) and not os.path.islink(p)}
    base = _listed_base([Path(os.path.abspath(p)) for p in paths if Path(os.path.abspath(p)) not in folders], stems)
    found: dict[str, Recorded] = {}
    for folder in sorted(folders | ({base} if base is not None else set())):
        record = folder / CLASS_FILE
        if os.path.islink(record) or not os.path.isfile(record):
            continue
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
            collected = frozenset(str(lab) for lab in data["collected"])
            for name, student in data["students"].items():
                found[str(name)] = Recorded(folder, {str(k): str(v) for k, v in student["taken"].items()},
                                            {str(k): str(v) for k, v in student["nothing"].items()}, collected)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{record}: not the class labkit collect writes ({type(e).__name__}: {e}); collect "
                             "again into a new folder") from None
    return found


def absent(students: dict[str, Recorded], returned: list[Returned], notebooks: dict[str, str],
           stems: set[str]) -> list[Returned]:
    """A `missing` entry for each student of a class collect recorded (read_class) with no file of a lab graded
    (`notebooks`: lab -> its notebook's name; `stems`: every lab notebook's), saying why: collect's word, or that
    the file is gone since. A student with a file not named like a lab (its content tells which) gets none."""
    have = {(r.student, r.path.stem) for r in returned}
    unknown = {r.student for r in returned if r.path.stem not in stems}
    out = []
    for student, record in sorted(students.items()):
        for lab, name in notebooks.items():
            if (student, name.removesuffix(".ipynb")) in have or student in unknown:
                continue
            why = (record.nothing.get(lab)
                   or (f"collected ({record.taken[lab]}), and not in {record.folder} now" if lab in record.taken
                       else f"Lab {lab} was not collected (collect --labs {','.join(sorted(record.collected))})"))
            out.append(Returned(record.folder / student / name, student, f"missing: {why}"))
    return out
