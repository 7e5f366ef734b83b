"""Student notebooks and grading, the nbval way (docs/design.md, "Notebooks under nbval").

* Every student notebook, under Run All as JupyterLab runs it, reaches its last
  cell; its only errors are the stubs' NotImplementedError and the checkers'
  "not attempted", and every checker reports "not attempted" (tests/helpers/run_all.py).
* A completed notebook graded with `pytest --nbval-lax` passes exactly when its
  checker cells pass: a completed notebook passes whole (Labs 00 and 02 here;
  every solution passes nbval in `make test` and `labkit grade` in
  test_grade.py); planted wrong answers fail their checker cells (and checkers
  of exercises built on them), no other cell.
These run under the `tiny` profile: grading checks behaviour, not figures.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from labkit.course.catalog import LABS

ROOT = Path(__file__).resolve().parent.parent
STUDENT = [lab.student(ROOT) for lab in LABS]
SOLUTIONS = [lab.solution(ROOT) for lab in LABS]
CHECKER_CALL = "lk.checks.ex_"

ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*m")  # IPython colours its tracebacks

pytestmark = pytest.mark.slow


def grade(notebook: Path, tmp_path: Path) -> dict[int, str | None]:
    """Run `pytest --nbval-lax` on a notebook; map code-cell index -> failure text (None if passed)."""
    report = tmp_path / f"{notebook.stem}.xml"
    env = dict(os.environ, LABKIT_PROFILE="tiny", PYTHONHASHSEED="0", **ONE_THREAD)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                    "--nbval-current-env", f"--junitxml={report}", str(notebook)],
                   cwd=notebook.parent, env=env, capture_output=True, text=True, timeout=900)
    results = {}
    for case in ET.parse(report).iter("testcase"):
        index = int(case.get("name").split()[-1])  # nbval names items "Cell N", N the code-cell index
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        text = None if failure is None else failure.get("message", "") + (failure.text or "")
        results[index] = None if text is None else ANSI.sub("", text)
    return results


def code_cells(notebook: Path) -> list[str]:
    """Sources of the code cells, in nbval's numbering."""
    return [c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]


ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # two kernels at once on two cores: one thread each


