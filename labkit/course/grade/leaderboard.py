"""`labkit grade --leaderboard`: lab 07's planners raced on the lab's model at the lab's budgets, ranked.

Outside every box, once (``prepare``): the capstone's model (labkit.planners.capstone, from seed 0, on the
grading profile) is profiled, the budgets are those `bench plan` races PyTorch's peers at (its ``budgets``), and
the kit's reference planner, given by the caller (the CLI passes labkit.labs.capstone.plan_for: the answers are
never imported here), plans each. In each student's box, after the exercises (judge.py): a child loads the
student's program and the judge calls its `plan_for(profile, budget)` through the pipe, as a remote checker calls
a function; each plan comes back as data and is checked here (``plan_of``). Then a child that runs none of the
student's code (worker.race) trains the same model under each plan: the meter's peak of a steady step, the
step's one-step gradients judged against the plain step's from the same seed (labkit.instruments.gradients:
bitwise, rounding or wrong), and its time over the reference plan's, timed in alternating pairs in that box. A
plan fits when its measured peak is at most the budget, to the byte, and its gradients are not wrong; a plan over
budget, judged wrong or never judged never ranks; a planner that raised, returned no plan or a plan that is not
one of the model's is a row that says why. ``rows`` ranks each budget's fitting plans by
their time ratio (plans within ``TIE`` of a rank's fastest share it), ``write`` writes leaderboard.csv and a static
leaderboard.html. The race runs alone in its box (worker.py ends every other process of the box first) and within
``race_seconds``, sized from the profile's measured step.
"""
from __future__ import annotations

import base64
import csv
import html
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.course.grade.report import cell
from labkit.instruments.gradients import GRADIENTS
from labkit.planners.capstone import COUNT
from labkit.plans import RECOMPUTE, Profile, Step, describe

__all__ = ["LAB", "COUNT", "REPEATS", "TIE", "SLACK", "COLUMNS", "prepare", "plan_of", "race_steps", "race_seconds",
           "judged", "fill", "rows", "write", "described"]

LAB = "07"
REPEATS = 5  # alternating pairs per budget (a tiny step takes milliseconds)
TIE = 0.02  # ratios within 2% of a rank's fastest plan share its rank: a box's timing noise is about that size
SLACK = 10  # the race's limit over its steps at the plain step: a plan's step may take twice as long, on a share of
#             the cores (a box has cpu_count / --jobs threads; the profile was timed with all of them)
COLUMNS = ("budget", "student", "fits", "peak", "over_reference", "gradients", "rank", "plan", "why")


def prepare(reference: Callable[[Profile, int], list[Step]], profile_name: str) -> dict[str, Any]:
    """The race every box runs: {"profile": the capstone's Profile, pickled (the judge hands it to each planner),
    "budgets": [...], "reference": {str(budget): [[start, stop, how], ...]}, "step": the profile's plain step's
    seconds, measured here (``race_seconds`` sizes the race's limit from it)}."""
    import torch

    from labkit.env.profile import sizes
    from labkit.planners.capstone import budgets, capstone

    with torch.random.fork_rng():
        torch.manual_seed(0)
        profile = capstone(sizes(profile_name)).profile
    chosen = budgets(profile, len(profile.blocks))  # COUNT of them, as bench plan races the peers at
    plans = {str(b): _steps(reference(profile, b)) for b in chosen}
    return {"profile": base64.b64encode(pickle.dumps(profile)).decode(), "budgets": chosen, "reference": plans,
            "step": profile.step}


def _steps(plan: list[Step]) -> list[list]:
    return [[s.start, s.stop, s.how] for s in plan]


