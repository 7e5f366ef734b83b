"""A hub that was really booted: JupyterHub on loopback, students pulling the release bundle into their homes with the
nbgitpuller link of docs/instructors.md, the kit installed by the README's hub path, and an instructor collecting
and grading them from her own JupyterLab terminal (`make long-test`, CI's second step).

The students' servers run a hub image's Python (tests/helpers/hubenv.py): torch and Jupyter installed, the kit not. Each
student logs in (a shared password), gets a single-user JupyterLab of that Python in a home of its own, opens the
link to a local git copy of a lab 00-01 bundle, installs the kit with the README's hub commands in the pulled
bundle (as in a terminal of the hub: JupyterHub's variables set, their own HOME, so the kit goes to their
~/.local), and runs both notebooks, untouched, on the `cpu` profile, as a student on a CPU hub would: the three
kernels run at once. Every notebook must run to its end with only the stubs'
errors, in a kernel that imports the bundle's labkit. Each student's peak resident memory per lab (kernel and server) is written to build/hub/memory.json and
printed: the table the README's hub section gives an admin.

The instructor (bars/hub-gradebook): students of a lab 01-02 bundle leave their homes in the states of
tests/helpers/classroom.py, by JupyterLab's own save, Duplicate and Rename and a second nbgitpuller pull that merges a
later release into an edited notebook; then the instructor, in a terminal of her own JupyterLab, runs the README's
instructor commands word for word from her clone (`make hub`, release, collect over the homes as the shell expands
them, grade in the sandbox): every student a row with the verdicts of tests/helpers/classroom.py, none for her.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat

import pytest

from helpers import hub as hub_module
from helpers.hub import PROXY, Hub, Student, processes
from helpers.hubenv import fresh_copy, image_python, run_hub_path
from helpers.jupyter_browser import CHROMIUM, CHROMIUM_ARGS, NEEDS_CHROMIUM, problems
from labkit.course import release, student

ROOT = Path(__file__).resolve().parent.parent
STUDENTS = ("ada", "grace", "alan")
LABS = ("00_start_here", "01_activation_memory")
HANDOUT = "labkit-handout"  # the bundle's repository, as the README's link names it

try:
    import jupyterhub  # noqa: F401
    import nbgitpuller  # noqa: F401
    HAVE_HUB = True
except ImportError:
    HAVE_HUB = False

pytestmark = [pytest.mark.hub, pytest.mark.slow, *NEEDS_CHROMIUM,
              pytest.mark.skipif(not HAVE_HUB, reason="jupyterhub or nbgitpuller is not installed "
                                                      "(pip install -e '.[dev]')"),
              pytest.mark.skipif(not PROXY, reason="configurable-http-proxy is not installed "
                                                   "(npm install -g configurable-http-proxy)")]


def _bundle(folder: Path, labs: tuple[str, ...] = ("00", "01")) -> str:
    """A release bundle of `labs` committed to a git repository of its own: its file:// address."""
    repo = folder / HANDOUT
    release.write(ROOT, repo, list(labs))
    git = ["git", "-C", str(repo), "-c", "user.name=labkit", "-c", "user.email=labkit@localhost"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "the lab 00-01 bundle"]):
        subprocess.run([*git, *args], check=True)
    return repo.as_uri()


def _kernel_labkit(python: Path, name: str) -> str:
    """Where `import labkit` leads in this student's running kernel, asked anew with the kernel's own Python,
    environment and folder."""
    (pid,) = processes(lambda env, cmd: env.get("JUPYTERHUB_USER") == name and "ipykernel" in cmd)
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in kv)
    found = subprocess.run([str(python), "-c", "import labkit; print(labkit.__file__)"], env=env,
                           cwd=os.readlink(f"/proc/{pid}/cwd"), capture_output=True, text=True, check=True)
    return found.stdout.strip()


