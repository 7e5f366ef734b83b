"""What every checker shares: the failure types, calling student code, the pass line."""
from __future__ import annotations

import contextlib
import functools
import linecache
import os
import random
import sys
import traceback
from collections.abc import Iterator
from typing import Any, Callable

from labkit.env import variables
from labkit.stubs import stub_of

Known = tuple[tuple[str, str], ...]  # (text in an error message, the hint it calls for)
_LABKIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CheckFailure(AssertionError):
    """An exercise check that failed: what, expected, got, and a hint."""

    def __init__(self, ex: str, what: str, expected: Any, got: Any, hint: str):
        self.ex, self.what, self.expected, self.got, self.hint = ex, what, expected, got, hint
        super().__init__(f"[ex {ex}] {what}: expected {expected}, got {got}.\nHint: {hint}")


class NotAttempted(CheckFailure):
    """The exercise's stub still raises NotImplementedError."""

    def __init__(self, ex: str, stub: str):
        AssertionError.__init__(
            self,
            f"[ex {ex}] not attempted: the stub still raises NotImplementedError ({stub}).\n"
            "Hint: replace the stub in the exercise cell with your code, run that cell, then this one.",
        )
        self.ex, self.what, self.expected, self.got = ex, "not attempted", None, None
        self.hint = "fill in the exercise"


def need_callable(ex: str, name: str | None, obj: Any) -> None:
    """A CheckFailure unless `obj` (what the student passed as `name`, if known) is callable."""
    __tracebackhide__ = True  # IPython and pytest hide this frame
    if not callable(obj):
        what = f"what was passed as {name}" if name else "what was passed to the checker"
        raise CheckFailure(ex, what, "a function", f"{type(obj).__name__} {obj!r:.60}",
                           f"pass the function {name + ' ' if name else ''}you defined in the exercise cell, "
                           "not its result")


def _ours(filename: str) -> bool:
    """A frame of torch or of labkit's own code (labkit.reference is students' code, as they wrote it)."""
    path = os.path.abspath(filename)
    in_labkit = path.startswith(_LABKIT + os.sep) and not path.startswith(os.path.join(_LABKIT, "reference"))
    return os.sep + "torch" + os.sep in path or in_labkit


def _where(e: BaseException) -> str:
    """' (at file:line)' of the innermost frame outside torch and labkit: the student's line (as the grader's box
    saw it, for an error that came from there)."""
    if isinstance(getattr(e, "labkit_where", None), str):
        return e.labkit_where
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not _ours(f.filename)]
    if not frames:
        return ""
    name = os.path.basename(frames[-1].filename)
    in_cell = "ipykernel_" in frames[-1].filename or name.startswith("<ipython-input")
    return f" (at {'line ' if in_cell else name + ':'}{frames[-1].lineno}{' of the cell that defines it' if in_cell else ''})"


def student_failure(ex: str, what: str, e: Exception, hint: str, known: Known = ()) -> CheckFailure:
    """The CheckFailure (or NotAttempted) that exception `e` of student code stands for."""
    if isinstance(e, CheckFailure):
        return e
    if stub_of(e) is not None:
        return NotAttempted(ex, str(e))
    hint = next((h for text, h in known if text in str(e)), hint)
    message = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else ""
    return CheckFailure(ex, what, "it to run", f"{type(e).__name__}: {message:.200}{_where(e)}", hint)


@contextlib.contextmanager
def trap(ex: str, what: str, hint: str, known: Known = ()) -> Iterator[None]:
    """Turn any exception of student code inside the block into a CheckFailure with a hint."""
    __tracebackhide__ = True
    try:
        yield
    except Exception as e:  # student code may raise anything; each becomes a report, not a traceback
        raise student_failure(ex, what, e, hint, known) from None


