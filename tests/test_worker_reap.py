"""What the grader's worker ends (worker.py, "Reach"): in a box, every other process of the box; outside one (an
orphan of a judge that died, its parent now pid 1), only its own; and a worker without a box ends with its judge.

Every scene runs in a pid namespace of its own (``unshare --pid --fork --mount-proc``), as its pid 1: a worker
that wrongly ends every process it sees ends only the scene's, never this machine's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.course.grade import sandbox

ROOT = Path(__file__).resolve().parent.parent


def _unshare() -> list[str] | None:
    """The command line that runs a command as pid 1 of a new pid namespace with its own /proc, or None."""
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return None
    own = ["--pid", "--fork", "--mount-proc"]
    for flags in (own, ["--user", "--map-root-user", *own]):  # as root; else as root of a user namespace
        probe = subprocess.run(["unshare", *flags, sys.executable, "-c", "import os; assert os.getpid() == 1"],
                               capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["unshare", *flags]
    return None


UNSHARE = _unshare()
needs_unshare = pytest.mark.skipif(UNSHARE is None, reason="needs unshare and a pid namespace of its own")


def _scene(source: str, *args: str) -> dict:
    """Run `source` as pid 1 of a pid namespace of its own (it refuses to run anywhere else); what it printed last."""
    env = {k: v for k, v in os.environ.items() if k != sandbox.BOX_OF}
    guarded = "import os, sys\nif os.getpid() != 1:\n    sys.exit(3)\n" + source
    done = subprocess.run([*UNSHARE, sys.executable, "-c", guarded, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# pid 1: a victim that is not the worker's, and a worker orphaned into a session of its own (its judge, the
# process between, ends), which then reaps as after an exercise and ends what it may before a race.
ORPHAN = r'''
import json, select, subprocess, time
victim = subprocess.Popen(["sleep", "600"])
r, w = os.pipe()
if os.fork() == 0:  # the judge
    if os.fork() == 0:  # the worker
        os.setsid()
        while os.getppid() != 1:
            time.sleep(0.01)
        mark = {"none": "", "this": os.readlink("/proc/self/ns/pid")}.get(sys.argv[1], sys.argv[1])
        if mark:
            os.environ[sys.argv[2]] = mark
        from labkit.course.grade import worker
        worker._reap()
        left = worker._alone(rounds=3)
        boxed = worker._in_box()
        os.write(w, json.dumps({"boxed": boxed, "left": left}).encode())
        os._exit(0)
    os._exit(0)
os.close(w)
os.wait()  # the judge
ready = select.select([r], [], [], 240)[0]
said = json.loads(os.read(r, 4096) or b"{}") if ready else {}
time.sleep(0.2)
print(json.dumps({"worker": said, "victim": victim.poll()}))
'''


@needs_unshare
@pytest.mark.slow  # the worker's module loads torch: seconds
@pytest.mark.parametrize("box, ended", [
    ("none", False),  # an orphan without a box: its parent is pid 1 (its judge died), and no box named
    ("this", False),  # said to be boxed, but in the pid namespace it names: no box of its own
    ("outside", True),  # the box's own worker: the box named the namespace it was made from
])
def test_an_orphaned_worker_ends_every_process_only_in_a_box(box, ended):
    made_in = os.readlink("/proc/self/ns/pid") if box == "outside" else box
    seen = _scene(ORPHAN, made_in, sandbox.BOX_OF)
    assert seen["worker"].get("boxed") is ended, seen
    assert (seen["victim"] is not None) is ended, seen  # None: the victim still runs
    assert seen["worker"]["left"] == [], seen


# pid 1: a judge without a box (the worker started in a session of its own, as judge.py starts it) asks for an
# exercise whose program never ends; once it runs, the judge is killed. What else is left in the namespace?
JUDGE = r'''
import os, subprocess, sys, time
from labkit.course.grade import wire
to_r, to_w = os.pipe()
from_r, from_w = os.pipe()
subprocess.Popen([sys.executable, "labkit/course/grade/worker.py", sys.argv[1], "--fd-in", str(to_r), "--fd-out",
                  str(from_w), "--seconds", "600"], pass_fds=(to_r, from_w), start_new_session=True)
wire.send(to_w, {"op": "start", "exercise": {"id": "7.1", "checker": "ex_7_1", "args": ["plan_for"],
                                             "mode": "remote", "seed": None}})
time.sleep(600)
'''
KILLED = r'''
import json, subprocess, time
judge = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1]])
started, deadline = sys.argv[2], time.monotonic() + 240
while not os.path.exists(started) and time.monotonic() < deadline:
    time.sleep(0.1)
ran = os.path.exists(started)
judge.kill()
judge.wait()

def living():
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if int(entry) != 1 and f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    out.append(open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:200])
        except OSError:
            continue
    return out

deadline = time.monotonic() + 20
while living() and time.monotonic() < deadline:
    try:
        os.waitpid(-1, os.WNOHANG)  # orphans come to pid 1
    except ChildProcessError:
        pass
    time.sleep(0.1)
print(json.dumps({"ran": ran, "left": living()}))
'''


@needs_unshare
@pytest.mark.slow  # a worker starts (torch, its warm-up): about 10 s on two cores
def test_a_worker_without_a_box_ends_with_its_judge_and_its_exercise_with_it(tmp_path):
    started = tmp_path / "started"
    program = f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\nwhile True:\n    time.sleep(1)\n"
    job = {"lab": "07", "module": "lab07", "notebook": "lab07.ipynb", "exercises": [],
           "program": [{"id": "c001", "source": program, "exercises": ["7.1"]}]}
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(job))
    seen = _scene(KILLED, str(job_file), str(started), JUDGE)
    assert seen["ran"], seen  # the exercise's program was running when its judge was killed
    assert seen["left"] == [], seen


# pid 1: a judge that ends before its worker reads its parent (PARENT, at import): the worker then has pid 1 for a
# parent from its first line, and no box; _die_with_parent must end it, not take init for its judge.
LATE = r"""
import select
r, w = os.pipe()
if os.fork() == 0:  # the judge
    if os.fork() == 0:  # the worker
        os.close(r)
        while os.getppid() != 1:
            time.sleep(0.01)
        from labkit.course.grade import worker
        os.write(w, b"parent %d;" % worker.PARENT)
        worker._die_with_parent(worker.PARENT)
        os.write(w, b"lived")
        os._exit(0)
    os._exit(0)
