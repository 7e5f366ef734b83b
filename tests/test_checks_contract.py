"""The checker contract (docs/design.md, "Checkers"), written once for every exercise of every lab of the catalog.

Each exercise's checker is called as its solution's checker cell calls it (`lk.checks.ex_N_M(name, ...)`), with
the names taken from the lab's reference module: the reference passes with one line and leaves the global
generator and autocast as it found them; the exercise's own stub, as the student notebook has it (its `#| export`
cells run), is "not attempted"; something that is not a function is a CheckFailure whose hint says what to pass.
Each lab's own file (tests/test_checks_labNN.py) plants that lab's mistakes.
"""
from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
import torch

from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.course.catalog import LABS, Lab
from labkit.stubs import BEGIN, HEADING
from labkit.labs import your_code

ROOT = Path(__file__).resolve().parent.parent
CALL = re.compile(r"^lk\.checks\.(ex_(\d+)_(\d+))\((.*)\)$")


@dataclass(frozen=True)
class Exercise:
    lab: Lab
    id: str  # "2.1"
    checker: str  # "ex_2_1"
    args: tuple[str, ...]  # the names the checker cell passes
    own: frozenset[str]  # the names the exercise's answer cell defines

    def __str__(self) -> str:
        return self.id


def _defined(source: str) -> set[str]:
    tree = ast.parse("\n".join(line for line in source.splitlines() if not line.startswith("#|")))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | \
        {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def exercises() -> list[Exercise]:
    """Every exercise of the catalog, in order, from its solution's checker cell and answer cell."""
    found = []
    for lab in LABS:
        nb = nbformat.read(lab.solution(ROOT), as_version=4)
        own: dict[str, set[str]] = {}
        current = None
        for cell in nb.cells:
            if cell.cell_type == "markdown" and HEADING.findall(cell.source):
                current = HEADING.findall(cell.source)[-1][0]
            elif cell.cell_type == "code" and BEGIN in cell.source:
                own.setdefault(current, set()).update(_defined(cell.source))
            elif cell.cell_type == "code" and CALL.match(cell.source.strip()):
                name, major, minor, args = CALL.match(cell.source.strip()).groups()
                ex = f"{int(major)}.{minor}"
                found.append(Exercise(lab, ex, name, tuple(a.strip() for a in args.split(",")),
                                      frozenset(own.get(ex, ()))))
    return found


EXERCISES = exercises()


def _reference(ex: Exercise) -> list:
    module = importlib.import_module(f"labkit.reference.{ex.lab.module}")
    return [getattr(module, a) for a in ex.args]


def test_every_lab_has_exercises_and_every_exercise_a_checker_and_an_answer():
    assert {ex.lab.number for ex in EXERCISES} == {lab.number for lab in LABS}
    assert sorted(ex.checker for ex in EXERCISES) == sorted(n for n in checks.__all__ if n.startswith("ex_")), \
        "a checker cell the contract cannot read (one call, names only), or a checker no lab calls"
    for ex in EXERCISES:
        assert callable(getattr(checks, ex.checker)), ex
        assert ex.own, f"exercise {ex} has no answer cell defining a name"
        assert set(ex.args) <= set(vars(importlib.import_module(f"labkit.reference.{ex.lab.module}"))), ex


@pytest.mark.parametrize("ex", EXERCISES, ids=str)
def test_the_reference_passes_with_one_line_and_leaves_generator_and_autocast_alone(ex, capsys):
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    getattr(checks, ex.checker)(*_reference(ex))
    assert torch.equal(torch.rand(3), want), "the checker moved the global generator"
    assert (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")) == autocast
    out = capsys.readouterr().out
    assert out.startswith(f"[ex {ex.id}] passed: ") and out.count("\n") == 1, out


@pytest.fixture(scope="module")
def stubbed():
    """Each lab's names as its student notebook (the kit's notebooks/) defines them: every exercise a stub."""
    return {lab.module: your_code(lab.module, lab.notebook, lab.student(ROOT)) for lab in LABS}


OWN_ARGS = [(ex, name) for ex in EXERCISES for name in ex.args if name in ex.own]


@pytest.mark.parametrize("ex, name", OWN_ARGS, ids=[f"{ex}-{name}" for ex, name in OWN_ARGS])
def test_each_of_the_exercise_s_own_stubs_is_not_attempted(ex, name, stubbed):
    """Each name the exercise defines stubbed alone (the rest the reference), as the student notebook has it."""
    args = [stubbed[ex.lab.module][a] if a == name else ref for a, ref in zip(ex.args, _reference(ex))]
    with pytest.raises(NotAttempted, match=rf"\[ex {re.escape(ex.id)}\] not attempted"):
        getattr(checks, ex.checker)(*args)


@pytest.mark.parametrize("ex", EXERCISES, ids=str)
def test_what_is_not_a_function_fails_with_a_hint_saying_what_to_pass(ex):
    args = [42 if a in ex.own else ref for a, ref in zip(ex.args, _reference(ex))]
    with pytest.raises(CheckFailure) as info:
        getattr(checks, ex.checker)(*args)
    assert not isinstance(info.value, NotAttempted)
    assert str(info.value).startswith(f"[ex {ex.id}] ") and "pass the" in info.value.hint, info.value


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.number)
def test_every_lab_has_its_planted_bugs_and_its_reference_held_against_an_oracle(lab):
    """tests/ is laid out like the labs: each lab's checkers' planted bugs, and its reference against PyTorch's own
    version, an independent oracle or exhaustive search (docs/design.md, "Checkers")."""
    for kind in ("checks", "reference"):
        assert (ROOT / "tests" / f"test_{kind}_lab{lab.number}.py").is_file(), f"tests/test_{kind}_lab{lab.number}.py"


def _fingerprint(value: object) -> object:
    """What a call's argument is, by value: tensors by their bytes, modules by their parameters, functions by their
    code and what they close over; so that two calls that ask the same question have the same fingerprint."""
    if isinstance(value, torch.Tensor) and value.is_meta:  # no data to read: its shape and dtype are all it asks
        return ("meta tensor", str(value.dtype), tuple(value.shape))
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.detach().cpu().contiguous().view(-1)
                .view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    if isinstance(value, torch.nn.Module):
        return ("module", type(value).__qualname__, tuple((n, p.requires_grad, _fingerprint(p.data))
                                                          for n, p in value.named_parameters(remove_duplicate=False)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_fingerprint(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _fingerprint(v)) for k, v in value.items())))
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        return (type(value).__qualname__, tuple((f, _fingerprint(getattr(value, f))) for f in value.__dataclass_fields__))
    if callable(value) and hasattr(value, "__code__"):
        cells = tuple(_fingerprint(c.cell_contents) for c in value.__closure__ or ())
        return ("function", value.__code__.co_code, repr(value.__code__.co_consts), cells)
    return ("value", repr(value))