def plan_of(value: Any, profile: Profile) -> tuple[list[list] | None, str]:
    """(the plan as [[start, stop, how], ...] of plain ints and strs, "") when `value`, what a student's planner
    returned (rebuilt from the box's answer), is a plan of the profile's blocks: Steps covering them in order, each
    way one the block offers; else (None, why not). The plan goes on as JSON and into the kit's code, so a field that
    is not exactly an int or a str (a bool, a float, a tensor, a numpy scalar) is refused, not converted."""
    if type(value) not in (list, tuple) or not value:
        return None, f"plan_for returned {type(value).__name__}, not a list of Step"
    steps = []
    for i, s in enumerate(value):
        why = f"item {i} is a {type(s).__name__}, not a Step" if type(s) is not Step else _unplain(s)
        if why:
            return None, f"plan_for's plan: {why}"
        steps.append([s.start, s.stop, s.how])
    at, n = 0, len(profile.blocks)
    for start, stop, how in steps:
        if start != at or not start < stop <= n:
            return None, f"not a plan of blocks 0..{n} in order: {value!r:.120}"
        if how != RECOMPUTE and (stop != start + 1 or how not in profile.blocks[start].ways()):
            return None, (f"step {Step(start, stop, how)!r:.60} is not a way block {start} offers "
                          f"({', '.join(profile.blocks[start].ways())})")
        at = stop
    if at != n:
        return None, f"the plan covers blocks 0..{at}, not all {n}"
    return steps, ""


def _unplain(step: Step) -> str:
    """Why `step`'s fields are not the plain values a plan is sent on as ("" when they are)."""
    for name, kind in (("start", int), ("stop", int), ("how", str)):
        value = getattr(step, name)
        if type(value) is not kind:
            return (f"{step!r:.80}: its {name} is a {type(value).__name__} ({value!r:.40}); a Step's start and stop "
                    "must be plain ints and its how a plain str")
    return ""


JUDGE_STEPS = 4  # the forwards and backwards a plan's gradients take at most: the plan's and the plain step's,
#                 then, where they differ, both again with dropout off (the rounding bound of labkit.instruments.gradients)


def race_steps(budgets: int) -> int:
    """The training steps worker.race runs for `budgets` plans: one to warm, then per plan the meter's two, its
    gradients' JUDGE_STEPS and compare's warm-up and REPEATS pairs (two steps each)."""
    return 1 + budgets * (2 + JUDGE_STEPS + 2 * (1 + REPEATS))


def race_seconds(step: float, budgets: int, seconds: float) -> float:
    """The race's time limit: SLACK times its steps at `step`, the plain step's seconds ``prepare`` measured (the
    profile's), and never less than `seconds`, one exercise's limit."""
    return float(max(seconds, SLACK * race_steps(budgets) * step))


def judged(got: dict[str, Any]) -> dict[str, Any]:
    """The gradient fields of the race's answer for one plan, as a row carries them ({"gradients",
    "gradient_difference", "gradient_why"}), checked: an answer without a verdict, or with one that is not one of
    labkit.instruments.gradients.GRADIENTS, is {"gradients": "", "gradient_why": why}, and such a plan never ranks."""
    verdict, apart = got.get("gradients"), got.get("gradient_difference")
    if verdict not in GRADIENTS or type(apart) is not float:
        return {"gradients": "", "gradient_why": f"not judged by its gradients (the race answered gradients="
                                                 f"{verdict!r:.40}, gradient_difference={apart!r:.40})"}
    why = got.get("why") if verdict == "wrong" else ""
    return {"gradients": verdict, "gradient_difference": apart,
            "gradient_why": f"gradients wrong against the plain step: {str(why or '')[:200]}" if verdict == "wrong"
            else ""}


def fill(raced: dict[str, dict], graded: list) -> None:
    """A row that says why for each student of lab 07 whose planner was not raced (a file that is no notebook, a
    box that died): the first of that student's gradebook rows."""
    for r in graded:
        if r.lab == LAB and r.student not in raced:
            raced[r.student] = {"why": f"not raced: {r.status}: {r.message}"[:300]}


def _rank(entries: list[dict]) -> None:
    """Rank the fitting entries of one budget by their time over the reference's (1 is the fastest): a plan within
    TIE (relative) of the fastest plan of the rank before it shares that rank; the next that is not takes its place
    in the order (1, 1, 3)."""
    fitting = sorted((e for e in entries if e["fits"] is True), key=lambda e: e["over_reference"])
    lead = None  # the fastest plan of the rank being handed out
    for i, e in enumerate(fitting):
        if lead is None or e["over_reference"] > lead["over_reference"] * (1 + TIE):
            lead, e["rank"] = e, i + 1
        else:
            e["rank"] = lead["rank"]


