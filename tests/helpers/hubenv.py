"""A hub image's Python, as a student finds it: torch and Jupyter installed, the kit not. And the README's hub
path run in it (tests/test_hub_install.py, tests/test_hub.py).

`fresh_copy(folder)` is a clone of the kit (its tracked files). `image_python(folder)` makes a virtual
environment that reads the system's and the user's site-packages, as a hub image's conda Python does, and links
every distribution of this venv into it but the kit's own: torch, JupyterLab, ipywidgets, jupyterhub-singleuser are
there, `import labkit` fails. `readme_hub_commands()` reads the commands of the README's hub door; `run_hub_path`
runs them in a clone with JupyterHub's variables set, as a student's terminal in the hub has them.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HUB_VARIABLES = {"JUPYTERHUB_SERVICE_PREFIX": "/user/ada/", "JUPYTERHUB_API_URL": "http://127.0.0.1:1/hub/api",
                 "JUPYTERHUB_USER": "ada"}


def image_python(folder: Path) -> Path:
    """`folder`/bin/python: torch and Jupyter (this venv's, linked), a user site, no labkit."""
    subprocess.run([sys._base_executable, "-m", "venv", "--system-site-packages", "--without-pip", str(folder)],
                   check=True)
    python = folder / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if re.match(r"(__editable__[._])?labkit", entry.name):
            continue  # the kit is what the student installs
        target = purelib / entry.name
        if not target.exists():
            target.symlink_to(entry)
    for sub in ("etc/jupyter", "share/jupyter"):  # server extensions enabled (nbgitpuller), lab extensions (widgets)
        if (Path(sys.prefix) / sub).is_dir() and not (folder / sub).exists():
            (folder / sub).parent.mkdir(parents=True, exist_ok=True)
            (folder / sub).symlink_to(Path(sys.prefix) / sub)
    for script in ("jupyterhub-singleuser", "jupyter-lab", "jupyter"):  # the image's commands, on its Python
        module = {"jupyterhub-singleuser": "jupyterhub.singleuser", "jupyter-lab": "jupyterlab.labapp",
                  "jupyter": "jupyter_core.command"}[script]
        path = folder / "bin" / script
        path.write_text(f"#!{python}\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
        path.chmod(0o755)
    return python


def fresh_copy(folder: Path) -> Path:
    """The files a clone of this commit holds (the tracked files, as in the working tree), in `folder`."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(source.read_bytes())
    return folder


def readme_hub_commands() -> list[str]:
    """The commands of the README's hub door, run in the kit's folder: the fenced block after the line that
    starts "**On a JupyterHub", without the clone and the `cd` into it, comments dropped."""
    text = (ROOT / "README.md").read_text()
    door = text[text.index("**On a JupyterHub"):]
    block = re.search(r"```sh\n(.*?)```", door, re.S).group(1)
    commands = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [c for c in commands if c and not c.startswith(("git clone", "cd ", "#"))]


def run_hub_path(clone: Path, python: Path, home: Path, extra: dict[str, str] | None = None,
                 commands: list[str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The README's hub commands in `clone`, as a hub's terminal runs them: JupyterHub's variables set, the image's
    Python first on PATH, the student's HOME."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("TORCH_")}
    env.update(HUB_VARIABLES, PATH=f"{python.parent}:{env['PATH']}", HOME=str(home), **(extra or {}))
    script = " && ".join(commands if commands is not None else readme_hub_commands())
    return subprocess.run(["/bin/sh", "-c", script], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=timeout)
