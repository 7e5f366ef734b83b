"""Inside the box: a fork server that grades one submission, each exercise in a child process of its own.

`python labkit/course/grade/worker.py JOB --fd-in N --fd-out M [--memory BYTES] [--seconds S]` (run by its path in
the sandbox). JOB is the program the grader built (rebuild.program): the lab's given `#| export` cells and the
student's answer cells cut to their definitions. This process imports the kit and torch once and never runs a
line of the student's code itself; for each exercise the judge asks for, it forks a child that runs the program
in a fresh namespace, then either

- ``remote``: serves the judge's calls of the student's functions, answering with encoded values (wire.py): the
  checker runs in the judge, outside the box, and decides there; or
- ``local``: runs the lab's checker itself (an exercise whose objects must live in one process with the
  checker: an autograd Function, a checkpoint, a patched model), then the guard's verification, and sends a
  verdict, which is as trustworthy as the process it came from (docs/design.md, "Grading a class").

This process relays every message between the judge and the child, so the child never holds the judge's pipes;
it kills a child past the time limit and reports how each child ended. It is not dumpable: a child (same user)
cannot attach to it or read its memory. It ends with its parent, and each child with it (``_die_with_parent``).
Lab 07's leaderboard race (``race``) runs last, alone: every other process of the box is ended first (``_alone``).
What it ends, in a box and outside one: see Reach, above ``_in_box``.
"""
from __future__ import annotations

import argparse
import base64
import ctypes
import io
import json
import os
import pickle
import resource
import select
import signal
import site
import sys
import tempfile
import threading
import time
import traceback
import types
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
PARENT = os.getppid()  # read before torch loads: a parent that ended meanwhile is seen by _die_with_parent
sys.path.insert(0, str(HERE.parents[3]))  # the box's copy of the kit: labkit/course/grade/worker.py -> its root

import torch  # noqa: E402,F401  (loaded once, here, before any fork: every child starts with it)

import labkit  # noqa: E402

labkit.import_all()  # every module a checker relies on is loaded before any student code
from labkit.course import catalog  # noqa: E402
from labkit.course.grade import guard, messages, wire  # noqa: E402
from labkit.env import variables  # noqa: E402
from labkit.stubs import stub_of  # noqa: E402

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


# ---------------------------------------------------------------- in the child
def _namespace(job: dict) -> tuple[dict, dict[str, str]]:
    """Run the program: every cell in order in one fresh module; (its names, exercise -> the error its cell raised)."""
    module = types.ModuleType(f"labkit.yours.{job['module']}", f"the answers graded, lab {job['lab']}")
    sys.modules[module.__name__] = module  # dataclasses and pickle look a class's module up here
    errors: dict[str, str] = {}
    for cell in job["program"]:
        where = f"<{job['notebook']}, cell {cell['id']}>"
        try:
            exec(compile(cell["source"], where, "exec"), vars(module))
        except Exception as e:  # noqa: BLE001  (a student's cell: its exercises are graded with this error)
            for ex in cell["exercises"]:
                errors.setdefault(ex, f"{type(e).__name__}: {_first_line(e)}{_where(e)}")
    return vars(module), errors


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


def _where(e: BaseException) -> str:
    """' (at <notebook, cell c004>:7)': the innermost frame of the student's own cells."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith("<")]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _raised(e: BaseException) -> dict:
    stub = stub_of(e)
    return messages.make(messages.FROM_CHILD, "raised", type=type(e).__name__[:60], message=str(e)[:2000],
                         where=_where(e), stub=list(stub) if stub else None)


def _decode_args(blob: str, fd_in: int, fd_out: int) -> tuple[list, dict]:
    """The judge's arguments (pickled by the trusted side), callbacks turned into calls back to the judge."""
    args, kwargs = pickle.loads(base64.b64decode(blob))

    def callback(handle: int):
        def call(*a: Any, **k: Any) -> Any:
            wire.send(fd_out, messages.make(messages.FROM_CHILD, "callback", handle=handle,
                                            args=wire.encode([list(a), k])))
            try:
                answer = messages.checked(messages.TO_BOX, wire.receive(fd_in), ["returned"])
            except messages.MessageError as e:
                raise RuntimeError(f"the grader's callback did not answer ({e})") from None
            return pickle.loads(base64.b64decode(answer["value"]))
        return call

    fix = lambda v: callback(v["callback"]) if isinstance(v, dict) and set(v) == {"callback"} else v  # noqa: E731
    return [fix(a) for a in args], {k: fix(v) for k, v in kwargs.items()}