def two_at_a_time(fn, items):
    """fn over items, two at a time (each call waits on a kernel or a subprocess: the machine has two cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(items, pool.map(fn, items)))


# The browser tests (tests/test_browser.py) run every student notebook in JupyterLab itself; where they run,
# this headless copy of JupyterLab's Run All would only check the same thing again.
try:
    import playwright  # noqa: F401
    from helpers.jupyter_browser import CHROMIUM
except ImportError:
    CHROMIUM = None
IN_BROWSER = pytest.mark.skipif(bool(CHROMIUM), reason="the browser tests run Run All on every student notebook "
                                                       "in JupyterLab (tests/test_browser.py)")


@pytest.fixture(scope="module")
def run_all_reports():
    """tests/helpers/run_all.py on every student notebook: (exit status, its report)."""
    def run(notebook):
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "run_all.py"), str(notebook)], capture_output=True,
                              text=True, timeout=900, env=dict(os.environ, LABKIT_PROFILE="tiny", **ONE_THREAD))
        return done.returncode, done.stdout[-3000:] + done.stderr[-1500:]
    return two_at_a_time(run, STUDENT)


@IN_BROWSER
@pytest.mark.parametrize("notebook", STUDENT, ids=[p.name for p in STUDENT])
def test_run_all_on_an_untouched_student_notebook_reaches_the_end(notebook, run_all_reports):
    status, report = run_all_reports[notebook]
    assert status == 0, report
    assert any(CHECKER_CALL in s for s in code_cells(notebook)), f"{notebook.name} has no checker cell"


def completed(solution: Path, tmp_path: Path) -> Path:
    """A student's completed notebook: the solution's sources, no outputs."""
    nb = nbformat.read(solution, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    path = tmp_path / solution.name
    nbformat.write(nb, path)
    return path


COMPLETED = [p for p in SOLUTIONS if p.name[:2] in ("00", "02")]


@pytest.mark.parametrize("solution", COMPLETED, ids=[p.name for p in COMPLETED])
def test_completed_notebook_passes_grading(solution, tmp_path):
    results = grade(completed(solution, tmp_path), tmp_path)
    failed = {i: f for i, f in results.items() if f is not None}
    assert not failed, f"{solution.name}: cells failed under --nbval-lax: {sorted(failed)}\n{next(iter(failed.values()), '')[-1500:]}"


WRONG_ANSWERS = {  # solution -> [(text in the answer, the wrong text, the checker that must fail)], planted together
    "00_start_here": [("t.numel() * t.element_size()", "t.numel() * 4", "ex_0_1")],
    "01_activation_memory": [("(n_layers + 1) * batch", "2 * n_layers * batch", "ex_1_1"),
                             ("return t.detach()  # not t", "return t  # not t", "ex_1_5")],
    "02_recompute": [("        torch.set_rng_state(state.cpu)\n", "", "ex_2_2"),
                     ("return rebuilt[task].pop(index)", "return rebuilt[task][index]", "ex_2_5")],
    "03_sqrt_n": [("bounds = [i * n // segments for i in range(segments + 1)]",
                   "bounds = [i * (n // segments) for i in range(segments)] + [n]", "ex_3_1"),
                  ("top = room // unit", "top = -(-room // unit)", "ex_3_4"),  # issue 50: the budget rounded up
                  ("need = np.maximum.accumulate(np.where(js > s, x[js], 0) + f[js])",
                   "need = np.maximum.accumulate(f[js])", "ex_3_5")],  # issue 50: an F's input left out
    "04_selective": [("leaves, spec = self.kept.pop(key)", "leaves, spec = self.kept[key]", "ex_4_1"),
                     ("key=lambda r: -keep_bytes(r) / max(r.seconds, 1e-12))",  # ties toward the later op
                      "key=lambda r: keep_bytes(r) / max(r.seconds, 1e-12))[::-1]", "ex_4_2"),
                     ("weight = [-(-w // unit) for w in weights]", "weight = [w // unit for w in weights]", "ex_4_3")],
    "05_roofline": [("    return max(compute_seconds(r, c), r.bytes_moved / c.peak_bandwidth, rand)",
                     "    return compute_seconds(r, c) + r.bytes_moved / c.peak_bandwidth + rand", "ex_5_1"),
                    ("replace(r, seconds=float(seconds_of(r)))",  # a record's measured seconds kept
                     "replace(r, seconds=r.seconds if r.seconds is not None else float(seconds_of(r)))", "ex_5_2")],
    "06_pitfalls": [("    differ = bits(a) != bits(b)", "    differ = a != b", "ex_6_1"),
                    ("            bn.momentum, bn.num_batches_tracked = 0.0, None\n", "", "ex_6_2"),
                    ('and c.peak_bytes <= s.budget]', 'and c.predicted_bytes <= s.budget]', "ex_6_3")],
    "07_capstone": [("    top = (budget - profile.base) // unit", "    top = budget // unit", "ex_7_1"),
                    ("if profile.floor > budget or profile.base > budget:", "if profile.floor > budget:", "ex_7_1")],
}


@pytest.fixture(scope="module")
def wrong_results(tmp_path_factory):
    """Each lab completed with its wrong answers planted, graded: name -> (the notebook, nbval's results)."""
    tmp = tmp_path_factory.mktemp("wrong")

    def plant_and_grade(name):
        folder = tmp / name
        folder.mkdir()
        path = completed(ROOT / "solutions" / f"{name}.ipynb", folder)
        nb = nbformat.read(path, as_version=4)
        for right, wrong, _ in WRONG_ANSWERS[name]:
            (cell,) = [c for c in nb.cells if c.cell_type == "code" and right in c.source]
            cell.source = cell.source.replace(right, wrong)
        nbformat.write(nb, path)
        return path, grade(path, folder)
    return two_at_a_time(plant_and_grade, list(WRONG_ANSWERS))


@pytest.mark.parametrize("name", WRONG_ANSWERS)
def test_wrong_answers_fail_at_checker_cells_only(name, wrong_results):
    path, results = wrong_results[name]
    sources = code_cells(path)
    failed = [i for i, f in results.items() if f is not None]
    assert failed, "a wrong answer passed grading"
    assert all(CHECKER_CALL in sources[i] for i in failed), f"non-checker cells failed: {failed}"
    for _, _, checker in WRONG_ANSWERS[name]:
        assert any(f"{CHECKER_CALL}{checker[3:]}(" in sources[i] for i in failed), f"{checker} did not fail"


# ---------------------------------------------------------------- quiet diffs (docs/design.md, "Quiet diffs")
# One solution executed twice: what changes between two executions is the machinery's (labkit.course.notebook, the
# doctor's cell), the same for every lab; each lab's own outputs are held to a second execution by nbval in
# `make test`, which executes every solution again and compares each unmarked cell with the committed output.
QUIET = [p for p in SOLUTIONS if p.name.startswith("00")]


@pytest.mark.parametrize("solution", QUIET, ids=[p.name for p in QUIET])
def test_executing_twice_changes_only_machine_dependent_cells(solution, tmp_path):
    paths = []
    for run in ("first", "second"):
        paths.append(tmp_path / run / solution.name)
        paths[-1].parent.mkdir()
        shutil.copy(solution, paths[-1])
    env = dict(os.environ, LABKIT_PROFILE="tiny", **ONE_THREAD)
    # the two executions side by side (`make solutions` runs the same command), each in its own process and kernel
    procs = [subprocess.Popen([sys.executable, "-m", "labkit", "execute", str(p)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for p in paths]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-2000:]
    runs = [nbformat.read(p, as_version=4) for p in paths]
    assert runs[0].metadata == runs[1].metadata
    for index, (a, b) in enumerate(zip(runs[0].cells, runs[1].cells)):
        if a.cell_type == "code" and "NBVAL_IGNORE_OUTPUT" in a.source:
            a, b = dict(a, outputs=[]), dict(b, outputs=[])
        assert a == b, f"{solution.name} cell {index} ({a.get('id')}) differs between two executions"


@pytest.mark.parametrize("notebook", SOLUTIONS + STUDENT, ids=[f"{p.parent.name}/{p.name}" for p in SOLUTIONS + STUDENT])
def test_no_timing_metadata_and_no_addresses(notebook):
    text = notebook.read_text()
    assert "iopub." not in text and '"execution":' not in text, "timing metadata: execute with labkit.course.notebook"
    assert re.search(r"at 0x[0-9a-f]+", text) is None, "an object's address in an output: assign it (`_ = ...`)"
