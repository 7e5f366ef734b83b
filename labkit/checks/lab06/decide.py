"""Exercise 6.3: the decision rule of the checkpointing advisor, on situations with known answers."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.plans import SchemeCost, Situation
from labkit.checks.base import CheckFailure, need_callable, passed, remote, trap
from labkit.checks.lab06 import hints as H

MiB = 2**20


def _situation(training: bool, budget_mib: float, state_mib: float, act_mib: float,
               **schemes: tuple[float, float]) -> Situation:
    costs = {name: SchemeCost(int(peak * MiB), overhead) for name, (peak, overhead) in schemes.items()}
    return Situation(training, int(budget_mib * MiB), int(state_mib * MiB), int(act_mib * MiB), costs)


def _cases() -> list[tuple[str, Situation, str | None, str]]:
    """(what, situation, the right answer, the hint a wrong answer gets)."""
    return [
        ("parameter-dominated, within the budget", _situation(True, 100, 80, 4, none=(90, 0), full=(87, .4)),
         "none", H.REC_FITS),
        ("parameter-dominated, over the budget", _situation(True, 80, 80, 4, none=(90, 0), full=(87, .4),
                                                           sqrt_n=(88, .2)), None, H.REC_NONE),
        ("activation-dominated, over the budget", _situation(True, 60, 10, 80, none=(95, 0), full=(40, .45),
                                                            sqrt_n=(55, .3), selective=(70, .1)), "sqrt_n",
         H.REC_LEAST),
        ("inference, over the budget", _situation(False, 10, 8, 0, none=(12, 0)), "none", H.REC_INFERENCE),
        ("the plain peak exactly at the budget", _situation(True, 50, 10, 30, none=(50, 0), full=(25, .4)),
         "none", H.REC_EQUAL),
        ("a scheme exactly at the budget", _situation(True, 40, 10, 80, none=(95, 0), full=(40, .45),
                                                     selective=(41, .1)), "full", H.REC_EQUAL),
        ("the cheapest scheme does not fit", _situation(True, 50, 10, 80, none=(95, 0), full=(40, .45),
                                                       selective=(70, .1)), "full", H.REC_FIT_ONLY),
        ("two schemes of equal overhead", _situation(True, 60, 10, 80, none=(95, 0), full=(45, .3),
                                                    sqrt_n=(55, .3)), "full", H.REC_TIE),
    ]


@remote
def ex_6_3(recommend: Callable[..., Any]) -> None:
    """Exercise 6.3: recommend(situation) names the scheme labkit's advisor would, on every case."""
    __tracebackhide__ = True
    need_callable("6.3", "recommend", recommend)
    cases = _cases()
    for what, s, want, hint in cases:
        label = f"recommend(<{what}>)"
        with trap("6.3", label, H.REC_SPEC):
            got = recommend(s)
        if got is not None and (not isinstance(got, str) or got not in s.schemes):
            raise CheckFailure("6.3", label, f"one of {sorted(s.schemes)} or None", f"{got!r:.60}", H.REC_SPEC)
        if got != want:
            unfit = got not in (None, "none") and s.schemes[got].peak_bytes > s.budget
            raise CheckFailure("6.3", label, repr(want), repr(got), H.REC_FIT_ONLY if unfit else hint)
    passed("6.3", f"recommend decides as the advisor on {len(cases)} situations: inference, fitting, over budget, "
                  "nothing fits, at the budget, ties")
