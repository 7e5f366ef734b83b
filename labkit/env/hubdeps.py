"""The kit's dependencies on a hub image's Python, installed without touching what the image has (`make hub`).

    python3 labkit/env/hubdeps.py [--dry-run] [PIP ARGUMENTS, e.g. --user]

Run as a file, by the Python the hub's kernels use, after `pip install --no-deps -e .`: it imports nothing of the
kit (whose imports need what this installs), only the standard library and pip's vendored `packaging`.

Each dependency in pyproject.toml but torch is, in that Python:
- present at a version the kit allows: kept;
- present but older than the kit's floor: kept, and named (an image's JupyterLab or numpy upgraded into ~/.local
  would shadow the image's own, under the server the hub runs, for every later session);
- missing: installed, with every distribution the Python has pinned to its version (a constraints file), so that
  pip installs what is missing and what that needs, and upgrades nothing the image has (where it cannot, pip
  stops and names the conflict);
- missing and the hub's own server (JupyterLab): never installed by the kit; named.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import subprocess
import sys
import tempfile
from pathlib import Path

try:  # Python 3.11+; pip vendors the same parser for 3.10
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[2]
KEPT_BY_THE_IMAGE = frozenset({"torch"})  # never installed or upgraded: the image's build for its GPUs
SERVER_SIDE = frozenset({"jupyterlab"})  # the hub's own server: the image's choice, never the kit's


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """The kit's dependencies as pyproject.toml lists them, but torch."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [r for r in map(Requirement, deps) if canonicalize_name(r.name) not in KEPT_BY_THE_IMAGE]


def installed() -> dict[str, str]:
    """{canonical name: version} of every distribution this Python imports, the first found on sys.path (the one
    an import gets) where a name is installed twice; the kit itself left out."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        md = dist.metadata  # None, or without a Name or a Version, where a dist-info is broken: such a one is left out
        name = canonicalize_name((md.get("Name") if md is not None else None) or "")
        version = md.get("Version") if md is not None else None
        if name and version and name != "labkit" and name not in found:
            found[name] = version
    return found


def plan(wanted: list[Requirement], have: dict[str, str]) -> dict[str, list[str]]:
    """{"install": [requirement, ...], "older": [message, ...], "server": [name, ...], "kept": [name, ...]}."""
    out: dict[str, list[str]] = {"install": [], "older": [], "server": [], "kept": []}
    for req in wanted:
        name = canonicalize_name(req.name)
        version = have.get(name)
        if version is None:
            out["server" if name in SERVER_SIDE else "install"].append(name if name in SERVER_SIDE else str(req))
        elif _allowed(req, version):
            out["kept"].append(name)
        else:
            out["older"].append(f"{req.name} {version} (the kit asks {req.specifier})")
    return out


def _allowed(req: Requirement, version: str) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except (InvalidVersion, TypeError):
        return False  # a version pip cannot compare: named, never replaced


def constraints(have: dict[str, str]) -> str:
    """Every distribution the Python has, pinned: pip may add, never change."""
    lines = []
    for name, version in sorted(have.items()):
        try:
            Version(version)
        except (InvalidVersion, TypeError):
            continue  # pip could not read the pin either; the install leaves it as it is unless a package needs it
        lines.append(f"{name}=={version}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="say what would be installed; install nothing")
    args, pip_args = parser.parse_known_args(argv)  # the rest goes to pip install (--user: the user site)
    have = installed()
    todo = plan(requirements(), have)
    for line in todo["older"]:
        print(f"labkit: the image's {line}: kept, not upgraded (an upgrade in your home would shadow the image's "
              "own under the hub's server); the labs may fail where they need the newer one: ask the hub's admin")
    for name in todo["server"]:
        print(f"labkit: this Python has no {name}: the hub's server is the image's choice and the kit installs "
              "none; open the notebooks in the hub's own interface")
    if not todo["install"]:
        print(f"labkit: every other dependency is in the image ({len(todo['kept'])} kept as they are)")
        return 0
    if args.dry_run:
        print(f"labkit: would install what the image lacks: {' '.join(todo['install'])} (nothing it has changed)")
        return 0
    print(f"labkit: installing what the image lacks: {' '.join(todo['install'])} (nothing it has is changed)",
          flush=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="labkit-image-", delete=False) as pins:
        pins.write(constraints(have))
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", *pip_args,
                               "-c", pins.name, *todo["install"]])
    finally:
        os.unlink(pins.name)
    if done.returncode != 0:
        print(f"labkit: pip could not install {' '.join(todo['install'])} (above: why; where it names a conflict, "
              "they need a package the image has at another version: ask the hub's admin to add them to the image)")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
