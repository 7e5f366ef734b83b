"""bars/grade-slurm: the Slurm job array of docs/instructors.md ("Grading a class in parts"), submitted for real
(sbatch) to a one-node Slurm cluster, which `.ci/slurm-up` sets up (CI's long step runs it first): a class of lab 02
graded as a 2-task array of `labkit grade --shard`, its parts signed and merged, is the gradebook one run of the
class writes (but seconds). Skipped, saying why, where no Slurm cluster answers.

The job is the docs' own script, its paths and sizes replaced (each replacement must find its text: the docs cannot
drift from what runs here); the merge is the docs' "then, once" line."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from labkit.course.grade import sandbox, shards

ROOT = Path(__file__).resolve().parent.parent
STUDENTS = ("ada", "bo", "cy", "di")
TASKS = 2


def _no_slurm() -> str | None:
    """Why no job can be submitted here, or None."""
    if shutil.which("sbatch") is None:
        return "Slurm is not installed (no sbatch): .ci/slurm-up installs and starts a one-node cluster"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 30 s: is slurmctld running? (.ci/slurm-up starts it)"
    if done.returncode != 0 or not any(s.startswith(("idle", "mix", "alloc")) for s in done.stdout.split()):
        said = (done.stderr.strip() or done.stdout.strip() or "no node").splitlines()[-1]
        return f"no Slurm node is up here (sinfo: {said}): .ci/slurm-up starts a one-node cluster"
    return None


def _docs_job(returned: Path, parts: Path) -> tuple[str, str]:
    """(the docs' job script, its merge line), for a class at `returned` graded as TASKS tasks into `parts`."""
    text = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    script = text.split("A Slurm job array", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    for old, new in (("/shared/labkit", str(ROOT)), ("/shared/returned", str(returned)),
                     ("/shared/parts", str(parts)), ("/shared/grades.csv", str(parts.parent / "grades.csv")),
                     ("--array=0-3", f"--array=0-{TASKS - 1}"),
                     ("--cpus-per-task=2", "--cpus-per-task=1"), ("--jobs 2", "--jobs 1")):
        assert old in script, f"docs/instructors.md's Slurm job no longer says {old!r}: update this test with it"
        script = script.replace(old, new)
    merge = next(line for line in script.splitlines() if line.startswith("# then, once: "))
    return script, merge.removeprefix("# then, once: ")


def _class(folder: Path) -> None:
    """STUDENTS' lab 02 notebooks (passes, a wrong 2.1, stubs: bench grade's generator), one folder each."""
    import nbformat

    from labkit.course.grade import bench
    from labkit.course.grade.rebuild import Pristine

    pristine = Pristine.read("02", ROOT / "notebooks" / "02_recompute.ipynb")
    for i, name in enumerate(STUDENTS):
        (folder / name).mkdir(parents=True)
        nbformat.write(bench.submission(i + 3, pristine, ROOT)[0], folder / name / "02_recompute.ipynb")


def _book(path: Path) -> list[dict]:
    """A gradebook's rows, each without its seconds (they differ from run to run)."""
    with path.open(newline="", encoding="utf-8") as f:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]


@pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))
@pytest.mark.slow
@pytest.mark.long  # a class graded twice in the sandbox, once as a Slurm job array: minutes on two cores
def test_the_docs_slurm_job_array_merged_is_one_run_s_gradebook(tmp_path):
    why = _no_slurm()
    if why:
        pytest.skip(why)
    _class(tmp_path / "returned")
    script, merge = _docs_job(tmp_path / "returned", tmp_path / "parts")
    (tmp_path / "job.sh").write_text(script)
    env = dict(os.environ, HOME=str(tmp_path / "home"),  # the key the parts are signed with: ~/.config/labkit/
               PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")  # the merge: the kit's python3
    submitted = subprocess.run(["sbatch", "--wait", f"--output={tmp_path}/slurm-%A_%a.out", "job.sh"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=1800)
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(tmp_path.glob("slurm-*.out")))
    assert submitted.returncode == 0, submitted.stderr + logs
    assert "Submitted batch job" in submitted.stdout and len(list(tmp_path.glob("slurm-*.out"))) == TASKS, logs
    parts = sorted((tmp_path / "parts").iterdir())
    assert [p.name for p in parts] == [f"part{k}.json" for k in range(TASKS)], logs
    assert all(json.loads(p.read_text())["signature"].startswith("hmac-sha256:") for p in parts)  # signed
    assert (tmp_path / "home" / ".config" / "labkit" / "grade.key").stat().st_mode & 0o777 == 0o600
    sizes = [len({r.student for r in shards.read(p)[1]}) for p in parts]
    assert sum(sizes) == len(STUDENTS) and min(sizes) > 0, sizes  # each part a real share of the class
    merged = subprocess.run(merge, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0 and "Traceback" not in merged.stderr, merged.stderr
    one = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "labkit", "grade", str(tmp_path / "returned"),
                          "--labs", "02", "--seed", "2024", "--jobs", "1", "--out",
                          str(tmp_path / "one" / "grades.csv")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=1800)
    assert one.returncode == 0, one.stderr[-2000:]
    book = _book(tmp_path / "one" / "grades.csv")
    assert {r["student"] for r in book} == set(STUDENTS)
    assert {r["status"] for r in book} >= {"passed", "failed", "not attempted"}
    assert _book(tmp_path / "grades.csv") == book
    assert (tmp_path / "grades_students.csv").read_text() == (tmp_path / "one" / "grades_students.csv").read_text()