def _serve(names: dict, fd_in: int, fd_out: int, tried: list[str]) -> None:
    """Remote: answer the judge's calls until it says end, then say what the student's code tried (if anything)."""
    while True:
        message = messages.checked(messages.TO_BOX, wire.receive(fd_in), ["call", "end"])
        if message["op"] == "end":
            wire.send(fd_out, messages.make(messages.FROM_CHILD, "tried", what=list(tried)))
            return
        try:
            fn = names[message["name"]]
            args, kwargs = _decode_args(message["args"], fd_in, fd_out)
            value = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001  (whatever the student's code raises goes to the judge as data)
            if isinstance(e, KeyError) and message.get("name") not in names:
                e = NameError(f"name {message.get('name')!r} is not defined")
            wire.send(fd_out, _raised(e))
            continue
        after = [wire.encode(a) if isinstance(a, (torch.Tensor, list)) else None for a in args]  # what it changed
        wire.send(fd_out, messages.make(messages.FROM_CHILD, "result", value=wire.encode(value), after=after))


def _check_locally(exercise: dict, names: dict, fd_out: int, check: Any, threads: int, tried: list[str]) -> None:
    """Local: run the checker here, then the guard; one verdict. `check` (the raw check, without the notebook's
    display wrapper) and the guard's functions were taken before the program ran, so that nothing a definition
    did at load time (a decorator, a default argument) can swap them."""
    from labkit.checks import base

    verify, leftovers = guard.verify, guard.leftovers
    out = io.StringIO()
    try:
        args = [names[a] for a in exercise["args"]]
        with redirect_stdout(out), base.hidden_cases(exercise.get("seed")):
            check(*args)
        verdict = {"status": "passed", "message": _pass_line(out.getvalue(), exercise["id"])}
    except KeyError as e:
        verdict = {"status": "not attempted", "message": f"{e.args[0]!r} is not defined by the answer cells"}
    except base.NotAttempted as e:
        verdict = {"status": "not attempted", "message": _first_line(e)}
    except base.CheckFailure as e:
        verdict = {"status": "failed", "message": str(e)[:2000]}
    except BaseException as e:  # noqa: BLE001  (a check the student's code broke: an error, never a pass)
        verdict = {"status": "error", "message": f"{type(e).__name__}: {_first_line(e)}{_where(e)}"}
    tampered = verify(quiet=True) + leftovers(threads) + [f"tried {t}" for t in tried]
    if tampered:
        verdict = {"status": "tampered", "message": "changed what the checker relies on: " + ", ".join(tampered[:6])}
    wire.send(fd_out, messages.make(messages.FROM_CHILD, "verdict", **verdict))


# What no answer needs to do, seen by an audit hook (sys.addaudithook: it cannot be removed once added).
# Writes under /tmp (the box's own tmpfs) are a scratch pad; anywhere else they were refused by the box anyway.
_TRIED = {"os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
          "_thread.start_new_thread",
          "ctypes.dlopen", "ctypes.dlsym", "socket.connect", "socket.bind", "os.kill", "os.killpg"}
_CHANGES = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.chmod", "os.chown", "os.symlink", "os.link",
            "os.truncate", "os.utime", "shutil.rmtree"}
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


# What the box binds read-only, wherever it lies (a kit cloned under /tmp included): never the scratch pad.
_KEPT = tuple(sorted({os.path.realpath(p) + "/" for p in (HERE.parents[3], sys.prefix, sys.base_prefix,
                                                          sys.exec_prefix, *site.getsitepackages())}))


def _outside_tmp(path: Any) -> bool:
    """Whether `path` lies outside the box's own /tmp (links followed, the kit and Python's folders excluded)."""
    try:
        where = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError, OSError):
        return False  # a file descriptor, or something that is not a path
    return not where.startswith("/tmp/") or (where + "/").startswith(_KEPT)


def _threads(tried: list[str]) -> None:
    """Record each thread started (Python audits none in 3.11): threading's and _thread's start, wrapped."""
    import _thread

    start = _thread.start_new_thread

    def recorded(function: Any, *args: Any, **kwargs: Any) -> Any:
        tried.append(f"starting a thread ({getattr(function, '__qualname__', function)!s:.60})")
        return start(function, *args, **kwargs)
    _thread.start_new_thread = threading._start_new_thread = recorded