os.close(w)
os.wait()  # the judge
said, deadline = b"", time.monotonic() + 240
while time.monotonic() < deadline:
    if not select.select([r], [], [], 1)[0]:
        continue
    chunk = os.read(r, 64)
    if not chunk:  # every writer ended
        break
    said += chunk
print(json.dumps({"said": said.decode()}))
"""


@needs_unshare
@pytest.mark.slow  # the worker's module loads torch: seconds
def test_a_worker_whose_judge_ended_before_it_started_ends_at_once():
    seen = _scene("import json, time\n" + LATE)
    assert seen["said"] == "parent 1;", seen  # it read pid 1 for its parent, then ended in _die_with_parent


@pytest.mark.slow  # a grader's templates of lab 02: seconds
def test_a_worker_without_a_box_is_never_told_it_is_in_one(monkeypatch):
    """The marker of a box (sandbox.BOX_OF) in the grader's own environment (a grader run inside a box, or a test's)
    does not reach a worker started with --no-sandbox: only Box.argv sets it."""
    from labkit.course.grade import grader
    from labkit.course.grade.options import Limits, Options
    monkeypatch.setenv(sandbox.BOX_OF, os.readlink("/proc/self/ns/pid") if os.path.exists("/proc/self/ns/pid")
                       else "pid:[1]")
    grade = grader.Grader(Options((), ("02",), Limits(seed=1), sandbox=False, root=ROOT), [])
    try:
        command = grade._command("02", ROOT / "job.json", 0)
    finally:
        grade.close()
    assert sandbox.BOX_OF not in command["env"] and command["env"]["LABKIT_PROFILE"] == grade.limits.profile
