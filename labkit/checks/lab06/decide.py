"""Exercise 6.3: the decision rule of the checkpointing advisor, on situations with known answers."""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from labkit.plans import SchemeCost, Situation
from labkit.checks.base import CheckFailure, hidden, need_callable, passed, remote, trap
from labkit.checks.lab06 import hints as H

MiB = 2**20
Case = tuple[str, Situation, str | None, str]  # (what, situation, the right answer, the hint a wrong one gets)


def _situation(training: bool, budget_mib: float, state_mib: float, act_mib: float,
               **schemes: tuple[float, ...]) -> Situation:
    """Schemes given as (peak, overhead) or (peak, overhead, predicted peak), in MiB; predicted is peak unless
    given (the advisor measures each peak and predicts it beside)."""
    costs = {name: SchemeCost(int(c[0] * MiB), c[1], int(c[-1 if len(c) > 2 else 0] * MiB))
             for name, c in schemes.items()}
    return Situation(training, int(budget_mib * MiB), int(state_mib * MiB), int(act_mib * MiB), costs)


def _cases() -> list[Case]:
    """The public cases, one or more per promise of the spec."""
    s = _situation
    return [
        ("parameter-dominated, within the budget", s(True, 100, 80, 4, none=(90, 0), full=(87, .4)), "none",
         H.REC_FITS),
        ("parameter-dominated, over the budget", s(True, 80, 80, 4, none=(90, 0), full=(87, .4), sqrt_n=(88, .2)),
         None, H.REC_NONE),
        ("activation-dominated, over the budget", s(True, 60, 10, 80, none=(95, 0), full=(40, .45), sqrt_n=(55, .3),
                                                    selective=(70, .1)), "sqrt_n", H.REC_LEAST),
        ("inference, over the budget", s(False, 10, 8, 0, none=(12, 0)), "none", H.REC_INFERENCE),
        ("the plain peak exactly at the budget", s(True, 50, 10, 30, none=(50, 0), full=(25, .4)), "none",
         H.REC_EQUAL),
        ("the plain peak exactly at the budget, no scheme beside it", s(True, 50, 10, 30, none=(50, 0)), "none",
         H.REC_EQUAL),
        ("a scheme exactly at the budget", s(True, 40, 10, 80, none=(95, 0), full=(40, .45), selective=(41, .1)),
         "full", H.REC_EQUAL),
        ("the cheapest scheme does not fit", s(True, 50, 10, 80, none=(95, 0), full=(40, .45), selective=(70, .1)),
         "full", H.REC_FIT_ONLY),
        ("two schemes of equal overhead", s(True, 60, 10, 80, none=(95, 0), full=(45, .3), sqrt_n=(55, .3)), "full",
         H.REC_TIE),
        ("two schemes of equal overhead, the lower peak last and last by name",
         s(True, 60, 10, 80, none=(95, 0), full=(55, .3), selective=(45, .3)), "selective", H.REC_TIE),
        ("the cheapest scheme predicted to fit, measured over the budget",
         s(True, 50, 10, 80, none=(95, 0), full=(40, .45), selective=(56, .1, 48)), "full", H.REC_MEASURED),
        ("a scheme measured within the budget, predicted over it",
         s(True, 60, 10, 80, none=(95, 0), full=(40, .45), sqrt_n=(58, .3, 63)), "sqrt_n", H.REC_MEASURED),
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


def _promised(drawn: random.Random) -> list[tuple[str, Situation]]:
    """One drawn situation per promise, in this order: inference, the plain peak within the budget and at it, the
    least overhead among fitting schemes, a scheme at the budget, the cheapest unfit, a tie whose lower peak comes
    last (in order and by name), a prediction that fits where the measured peak does not (and the other way),
    nothing fits. Other schemes stand in a drawn order."""
    r = lambda lo, hi: drawn.randint(lo, hi) * MiB  # noqa: E731
    budget, low, high = r(40, 60), drawn.choice([0.1, 0.2]), drawn.choice([0.3, 0.45])
    over, under = (lambda: budget + r(1, 20)), (lambda: budget - r(1, 20))  # noqa: E731

    def at(peak: int, overhead: float, predicted: int | None = None) -> SchemeCost:
        return SchemeCost(peak, overhead, peak if predicted is None else predicted)
    shapes = {
        "inference over the budget": (False, {"full": at(under(), high)}),
        "the plain peak within the budget": (True, {"none": under(), "full": at(under(), high)}),
        "the plain peak at the budget": (True, {"none": budget, "full": at(under(), high)}),
        "the least overhead of those that fit": (True, {"selective": at(budget - r(1, 5), low),
                                                        "full": at(budget - r(10, 20), high)}),
        "a scheme at the budget": (True, {"sqrt_n": at(budget, low), "full": at(under(), high)}),
        "the cheapest over the budget": (True, {"selective": at(over(), low), "full": at(under(), high)}),
        "a tie, the lower peak last": (True, {"full": at(budget - r(1, 5), high),
                                             "sqrt_n": at(budget - r(6, 20), high)}),
        "the cheapest predicted to fit, measured over": (True, {"selective": at(budget + r(1, 9), low,
                                                                                budget - r(1, 9)),
                                                               "full": at(under(), high)}),
        "a scheme measured to fit, predicted over": (True, {"sqrt_n": at(budget - r(1, 9), low, budget + r(1, 9)),
                                                           "full": at(budget - r(10, 20), high)}),
        "nothing fits": (True, {"full": at(over(), high), "sqrt_n": at(over(), low)}),
    }
    found = []
    for what, (training, schemes) in shapes.items():
        peak = schemes.pop("none", budget + r(5, 40))
        names = list(schemes)
        if what != "a tie, the lower peak last":
            drawn.shuffle(names)
        none = SchemeCost(peak, 0.0, peak if training else None)  # an inference step: no prediction
        costs = {"none": none, **{n: schemes[n] for n in names}}
        found.append((f"drawn: {what}", Situation(training, budget, r(1, 20), r(1, 80), costs)))
    return found


def _random(drawn: random.Random) -> Situation:
    """A situation drawn whole: its schemes, peaks, overheads and budget."""
    plain = drawn.randint(20, 100) * MiB
    schemes = {"none": SchemeCost(plain, 0.0, plain)}
    for name in drawn.sample(["full", "sqrt_n", "selective"], drawn.randint(0, 3)):
        peak = drawn.randint(10, 100) * MiB
        schemes[name] = SchemeCost(peak, drawn.choice([0.1, 0.2, 0.3, 0.45]), peak + drawn.randint(-5, 5) * MiB)
    return Situation(drawn.random() < 0.85, drawn.randint(10, 100) * MiB, drawn.randint(1, 20) * MiB,
                     drawn.randint(1, 80) * MiB, schemes)


def _why(s: Situation, got: Any, want: str | None) -> str:
    """The hint for answer `got` where the rule gives `want` (the hidden cases carry no hint of their own)."""
    plain = s.schemes["none"]
    if not s.training:
        return H.REC_INFERENCE
    if want == "none":
        return H.REC_EQUAL if plain.peak_bytes == s.budget else H.REC_FITS
    if want is None:
        return H.REC_NONE
    right = s.schemes[want]
    if right.peak_bytes == s.budget:
        return H.REC_EQUAL
    if right.predicted_bytes is not None and right.predicted_bytes > s.budget:
        return H.REC_MEASURED
    if got in s.schemes and s.schemes[got].overhead == right.overhead:
        return H.REC_TIE
    return H.REC_LEAST


def _hidden_cases() -> list[Case]:
    """Situations drawn afresh under `labkit grade`, their answers by _rule: one per promise, and eight whole."""
    drawn = hidden("6.3")
    if drawn is None:
        return []
    found = _promised(drawn) + [(f"drawn situation {i + 1}", _random(drawn)) for i in range(8)]
    return [(what, s, _rule(s), "") for what, s in found]


def _unfit(s: Situation, got: str) -> str:
    """The hint for a scheme over the budget: chosen by its prediction, or whatever its peak."""
    c = s.schemes[got]
    return H.REC_MEASURED if c.predicted_bytes is not None and c.predicted_bytes <= s.budget else H.REC_FIT_ONLY


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
            raise CheckFailure("6.3", label, repr(want), repr(got),
                               _unfit(s, got) if unfit else hint or _why(s, got, want))
    passed("6.3", f"recommend decides as the advisor on {len(cases)} situations: inference, fitting, over budget, "
                  "nothing fits, at the budget, ties, measured peaks over predicted ones")