def rows(race: dict[str, Any], raced: dict[str, dict]) -> list[dict]:
    """One row per student and budget, budgets in order, ranked (`raced`: student -> the judge's race answer,
    {"budgets": [{budget, plan, peak, over_reference, why}, ...]} or {"why": ...} where none was run)."""
    out = []
    for budget in race["budgets"]:
        here = []
        for student, answer in sorted(raced.items()):
            found = next((b for b in answer.get("budgets", []) if b.get("budget") == budget), None)
            if found is None:
                here.append({"budget": budget, "student": student, "fits": "", "peak": "", "over_reference": "",
                             "gradients": "", "rank": "", "plan": "", "why": answer.get("why") or "not raced"})
                continue
            here.append(_row(budget, student, found))
        _rank(here)
        out += here
    return out


def _row(budget: int, student: str, found: dict[str, Any]) -> dict[str, Any]:
    """One student's row at `budget` from the judge's answer for it: it fits when its peak is at most the budget
    and its gradients were judged and are not wrong; else `why` says which (the race's own why first)."""
    peak, verdict = found.get("peak"), found.get("gradients", "")
    measured = isinstance(peak, int)
    over = measured and peak > budget
    fits = measured and not found.get("why") and not over and verdict in ("bitwise", "rounding")
    why = found.get("why") or ("" if fits else f"over budget: its step peaks at {peak:,} B > {budget:,} B" if over
                               else found.get("gradient_why") or "not judged by its gradients")
    return {"budget": budget, "student": student, "fits": fits if measured else "", "peak": peak if measured else "",
            "over_reference": found.get("over_reference", ""), "gradients": verdict if measured else "", "rank": "",
            "plan": found.get("plan", ""), "why": why}


def _shown(row: dict) -> dict:
    ratio = row["over_reference"]
    return {**row, "over_reference": f"{ratio:.3f}" if isinstance(ratio, float) else ratio,
            "fits": {True: "yes", False: "no"}.get(row["fits"], "")}


def write(table: list[dict], folder: Path) -> tuple[Path, Path]:
    """leaderboard.csv and leaderboard.html (one page, no script, nothing fetched) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    book, page = folder / "leaderboard.csv", folder / "leaderboard.html"
    with book.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: cell(v) for k, v in _shown(r).items()} for r in table)
    page.write_text(_html(table), encoding="utf-8")
    return book, page


def _html(table: list[dict]) -> str:
    """The leaderboard as a static page: a table per budget, ranked plans first."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Lab 07 leaderboard</title><style>"
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}tr.out td{color:#888}</style></head><body>",
             "<h1>Lab 07: the planners at the lab's budgets</h1><p>Each plan's step, timed in alternating pairs "
             "against the kit's reference planner's in the same box (below 1: faster); a plan fits when the meter's "
             "peak of its step is at most the budget and its one-step gradients, against the plain step's from the "
             "same seed, are bitwise equal or apart by rounding. A plan over budget or whose gradients are wrong is "
             f"not ranked; plans within {TIE:.0%} of a rank's fastest share its rank.</p>"]
    for budget in dict.fromkeys(r["budget"] for r in table):
        here = sorted((r for r in table if r["budget"] == budget),
                      key=lambda r: (r["rank"] == "", r["rank"] or 0, r["student"]))
        parts.append(f"<h2>Budget {budget:,} B ({budget / 2**20:.3f} MiB)</h2><table><tr>"
                     + "".join(f"<th>{c}</th>" for c in ("rank", "student", "fits", "peak (B)", "time / reference",
                                                         "gradients", "plan", "why")) + "</tr>")
        for r in map(_shown, here):
            cells = (r["rank"], r["student"], r["fits"], f"{r['peak']:,}" if r["peak"] != "" else "",
                     r["over_reference"], r["gradients"], r["plan"], r["why"])
            parts.append(f"<tr class='{'' if r['rank'] else 'out'}'>"
                         + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    return "".join(parts) + "</body></html>\n"


def described(plan: list[list]) -> str:
    """A plan's one line, as lab 07 prints it."""
    return describe([Step(*s) for s in plan])
