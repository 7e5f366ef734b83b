"""What every checker shares: the failure types, calling student code, the pass line."""
from __future__ import annotations

from typing import Any, Callable


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


def attempt(ex: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call student code `fn`; a stub's NotImplementedError becomes NotAttempted."""
    __tracebackhide__ = True  # IPython and pytest hide this frame
    if not callable(fn):
        raise CheckFailure(ex, "what was passed to the checker", "a function", f"{type(fn).__name__} {fn!r:.60}",
                           "pass the function you defined in the exercise cell, not its result")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        if str(e).startswith("Exercise "):
            raise NotAttempted(ex, str(e)) from None
        raise


def passed(ex: str, what: str) -> None:
    """Print the one line of a passed check."""
    print(f"[ex {ex}] passed: {what}")