def _audit(tried: list[str]) -> None:
    """Record what the student's code tries that an answer never needs (the worker flags the exercise)."""
    def hook(event: str, args: tuple) -> None:
        if len(tried) >= 20:
            return
        if event in _TRIED:
            tried.append(f"{event}({str(args)[:80]})")
        elif event in _CHANGES and args and _outside_tmp(args[0]):
            tried.append(f"{event}({str(args[0])[:80]})")
        elif event == "open" and len(args) >= 3 and _outside_tmp(args[0]) and (
                any(c in str(args[1] or "") for c in "wax+") or (isinstance(args[2], int) and args[2] & _WRITE)):
            tried.append(f"writing {str(args[0])[:80]}")
    sys.addaudithook(hook)


def _pass_line(text: str, ex: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(f"[ex {ex}] passed")]
    return lines[-1][:300] if lines else f"[ex {ex}] passed"


def child(job: dict, exercise: dict, fd_in: int, fd_out: int, memory: int | None) -> None:
    """One exercise, in a process of its own: the program, then remote calls or the local check."""
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    os.chdir(tempfile.mkdtemp(prefix=f"ex{exercise['id']}-"))  # a fresh folder: nothing of another exercise's
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)  # what the student's code prints goes nowhere: the verdict is not read from it
    check = getattr(catalog.lab(job["lab"]).checkers, exercise["checker"])
    threads = threading.active_count()
    tried: list[str] = []
    _audit(tried)  # before the student's first line
    _threads(tried)
    names, errors = _namespace(job)
    wire.send(fd_out, messages.make(messages.FROM_CHILD, "loaded", errors=errors))
    if exercise["mode"] == "remote":
        _serve(names, fd_in, fd_out, tried)
    else:
        _check_locally(exercise, names, fd_out, check, threads, tried)


# ---------------------------------------------------------------- in the server: what it may end
# Reach. In a box, this process is the child of bubblewrap's init, pid 1 of the box's own pid namespace: every
# other process there is the submission's, and kill(-1) reaches none outside it. Anywhere else, pid 1 is the
# machine's (or a container's) init, which an orphan has for its parent too: a worker started without a box
# (--no-sandbox) whose judge died is one, and a kill of every process it sees would end every process it may
# signal (as root, all). So the box is told on positive evidence only (``_in_box``), and outside it this process
# ends only its own: those below it or in its session (the judge starts it as a session's leader; a process that
# left the session is out of reach there). Without a box, what dies with the judge is the worker and each exercise's
# child (``_die_with_parent``); a process a submission forks below that child, or one that clears its own death
# signal, can outlive them: only a box ends everything (`labkit grade` runs without one only when given --no-sandbox).
def _in_box() -> bool:
    """Whether this process is a box's worker (see Reach): the box's command line says so (variables.BOX_OF: the pid
    namespace the box was made from), this process's pid namespace is another one, and its parent is that
    namespace's pid 1 (getppid() counts in this process's namespace)."""
    made_in = variables.box_of()
    try:
        own = os.readlink("/proc/self/ns/pid")
    except OSError:
        return False
    return made_in.startswith("pid:[") and own != made_in and os.getppid() == 1


