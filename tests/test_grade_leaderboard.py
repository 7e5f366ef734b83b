"""`labkit grade --leaderboard`: lab 07's planners raced in their boxes at the lab's budgets, ranked.

The first tests run nothing (a plan checked as data, the ranks, the files); the long one grades a class of three
lab 07 notebooks (the solution, a planner over budget, a stub) in the sandbox and reads its leaderboard."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from labkit.course.grade import leaderboard, sandbox
from labkit.plans import BlockCosts, Option, Profile, Step

ROOT = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(sandbox.unusable() is not None, reason=str(sandbox.unusable()))
KEEP_ALL = "    return [Step(i, i + 1, \"keep\") for i in range(len(profile.blocks))]\n"


def test_a_plan_comes_back_as_data_and_only_a_plan_of_the_model_s_blocks_is_raced():
    profile = Profile((BlockCosts(4, 1, 1.0, {"selective": Option(2, 4, 0.5)}), BlockCosts(4, 1, 1.0)), 0, 0, 1.0)
    assert leaderboard.plan_of([Step(0, 1, "selective"), Step(1, 2, "keep")], profile) == \
        ([[0, 1, "selective"], [1, 2, "keep"]], "")
    assert leaderboard.plan_of([Step(0, 2, "recompute")], profile)[0] == [[0, 2, "recompute"]]
    for bad, why in (([Step(0, 1, "keep")], "covers blocks 0..1"), ([Step(1, 2, "keep")], "in order"),
                     ([Step(0, 1, "keep"), Step(1, 2, "selective")], "not a way block 1 offers"),
                     (None, "NoneType"), ([[0, 2, "recompute"]], "item 0 is a list, not a Step")):
        assert leaderboard.plan_of(bad, profile)[0] is None and why in leaderboard.plan_of(bad, profile)[1]



class Index(str):
    """A str that is not a str: what a student's planner might return for a way."""


@pytest.mark.parametrize("field, value, named", [
    ("start", torch.tensor(0), "Tensor"), ("stop", 2.0, "float"), ("start", False, "bool"),
    ("stop", np.int64(2), "int64"), ("how", Index("recompute"), "Index"), ("how", None, "NoneType")])
def test_a_plan_whose_fields_are_not_plain_ints_and_strs_is_refused_naming_the_field(field, value, named):
    """A plan comes back as data from the box; json.dumps of a tensor in a Step crashed the judge (and every
    submission it graded after): only plain ints and strs are raced, and the refusal names the field's type."""
    profile = Profile((BlockCosts(4, 1, 1.0), BlockCosts(4, 1, 1.0)), 0, 0, 1.0)
    fields = {"start": 0, "stop": 2, "how": "recompute", field: value}
    steps, why = leaderboard.plan_of([Step(**fields)], profile)
    assert steps is None and f"{field} is a {named}" in why and "int" in why and "str" in why, why


def test_a_plan_accepted_is_rebuilt_of_plain_values():
    profile = Profile((BlockCosts(4, 1, 1.0, {"selective": Option(2, 4, 0.5)}), BlockCosts(4, 1, 1.0)), 0, 0, 1.0)
    steps, why = leaderboard.plan_of((Step(0, 1, "selective"), Step(1, 2, "keep")), profile)
    assert why == "" and steps == [[0, 1, "selective"], [1, 2, "keep"]]
    assert [[type(v) for v in s] for s in steps] == [[int, int, str]] * 2 and json.loads(json.dumps(steps)) == steps

