"""The returned files: which are graded, under what name, read how.

Only regular files are graded: a symlink (to the kit's solution, to a classmate's notebook), a FIFO, a device or
a file over ``MOST_BYTES`` is that student's row, refused, never read. Folders are searched without following
links. A student's name is the file's path below the folder it was found in (or the file's own name): the folder
when the file is named like a lab (`alice/02_recompute.ipynb` is alice), unique, printable, its bytes that are not
UTF-8 escaped.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MOST_BYTES", "Returned", "discover", "read_text"]

MOST_BYTES = 16 * 2**20  # a returned notebook's size at most (a lab's student notebook is well under 1 MiB)


@dataclass(frozen=True)
class Returned:
    """One returned file: its path, the student it is graded for, and why it is refused ("" when it is not)."""

    path: Path
    student: str
    refused: str = ""


def _printable(text: str) -> str:
    """`text` with control characters escaped (a name is a gradebook cell and a line on the terminal)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _name(path: Path, base: Path | None, stems: set[str]) -> str:
    rel = path.relative_to(base) if base is not None else Path(path.name)
    parts = list(rel.parts)
    if Path(parts[-1]).stem in stems and len(parts) > 1:  # alice/02_recompute.ipynb: the folder names the student
        parts = parts[:-1]
    else:
        parts[-1] = Path(parts[-1]).stem
    raw = "/".join(parts)
    return _printable(os.fsencode(raw).decode("utf-8", "backslashreplace"))


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


def _clash(taken: set[str], lab: str) -> bool:
    """A name taken for the labs `taken` cannot be given for `lab`: the same lab, or either known only from the
    notebook's content ("")."""
    return bool(taken) and (not lab or "" in taken or lab in taken)


def discover(paths: list[Path], stems: set[str]) -> list[Returned]:
    """The files named (as given) and found below the folders named, each with a unique student name."""
    found: list[tuple[Path, Path | None]] = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            found += [(p, path) for p in _walk(path)]
        else:
            found.append((path, None))
    labs_of: dict[str, set[str]] = {}  # a name taken -> the labs it was taken for ("": a lab known from content only)
    returned = []
    for path, base in found:
        name = _name(path, base, stems)
        lab = path.name[:2] if path.stem in stems else ""
        unique, n = name, 1
        while _clash(labs_of.get(unique, set()), lab):  # "bob#2" may be a file's own name: the next free one
            n += 1
            unique = f"{name}#{n}"
        labs_of.setdefault(unique, set()).add(lab)
        returned.append(Returned(path, unique, _refusal(path)))
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