REMOTE = [ex for ex in EXERCISES if getattr(getattr(ex.lab.checkers, ex.checker), "remote", False)]


@pytest.mark.parametrize("ex", REMOTE, ids=str)
def test_each_data_checker_asks_at_grading_what_its_public_cases_never_ask_and_the_reference_passes(ex, capsys):
    """Issue 25's hidden cases, for every checker `labkit grade` runs on data: under a run's seed it calls the
    student's functions with arguments the public cases never pass (so an answer that looks its result up in a
    table of the public cases fails), different ones from another seed, and the reference passes them all."""
    from labkit.checks import base

    def asked(seed: int | None) -> set:
        questions: set = set()

        def recording(fn):
            def answer(*args, **kwargs):
                questions.add((fn.__name__, _fingerprint(list(args)), _fingerprint(kwargs)))
                return fn(*args, **kwargs)
            answer.__name__ = fn.__name__
            return answer
        with base.hidden_cases(seed):
            getattr(ex.lab.checkers, ex.checker)(*[recording(f) if callable(f) else f for f in _reference(ex)])
        return questions

    public = asked(None)
    first, second = asked(1), asked(2)
    assert first - public, f"Exercise {ex}: the hidden cases ask nothing the public ones do not"
    assert first - public != second - public, f"Exercise {ex}: two seeds draw the same hidden cases"
    assert capsys.readouterr().out.count("passed") == 3