def attempt(ex: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call student code `fn`; a stub's NotImplementedError becomes NotAttempted, other errors propagate."""
    __tracebackhide__ = True
    need_callable(ex, None, fn)
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        if stub_of(e) is not None:
            raise NotAttempted(ex, str(e)) from None
        raise


# ---------------------------------------------------------------- grading: hidden cases, and where a check runs
_HIDDEN: list[int] = []  # the seed of the cases the student never saw, while `labkit grade` runs a check


@contextlib.contextmanager
def hidden_cases(seed: int | None) -> Iterator[None]:
    """While inside, a checker that has hidden cases draws them from `seed` (None: the public cases only)."""
    _HIDDEN.append(seed)
    try:
        yield
    finally:
        _HIDDEN.pop()


def hidden_seed() -> int | None:
    """The seed of the hidden cases `labkit grade` asks for, or None (in a notebook, the public cases only)."""
    return _HIDDEN[-1] if _HIDDEN else None


def hidden(ex: str) -> random.Random | None:
    """The generator of Exercise `ex`'s hidden cases (a stream of its own, from the run's seed), or None when no
    hidden cases are asked for: a checker draws them besides its public ones, so that an answer written for the
    cases a student can read fails the ones it never saw."""
    seed = hidden_seed()
    return None if seed is None else random.Random(f"labkit {seed} {ex}")


def remote(check: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a check that only calls the student's functions on data and reads data back: `labkit grade` runs it
    outside the student's process, each call answered by the sandboxed student code
    (docs/design.md, "Grading a class")."""
    check.remote = True
    return check


@contextlib.contextmanager
def refusing(ex: str, what: str, forbidden: dict, hint: str) -> Iterator[None]:
    """While inside, a call of any function whose code is a key of `forbidden` (its name the value) fails the
    check with `hint`, before any other failure: an exercise that builds a thing may not call the library's
    (sys.setprofile sees every Python call, under whatever name the student's code holds the function)."""
    __tracebackhide__ = True
    seen: list[str] = []
    previous = sys.getprofile()

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in forbidden and not seen:
            seen.append(forbidden[frame.f_code])

    sys.setprofile(watch)
    try:
        yield
    except BaseException:
        if seen:
            raise CheckFailure(ex, what, "your own from scratch", f"a call of {seen[0]}", hint) from None
        raise
    finally:
        sys.setprofile(previous)
    if seen:
        raise CheckFailure(ex, what, "your own from scratch", f"a call of {seen[0]}", hint)


def passed(ex: str, what: str) -> None:
    """Print the one line of a passed check."""
    print(f"[ex {ex}] passed: {what}")


def expect_error(ex: str, what: str, kind: type[Exception], words: str, hint: str, fn: Callable[..., Any],
                 *args: Any) -> None:
    """fn(*args) must raise `kind` with `words` in its message."""
    __tracebackhide__ = True
    try:
        fn(*args)
    except kind as e:
        if words not in str(e):
            raise CheckFailure(ex, what, f"a {kind.__name__} naming {words!r}", f"{type(e).__name__}: {e}"[:160],
                               hint) from None
        return
    except NotImplementedError:
        raise
    except Exception as e:  # the wrong kind of error
        raise CheckFailure(ex, what, f"a {kind.__name__}", f"{type(e).__name__}: {e}"[:160], hint) from None
    raise CheckFailure(ex, what, f"a {kind.__name__}", "no error", hint)


def interactive() -> bool:
    """Is a person running this notebook in a frontend that takes input (JupyterLab, Notebook, VS Code)?

    Such frontends send `allow_stdin=True` with each cell; headless runners (nbval, nbclient, `labkit grade`)
    send False. A checker then shows its failure and returns, so Run All goes on to the end, while a
    headless run still counts the failure. LABKIT_CHECKS=raise|show overrides the guess.
    """
    mode = variables.checks_mode()
    if mode:
        return mode == "show"
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return bool(getattr(getattr(shell, "kernel", None), "_allow_stdin", False))


def checker(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The student-facing checker `lk.checks.ex_N_M`: its failures carry the message and hint, never its source.

    Any error escaping the check becomes a CheckFailure naming the student's line; the exception is raised
    without the checker's frames, or, in an interactive frontend, printed (stderr) so Run All continues.
    """
    ex = fn.__name__.removeprefix("ex_").replace("_", ".")

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # a check that did not pass, or student code that raised inside it
            failure = student_failure(ex, "your code, called by the checker", e,
                                      "run your function by hand on a small input to see where it fails")
        if interactive():
            print(failure.args[0], file=sys.stderr)
            return None
        exec(_RAISE, {"failure": failure.with_traceback(None)})  # the last frame: no source for IPython to show

    return run


# Raised from a code object of one line, so a traceback's last frame shows that line, not the checker.
_RAISE_TEXT = "raise failure from None  # the check did not pass: what it checked and a hint are below\n"
_RAISE = compile(_RAISE_TEXT, "<lk.checks>", "exec")
linecache.cache["<lk.checks>"] = (len(_RAISE_TEXT), None, [_RAISE_TEXT], "<lk.checks>")
