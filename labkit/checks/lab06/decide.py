"""Exercise 6.3: the decision rule of the checkpointing advisor, on situations with known answers."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.plans import SchemeCost, Situation
from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote, trap
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


def _rule(s: Situation) -> str | None:
    """The advisor's rule, written for the checker (so that the hidden cases need no notebook's copy): the first
    fitting scheme in order of overhead, then peak."""
    if not s.training:
        return "none"
    if s.schemes["none"].peak_bytes <= s.budget:
        return "none"
    ranked = sorted((c.overhead, c.peak_bytes, name) for name, c in s.schemes.items() if name != "none")
    return next((name for _, peak, name in ranked if peak <= s.budget), None)


def _hidden_cases() -> list[tuple[str, Situation, str | None, str]]:
    """Situations drawn afresh under `labkit grade`, their answers by _rule."""
    drawn = hidden("6.3")
    if drawn is None:
        return []
    found = []
    for i in range(8):
        schemes = {"none": (drawn.randint(20, 100), 0.0)}
        for name in drawn.sample(["full", "sqrt_n", "selective"], drawn.randint(0, 3)):
            schemes[name] = (drawn.randint(10, 100), drawn.choice([0.1, 0.2, 0.3, 0.45]))
        s = _situation(drawn.random() < 0.85, drawn.randint(10, 100), drawn.randint(1, 20), drawn.randint(1, 80),
                       **schemes)
        found.append((f"drawn situation {i + 1}", s, _rule(s), H.REC_LEAST))
    return found


@remote
def ex_6_3(recommend: Callable[..., Any]) -> None:
    """Exercise 6.3: recommend(situation) names the scheme labkit's advisor would, on every case."""
    __tracebackhide__ = True
    need_callable("6.3", "recommend", recommend)
    cases = _cases() + _hidden_cases()
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