def test_three_students_pull_the_bundle_and_run_labs_00_and_01_side_by_side(tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    repo = _bundle(tmp_path)
    # the students' servers and kernels run a hub image's Python, which has torch and Jupyter but not the kit; each
    # student installs the bundle's labkit (the answers withheld) into it by the README's hub path
    python = image_python(tmp_path / "image")
    monkeypatch.setattr(hub_module, "CONFIG", hub_module.CONFIG +
                        f"c.Spawner.cmd = [{str(python.with_name('jupyterhub-singleuser'))!r}]\n")
    hub = Hub.start(tmp_path, {"LABKIT_PROFILE": "cpu", "MPLBACKEND": "module://matplotlib_inline.backend_inline"},
                    pythonpath=f"{HANDOUT}/notebooks")  # a folder with no labkit: the kit comes from the install
    found, memory = [], {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            students = [Student(hub, browser.new_context(viewport={"width": 1280, "height": 900}), name)
                        for name in STUDENTS]
            for s in students:
                s.log_in()
                s.pull(repo, f"lab/tree/{HANDOUT}/notebooks/{LABS[0]}.ipynb")
                home = tmp_path / "home" / s.name
                done = run_hub_path(home / HANDOUT, python, home, extra={
                    "JUPYTERHUB_USER": s.name, "JUPYTERHUB_SERVICE_PREFIX": f"/user/{s.name}/"})
                if done.returncode != 0:
                    found.append(f"{s.name}: the README's hub path failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
                # the link opened lab 00 before the install: its kernel cannot import the kit until restarted, as
                # make hub says; the student does so
                if "Kernel > Restart Kernel" not in done.stdout:
                    found.append(f"{s.name}: make hub did not tell to restart a kernel started before it")
                if s.restart_kernels() < 1:
                    found.append(f"{s.name}: the link's notebook had no running kernel to restart")
            for lab in LABS:
                for s in students:  # all three started before any is waited for: side by side
                    s.start_run_all(f"{HANDOUT}/notebooks/{lab}.ipynb")
                for s in students:
                    cells = s.finish()
                    found += problems(f"{s.name}: {lab}", cells, student=True)
                    imported = _kernel_labkit(python, s.name)  # the bundle's, pulled into this student's home
                    if not imported.startswith(f"{tmp_path}/home/{s.name}/{HANDOUT}/labkit/"):
                        found.append(f"{s.name}: {lab}: the kernel imports labkit from {imported}")
                    kernel, server = s.peaks()
                    memory.setdefault(lab, {})[s.name] = {"kernel_bytes": kernel, "server_bytes": server}
            browser.close()
    finally:
        hub.stop()
    out = ROOT / "build" / "hub"
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(memory, indent=1) + "\n")
    for lab, rows in memory.items():
        for name, m in rows.items():
            print(f"{lab:22} {name:6} kernel {m['kernel_bytes'] / 2**20:7.1f} MiB, server "
                  f"{m['server_bytes'] / 2**20:6.1f} MiB")
    assert found == [], "\n".join(found)
    homes = [tmp_path / "home" / n / HANDOUT / "notebooks" / f"{LABS[1]}.ipynb" for n in STUDENTS]
    assert all(h.exists() for h in homes), "the link did not pull the bundle into every home"
    assert all((tmp_path / "home" / n / ".local").is_dir() for n in STUDENTS), "the kit went to each student's home"
    assert all(m["kernel_bytes"] > 0 for rows in memory.values() for m in rows.values()), memory


def _revise(repo: Path, notebook: str) -> str:
    """A later release, committed: `notebook`'s title cell reworded, its mark with it, as the generator writes it.
    The words added."""
    path = repo / "notebooks" / notebook
    nb = nbformat.read(path, as_version=4)
    added = "\n\n(Revised in week 3.)"
    nb.cells[0].source += added
    nb.cells[0].metadata["labkit"]["generated"] = student.generated_digest(nb.cells[0].source)
    nbformat.write(nb, path)
    git = ["git", "-C", str(repo), "-c", "user.name=labkit", "-c", "user.email=labkit@localhost"]
    subprocess.run([*git, "commit", "-q", "-am", "week 3: lab 02's title revised"], check=True)
    return added.strip()


def _unmarked(path: Path) -> list[str]:
    """The ids of `path`'s cells that lost the generator's mark (JupyterLab, nbgitpuller: none may)."""
    return [c.id for c in nbformat.read(path, as_version=4).cells if "generated" not in c.metadata.get("labkit", {})]


def test_an_instructor_collects_from_her_terminal_and_grades_every_student_a_row(tmp_path, monkeypatch):
    """bars/hub-gradebook in a booted hub: the homes of tests/helpers/classroom.py, made by what students do in JupyterLab
    (save, Duplicate, Rename) and nbgitpuller (a merge), collected and graded by the README's instructor commands in
    the instructor's own JupyterLab terminal."""
    from helpers import classroom
    from playwright.sync_api import sync_playwright

    repo = _bundle(tmp_path / "bundle", ("01", "02"))
    python = image_python(tmp_path / "image")
    monkeypatch.setattr(hub_module, "CONFIG", hub_module.CONFIG +
                        f"c.Spawner.cmd = [{str(python.with_name('jupyterhub-singleuser'))!r}]\n")
    homes, notebooks = tmp_path / "home", f"{HANDOUT}/notebooks"
    classroom.clone(homes / "carol")  # cloned the whole kit, did nothing
    (homes / "gil").mkdir(parents=True)  # never did anything
    clone = fresh_copy(homes / "instructor" / "labkit")  # the instructor's clone, answers and all
    hub = Hub.start(tmp_path, {"PATH": f"{python.parent}:{os.environ['PATH']}"}, pythonpath=notebooks)
    found, said = [], []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            people = {name: Student(hub, browser.new_context(viewport={"width": 1280, "height": 900}), name)
                      for name in ("dana", "erin", "fay", "instructor")}
            lab = f"{notebooks}/{classroom.NOTEBOOK}"
            for name, person in people.items():
                person.log_in()
                if name != "instructor":
                    person.pull(repo, f"lab/tree/{lab}")
            if people["dana"].edit(lab, classroom.answer_sources(classroom.EXERCISES)) != 5:
                found.append("dana: her five answer cells were not all found by id in JupyterLab")
            people["fay"].edit(lab, classroom.answer_sources(("2.1",)))
            copy = people["fay"].duplicate(lab)
            people["erin"].rename(lab, f"{notebooks}/{classroom.RENAMED}")
            added = _revise(tmp_path / "bundle" / HANDOUT, classroom.NOTEBOOK)  # a later release, then dana's click
            people["dana"].pull(repo, f"lab/tree/{lab}")
            (homes / "fay" / lab).unlink()  # as in her terminal: the original, a link out of her home
            (homes / "fay" / lab).symlink_to(clone / "solutions" / classroom.NOTEBOOK)
            # her terminal is a login shell, whose /etc/profile here sets root's PATH: the image's Python first again,
            # as a hub image's own profile puts it
            door = [f"export PATH={python.parent}:$PATH", "cd labkit",
                    *(c.replace("/home/*", f"{homes}/*") for c in _instructor_door())]
            for command, (status, shown) in zip(door, people["instructor"].terminal(door)):
                said.append(shown)
                if status != 0:
                    found.append(f"instructor: `{command}` ended {status}:\n{shown[-3000:]}")
            browser.close()
    finally:
        hub.stop()
    dana = homes / "dana" / lab
    if copy != f"{notebooks}/{classroom.DUPLICATE}":
        found.append(f"fay: JupyterLab's Duplicate made {copy}")
    for path in (dana, homes / "fay" / notebooks / classroom.DUPLICATE, homes / "erin" / notebooks / classroom.RENAMED):
        if _unmarked(path):
            found.append(f"{path}: cells {_unmarked(path)} lost the generator's mark")
    if added not in dana.read_text():
        found.append("dana: nbgitpuller did not merge the later release into her notebook")
    assert found == [], "\n".join(found)
    collected = next(s for s in said if "labkit collect: " in s)
    assert classroom.problems(clone / "grades.csv", collected) == [], collected[-4000:]


def _instructor_door() -> list[str]:
    """The README's instructor commands, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text[text.index("**An instructor**"):], re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