def test_only_fitting_plans_rank_ties_share_a_rank_and_every_student_has_a_row(tmp_path):
    race = {"budgets": [100, 200]}
    at = lambda peak, ratio, plan="keep 0-1": {"plan": plan, "peak": peak, "over_reference": ratio,  # noqa: E731
                                               "gradients": "bitwise", "gradient_difference": 0.0}
    raced = {"ann": {"budgets": [{"budget": 100, **at(90, 1.0)}, {"budget": 200, **at(190, 1.2)}]},
             "bob": {"budgets": [{"budget": 100, **at(100, 1.0)}, {"budget": 200, **at(150, 0.9)}]},
             "cy": {"budgets": [{"budget": 100, **at(101, 0.5)}, {"budget": 200, "why": "the planner raised X"}]},
             "=dan": {"why": "not raced: error: not a valid notebook"}}
    table = leaderboard.rows(race, raced)
    got = {(r["budget"], r["student"]): (r["fits"], r["rank"], r["why"][:12]) for r in table}
    assert got == {(100, "=dan"): ("", "", "not raced: e"), (100, "ann"): (True, 1, ""), (100, "bob"): (True, 1, ""),
                   (100, "cy"): (False, "", "over budget:"), (200, "=dan"): ("", "", "not raced: e"),
                   (200, "ann"): (True, 2, ""), (200, "bob"): (True, 1, ""), (200, "cy"): ("", "", "the planner ")}
    book, page = leaderboard.write(table, tmp_path)
    with book.open(newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert list(back[0]) == list(leaderboard.COLUMNS) and back[0]["student"] == "'=dan"
    text = page.read_text()
    assert "<script" not in text and "http" not in text and "&lt;" not in text and text.count("<table>") == 2



def test_ratios_within_the_tie_tolerance_of_a_rank_s_fastest_share_its_rank():
    """Times in a box are noisy: a plan within leaderboard.TIE (relative) of the fastest plan of a rank shares it."""
    assert leaderboard.TIE == 0.02
    raced = {name: {"budgets": [{"budget": 100, "plan": "p", "peak": 50, "over_reference": ratio,
                                 "gradients": "rounding" if name == "b" else "bitwise"}]}
             for name, ratio in (("a", 1.0), ("b", 1.015), ("c", 1.025), ("d", 1.04), ("e", 0.9))}
    ranks = {r["student"]: r["rank"] for r in leaderboard.rows({"budgets": [100]}, raced)}
    assert ranks == {"e": 1, "a": 2, "b": 2, "c": 4, "d": 4}


def test_a_plan_whose_gradients_are_wrong_or_were_never_judged_never_ranks_and_its_row_says_why(tmp_path):
    """A plan that fits and is the fastest, but whose one-step gradients are not the plain step's (judged wrong),
    or whose race answer carries no verdict, is not ranked; its row says why, and the page shows the verdicts."""
    race = {"budgets": [100]}
    def at(ratio, **k):
        return {"budgets": [{"budget": 100, "plan": "p", "peak": 50, "over_reference": ratio, **k}]}
    wrong = leaderboard.judged({"gradients": "wrong", "gradient_difference": 0.97, "why": "planted redraw"})
    raced = {"fast": at(0.5, **wrong), "silent": at(0.6), "odd": at(0.7, **leaderboard.judged({"gradients": "fine"})),
             "right": at(1.0, **leaderboard.judged({"gradients": "bitwise", "gradient_difference": 0.0}))}
    table = {r["student"]: r for r in leaderboard.rows(race, raced)}
    assert table["right"]["rank"] == 1 and table["right"]["fits"] is True and table["right"]["why"] == ""
    assert table["fast"]["fits"] is False and table["fast"]["rank"] == "" and table["fast"]["gradients"] == "wrong"
    assert table["fast"]["why"] == "gradients wrong against the plain step: planted redraw"
    assert table["silent"]["rank"] == "" and table["silent"]["why"] == "not judged by its gradients"
    assert table["odd"]["rank"] == "" and table["odd"]["why"].startswith("not judged by its gradients (the race "
                                                                         "answered gradients='fine'")
    over = leaderboard.rows(race, {"big": {"budgets": [{"budget": 100, "plan": "p", "peak": 150, "over_reference": 0.5,
                                                        **wrong}]}})[0]
    assert over["why"].startswith("over budget") and over["rank"] == ""  # both: the budget is named first
    book, page = leaderboard.write(list(table.values()), tmp_path)
    assert "gradients" in book.read_text().splitlines()[0] and "planted redraw" in page.read_text()
    assert leaderboard.judged({"gradients": "bitwise", "gradient_difference": 1}) == {  # an int is no float here
        "gradients": "", "gradient_why": "not judged by its gradients (the race answered gradients='bitwise', "
                                         "gradient_difference=1)"}

def _lab07(nb: nbformat.NotebookNode, plan_blocks: str | None) -> nbformat.NotebookNode:
    """Lab 07's solution without outputs; with `plan_blocks`, its answer's body replaced by that line."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if plan_blocks and "def plan_blocks(" in cell.source:
                head, rest = cell.source.split("    ### BEGIN SOLUTION\n")
                cell.source = head + "    ### BEGIN SOLUTION\n" + plan_blocks + "    ### END SOLUTION" + \
                    rest.split("    ### END SOLUTION")[1]
    return nb


@needs_bwrap
@pytest.mark.slow
@pytest.mark.long  # three lab 07 notebooks graded and raced in the sandbox: about a minute on two cores
def test_the_solution_ranks_a_plan_over_budget_does_not_and_a_stub_says_why(tmp_path):
    """bars/grade-leaderboard."""
    solution = ROOT / "solutions" / "07_capstone.ipynb"
    folder = tmp_path / "returned"
    for name, body in (("sol", None), ("greedy", KEEP_ALL)):
        (folder / name).mkdir(parents=True)
        nbformat.write(_lab07(nbformat.read(solution, as_version=4), body), folder / name / "07_capstone.ipynb")
    (folder / "stub").mkdir()
    (folder / "stub" / "07_capstone.ipynb").write_bytes((ROOT / "notebooks" / "07_capstone.ipynb").read_bytes())
    out = tmp_path / "book" / "grades.csv"
    done = subprocess.run([sys.executable, "-m", "labkit", "grade", *sorted(map(str, folder.glob("*/*.ipynb"))),
                           "--labs", "07", "--leaderboard", "--jobs", "2", "--out", str(out)], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with (out.parent / "leaderboard.csv").open(newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    budgets = {r["budget"] for r in table}
    assert len(budgets) == leaderboard.COUNT and len(table) == 3 * len(budgets), table
    for r in table:
        if r["student"] == "sol":
            assert r["fits"] == "yes" and r["rank"] == "1" and float(r["over_reference"]) > 0 and not r["why"], r
            assert int(r["peak"]) <= int(r["budget"])
        elif r["student"] == "greedy":
            assert r["fits"] == "no" and r["rank"] == "" and r["why"].startswith("over budget: its step peaks at"), r
            assert int(r["peak"]) > int(r["budget"]) and r["plan"].startswith("keep")
        else:
            assert r["rank"] == "" and "NotImplementedError" in r["why"] and "7.1" in r["why"], r
    page = (out.parent / "leaderboard.html").read_text()
    assert "<script" not in page and "sol" in page and "over budget" in page
