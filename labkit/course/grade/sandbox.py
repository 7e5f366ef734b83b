"""The box one submission runs in: bubblewrap, the network off, the grader's files out of reach.

Inside, the whole system is read-only. The kit's folder (solutions and reference answers included), the
instructor's home, the folders of the submissions and of the gradebook are each covered by an empty decoy
folder, /tmp by a fresh tmpfs; the Python environment is bound back read-only where a cover hid it. The kit's
package is a throwaway copy (of the graded kit: reference answers of the graded lab and later ones left out),
bound where the package was. After the run, any file in a decoy and any change to the copy is reported: the
submission tried to write where it must not, and is marked tampered. The worker caps memory (RLIMIT_AS, inherited
by the kernel); the grader kills the box at the notebook's time limit.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import site
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

INNER_RUN = "/tmp/run"  # the submission's working folder, as the sandbox sees it


def bwrap() -> str | None:
    """The bubblewrap executable, or None when it is not installed (Debian: apt-get install bubblewrap)."""
    return shutil.which("bwrap")


def unusable() -> str | None:
    """Why bubblewrap cannot run a box here (not installed, or no user namespaces), or None when it can."""
    if bwrap() is None:
        return "bubblewrap (bwrap) is not installed: labkit grade runs each submission in it " \
               "(Debian/Ubuntu: apt-get install bubblewrap)"
    probe = subprocess.run([bwrap(), "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bubblewrap cannot make a sandbox here ({probe.stderr.strip()[:200]})"
    return None


def _fingerprint(path: Path) -> str:
    """sha256 of a regular file (read in chunks), a link's target text, or the kind of anything else."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return "link to " + os.readlink(path)
    if stat.S_ISREG(mode):
        sha = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                sha.update(chunk)
        return sha.hexdigest()
    return f"special file (mode {mode:o})"


def digest(folder: Path) -> dict[str, str]:
    """Relative path -> fingerprint of everything under `folder` but folders (links are not followed)."""
    return {str(p.relative_to(folder)): _fingerprint(p) for p in sorted(folder.rglob("*"))
            if p.is_symlink() or not p.is_dir()}


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@dataclass
class Box:
    """What every sandbox of one grading run shares."""

    package: Path  # where labkit is imported from (the copy is bound here)
    hidden: list[Path]  # folders covered by decoys
    env: dict[str, str]

    @classmethod
    def make(cls, package: Path, hidden: list[Path], threads: int, profile: str) -> "Box":
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
               "LABKIT_PROFILE": profile, "LABKIT_CHECKS": "raise", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "MPLCONFIGDIR": "/tmp/home/.matplotlib", "IPYTHONDIR": "/tmp/home/.ipython",
               "JUPYTER_RUNTIME_DIR": "/tmp/home/.jupyter-runtime", "JUPYTER_PLATFORM_DIRS": "1",
               "LANG": "C.UTF-8", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
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

    def argv(self, copy: Path, run: Path, decoys: dict[Path, Path], inner: list[str]) -> list[str]:
        """The bwrap command line running `inner` with `copy` as the package and `run` as the working folder."""
        args = [bwrap() or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for sockets in ("/run", "/var/run"):  # the host's sockets (D-Bus, docker): read-only does not stop connect()
            if os.path.isdir(sockets) and not os.path.islink(sockets):
                args += ["--tmpfs", sockets]
        for hidden in self.hidden:
            args += ["--bind", str(decoys[hidden]), str(hidden)]
        for path in self.restores():
            args += ["--ro-bind", str(path), str(path)]
        args += ["--bind", str(copy), str(self.package), "--bind", str(run), INNER_RUN, "--dir", "/tmp/home",
                 "--chdir", INNER_RUN, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        return args + ["--"] + inner


def changes(copy: Path, expected: dict[str, str], decoys: dict[Path, Path]) -> list[str]:
    """What a run wrote where it must not: files of the kit copy changed, added or removed; files in decoys."""
    found = []
    now = digest(copy)
    for name in sorted(set(now) | set(expected)):
        if now.get(name) != expected.get(name):
            verb = "added" if name not in expected else "removed" if name not in now else "changed"
            found.append(f"{verb} labkit/{name}")
    for hidden, decoy in decoys.items():
        for path in sorted(decoy.rglob("*")):
            if path.is_symlink() or not path.is_dir():
                found.append(f"wrote {hidden / path.relative_to(decoy)}")
    return found