def _processes() -> dict[int, tuple[bytes, int, int]]:
    """Every process /proc shows: pid -> (state, parent, session)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                table[int(entry)] = (fields[0], int(fields[1]), int(fields[3]))
            except (OSError, ValueError, IndexError):
                continue
    return table


def _others() -> list[int]:
    """The living processes this one may end (see Reach): in a box, every one but its init and this one; outside
    one, those below this process or in its session."""
    me, boxed, table = os.getpid(), _in_box(), _processes()

    def mine(pid: int) -> bool:
        seen = set()
        while pid in table and pid not in seen:
            seen.add(pid)
            if table[pid][2] == me or table[pid][1] == me:
                return True
            pid = table[pid][1]
        return False
    return [p for p, (state, _, _) in table.items() if p not in (1, me) and state != b"Z" and (boxed or mine(p))]


def _reap() -> None:
    """Kill what a child left behind (``_others``), and collect every child of this process that has ended."""
    for pid in _others():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _relay(judge_in: int, judge_out: int, pid: int, from_child: int, to_child: int, seconds: float) -> tuple[str, int]:
    """Forward messages both ways while the child runs; (how it ended, its wait status). A child past `seconds` is
    killed; whatever it left behind is killed when it ends; a message it does not finish in time breaks the
    protocol."""
    deadline, status = time.monotonic() + seconds, None
    while True:
        if status is None:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = code
                _reap()  # grandchildren that kept its pipe open, a forked copy still running the check
        if status is None and time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
            _reap()
            return "timeout", status
        watching = [from_child] if status is not None else [judge_in, from_child]
        ready, _, _ = select.select(watching, [], [], 0.2 if status is None else 0)
        if status is not None and from_child not in ready:
            return "ended", status  # its last messages are forwarded
        try:
            if from_child in ready:
                message = wire.receive(from_child, time.monotonic() + 10)
                wire.send(judge_out, messages.make(messages.FROM_BOX, "child", message=message))
            if judge_in in ready:
                wire.send(to_child, wire.receive(judge_in))
        except EOFError:
            if status is None:
                status = os.waitpid(pid, 0)[1]
            _reap()
            return "ended", status
        except (wire.WireError, TimeoutError, OSError) as e:  # the child broke the protocol, or stalled in it
            if status is None:
                os.kill(pid, signal.SIGKILL)
                status = os.waitpid(pid, 0)[1]
            _reap()
            return f"broke the protocol ({e})", status


def run(job: dict, judge_in: int, judge_out: int, memory: int | None, seconds: float) -> None:
    """Serve the judge: {"op": "start", "exercise": {...}} forks a child that loads the program; {"op": "race", ...}
    ends every other process of the box, then forks one that races plans and loads nothing of the student's
    (``race``), limited to the message's "seconds"; {"op": "quit"} ends (anything else the judge sent for a child
    that has ended meanwhile is dropped)."""
    while True:
        message = messages.checked(messages.TO_BOX, wire.receive(judge_in))
        if message["op"] == "quit":
            return
        if message["op"] == "start":
            _fork(lambda fd_in, fd_out: child(job, message["exercise"], fd_in, fd_out, memory), judge_in, judge_out,
                  seconds)
        elif message["op"] == "race":
            left = _alone()
            _fork(lambda fd_in, fd_out: race(message, fd_out, memory, left), judge_in, judge_out,
                  float(message["seconds"]))


def _fork(target: Any, judge_in: int, judge_out: int, seconds: float) -> None:
    """Run target(fd_in, fd_out) in a child, relaying its messages to the judge, then report how it ended."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    start, server = time.monotonic(), os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: nothing of the server's pipes but its own two ends
        _die_with_parent(server)
        os.close(judge_in), os.close(judge_out), os.close(to_w), os.close(from_r)
        code = 0
        try:
            target(to_r, from_w)
        except BaseException:  # noqa: BLE001  (a child's end, whatever the student's code did)
            code = 1
        os._exit(code)
    os.close(to_r), os.close(from_w)
    how, status = _relay(judge_in, judge_out, pid, from_r, to_w, seconds)
    os.close(from_r), os.close(to_w)
    wire.send(judge_out, messages.make(messages.FROM_BOX, "ended", how=how, status=status,
                                       seconds=round(time.monotonic() - start, 2)))


# ---------------------------------------------------------------- the leaderboard's race
def _alone(rounds: int = 50) -> list[int]:
    """End every other process of the box before the race; those still living (none, in a box). The student's code
    may have left some that no exercise's reap caught (one that forks as fast as it can escapes a kill of each
    process read from /proc): in a box one kill(-1) ends them all at once (the kernel signals the whole pid
    namespace, its init and this process aside, so a fork cannot slip through); then, and without a box, each one
    seen, until none is (see Reach)."""
    if _in_box():
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass  # none to end
    left = _others()
    for _ in range(rounds):
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
        _reap()  # collects this process's children that ended
        left = _others()
    return left


def race(message: dict, fd_out: int, memory: int | None, left: list[int] | None = None, repeats: int = 5) -> None:
    """The leaderboard's race, in a child that loads none of the student's code (its plans came back as data and
    were checked by the judge): lab 07's model from seed 0, one steady step, then per budget the meter's peak of a
    step under the student's plan, its gradients judged against the plain step's (labkit.instruments.gradients), and
    its time over the reference plan's, in alternating pairs (the same plan is
    the same step: 1, untimed). Not run beside a process `left` in the box (``_alone`` could not end it)."""
    if left:
        wire.send(fd_out, messages.make(messages.FROM_CHILD, "unraced", why=f"{len(left)} processes left in the box "
                                        f"could not be ended (pids {', '.join(map(str, left[:5]))}): the race would "
                                        "time them too"))
        return
    from labkit.env.profile import sizes
    from labkit.instruments.gradients import judge
    from labkit.instruments.timing import compare
    from labkit.models import next_token_loss
    from labkit.planners import applied, measure_step
    from labkit.planners.capstone import capstone_model
    from labkit.planners.measuring import train_step
    from labkit.plans import Step

    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    torch.manual_seed(0)
    model, tokens = capstone_model(sizes())  # the model the judge profiled (leaderboard.prepare), on the CPU
    opt = torch.optim.Adam(model.parameters())
    step = train_step(model, opt, tokens, lambda out: next_token_loss(out, tokens))
    step()  # gradients and Adam's state exist: every step measured is a steady one

    def under(plan: list) -> Any:
        def run() -> None:
            with applied(model, plan):
                step()
        return run
    peaks: dict[str, dict] = {}
    for budget, steps in message["plans"].items():
        try:
            mine, ref = [Step(*s) for s in steps], [Step(*s) for s in message["reference"][budget]]
            peak = measure_step(model, opt, tokens, lambda out: next_token_loss(out, tokens), mine)
            gradients = judge(model, tokens, lambda out: next_token_loss(out, tokens), lambda: applied(model, mine))
            ratio = 1.0 if mine == ref else compare(under(ref), under(mine), repeats=repeats, warmup=1).ratio
            peaks[budget] = {"peak": int(peak), "ratio": float(ratio), **gradients.fields()}
        except Exception as e:  # noqa: BLE001  (a plan the kit cannot apply: that budget's row says why)
            peaks[budget] = {"error": f"{type(e).__name__}: {_first_line(e)}"}
    wire.send(fd_out, messages.make(messages.FROM_CHILD, "raced", peaks=peaks))


# ---------------------------------------------------------------- the server's start
def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process (SIGKILL) when its parent ends, and end it now if `parent` already has
    (Linux only). The worker without a box: a judge killed past its time (or by the OOM killer) leaves no worker
    re-parented, still running a child that never ends; the child of an exercise: no worker left, none of it."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent or (parent == 1 and not _in_box()):  # outside a box a judge is never pid 1: it
        os._exit(1)  # ended before PARENT was read, and this process was re-parented to the machine's init


def warm() -> None:
    """Do once, here, what torch initialises lazily on first use (the first backward, checkpoint, dispatch mode, an
    autograd Function, saved-tensor hooks, the kit's meter), which would otherwise cost every exercise's child a
    second or more. On one thread: a fork after OpenMP has started its pool leaves the child's pool hung."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    from labkit.env.profile import sizes
    from labkit.instruments.meter import measure_peak
    from labkit.models import GPTStack, gpt_input

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad * 2

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        state = torch.random.get_rng_state()
        x = torch.randn(4, 8, requires_grad=True)
        with Seen(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            for reentrant in (False, True):
                y = checkpoint(lambda t: F.dropout(Twice.apply(t).sin(), 0.1), x, use_reentrant=reentrant)
                y.sum().backward()
        cfg = sizes().gpt()
        model = GPTStack(cfg)
        measure_peak(lambda: model(gpt_input(cfg)).square().mean().backward(), track=model)
        torch.random.set_rng_state(state)  # every child starts from the generator the server started with
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit/course/grade/worker.py")
    parser.add_argument("job", type=Path)
    parser.add_argument("--fd-in", type=int, required=True)
    parser.add_argument("--fd-out", type=int, required=True)
    parser.add_argument("--memory", type=int, help="bytes of address space per exercise's process")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds per exercise")
    args = parser.parse_args(argv)
    _die_with_parent(PARENT)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**28, 2**28))  # no file over 256 MiB
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    job = json.loads(args.job.read_text())
    warm()
    guard.arm()  # after the warm-up: whatever it loaded is watched too
    run(job, args.fd_in, args.fd_out, args.memory, args.seconds)
    os._exit(0)  # nothing is left to flush or close, and torch's teardown would cost the class a second a box


if __name__ == "__main__":
    raise SystemExit(main())
