"""The solution -> student generator: stubs, cleared outputs, exports, and its errors."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from labkit import stubs
from labkit.course import student, views
from labkit.course.catalog import Lab

ROOT = Path(__file__).resolve().parent.parent


def make_nb(*cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=list(cells))
    for i, c in enumerate(nb.cells):
        c["id"] = f"c{i}"
    return nb


def solved_cell(body: str) -> nbformat.NotebookNode:
    cell = new_code_cell(body, execution_count=3)
    cell.outputs = [new_output("stream", name="stdout", text="42\n")]
    return cell


def test_region_becomes_stub_at_its_indentation():
    src = "def f(x):\n    \"\"\"Spec.\"\"\"\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n    ### END SOLUTION\n"
    out = student.stub_source(src, student.Exercise("2.1", "add one"), "nb, cell 0")
    assert out == 'def f(x):\n    """Spec."""\n    # YOUR CODE HERE\n    raise NotImplementedError("Exercise 2.1: add one")'
    ns: dict = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError, match="Exercise 2.1: add one"):
        ns["f"](1)


@pytest.mark.parametrize("pad", ["        ", "\t", "  "], ids=["8 spaces", "tab", "2 spaces"])
def test_stub_keeps_any_indentation(pad):
    src = f"class A:\n{pad}def f(self):\n{pad}{pad}### BEGIN SOLUTION\n{pad}{pad}return 1\n{pad}{pad}### END SOLUTION\n"
    out = student.stub_source(src, student.Exercise("3.1", "one"), "nb, cell 0")
    assert out == (f"class A:\n{pad}def f(self):\n{pad}{pad}# YOUR CODE HERE\n"
                   f'{pad}{pad}raise NotImplementedError("Exercise 3.1: one")')
    ns: dict = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError, match="Exercise 3.1: one"):
        ns["A"]().f()


def test_student_view_clears_outputs_and_keeps_everything_else():
    nb = make_nb(new_markdown_cell("## Exercise 1.2: double it"),
                 solved_cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
                 solved_cell("print(42)"))
    view = student.student_view(nb, "t.ipynb")
    assert view.cells[0].source == nb.cells[0].source and view.cells[0].id == nb.cells[0].id
    for cell in view.cells:  # each carries what the generator wrote: a student's edit shows against it
        assert cell.metadata["labkit"] == {"generated": student.generated_digest(cell.source)}
    assert "Exercise 1.2: double it" in view.cells[1].source and "2 * x" not in view.cells[1].source
    assert view.cells[2].source == "print(42)"
    for cell in view.cells[1:]:
        assert cell.outputs == [] and cell.execution_count is None
    assert nb.cells[1].outputs, "the solution notebook itself must not be modified"


def test_export_cells_form_the_reference_module():
    nb = make_nb(new_markdown_cell("## Exercise 1.1: g"),
                 new_code_cell("#| export\ndef g():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
                 new_code_cell("g()"))
    text = views.reference_module(nb, "solutions/01_x.ipynb")
    assert "do not edit" in text and "def g():\n    return 1\n" in text and "BEGIN" not in text
    ns: dict = {}
    exec(text, ns)
    assert ns["g"]() == 1
    assert views.reference_module(make_nb(new_code_cell("1")), "n") is None


def test_each_exported_part_points_home():
    nb = make_nb(new_markdown_cell("# 01 · Title"),
                 new_code_cell("#| export\nimport math"),
                 new_markdown_cell("## Exercise 1.1: g"),
                 new_code_cell("#| export\ndef g():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
                 new_markdown_cell("## More"),
                 new_code_cell("#| export\nK = 2"))
    text = views.reference_module(nb, "solutions/01_x.ipynb")
    assert '# Given, section "01 · Title"  (solutions/01_x.ipynb, cell c1)\nimport math' in text
    assert "# Exercise 1.1: g  (solutions/01_x.ipynb, cell c3)\ndef g():" in text
    assert '# Given, section "More"  (solutions/01_x.ipynb, cell c5)\nK = 2' in text


@pytest.mark.parametrize("second", ["def g():\n    return 2", "class g:\n    pass", "g = 3", "g: int = 3"])
def test_a_name_exported_twice_is_an_error_naming_both_cells(second):
    nb = make_nb(new_code_cell("#| export\ndef g():\n    return 1"), new_code_cell("print(1)"),
                 new_code_cell("#| export\n" + second))
    with pytest.raises(student.NotebookError, match=r"cells c0 and c2 both define 'g'"):
        views.reference_module(nb, "solutions/01_x.ipynb")


def test_cli_check_fails_on_a_planted_duplicate_export(tmp_path):
    nb = nbformat.reads(good_solution(), as_version=4)
    nb.cells.append(new_code_cell("#| export\nX = 1"))
    nb.cells.append(new_code_cell("#| export\nX = 2"))
    nb.cells[-2]["id"], nb.cells[-1]["id"] = "c7", "c9"
    root = kit(tmp_path, nbformat.writes(nb))
    result = run_cli(root, "student", "--check")
    assert result.returncode != 0 and "cells c7 and c9 both define 'X'" in result.stderr


@pytest.mark.parametrize("body, message", [
    ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", "line 2: ### BEGIN SOLUTION is never closed"),
    ("def f():\n    return 1\n    ### END SOLUTION\n", "line 3: ### END SOLUTION without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "line 2: ### BEGIN SOLUTION inside"),
])
def test_bad_markers_name_notebook_cell_and_line(body, message):
    nb = make_nb(new_markdown_cell("## Exercise 1.1: x"), new_code_cell("1"), new_code_cell(body))
    with pytest.raises(student.NotebookError, match=f"t.ipynb, cell 2, {message}"):
        student.student_view(nb, "t.ipynb")


def test_region_without_exercise_heading_is_an_error():
    nb = make_nb(new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"))
    with pytest.raises(student.NotebookError, match="cell 0: a solution region with no '## Exercise"):
        student.student_view(nb, "t.ipynb")


DEMO = (Lab("01", "demo"),)  # the catalog of the kits these tests build


def kit(tmp_path: Path, solution_text: str) -> Path:
    (tmp_path / "solutions").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "solutions" / "01_demo.ipynb").write_text(solution_text)
    return tmp_path


def good_solution() -> str:
    return nbformat.writes(make_nb(new_markdown_cell("## Exercise 1.1: one"),
                                   solved_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")))


def test_write_then_check_is_clean_and_detects_drift(tmp_path):
    root = kit(tmp_path, good_solution())
    assert views.check(root, DEMO) == ["notebooks/01_demo.ipynb: missing"]
    views.write(root, DEMO)
    assert views.check(root, DEMO) == []
    nb = nbformat.read(root / "notebooks" / "01_demo.ipynb", as_version=4)
    nb.cells[1].source += "\n# edited by hand"  # by whoever: someone's work, never overwritten
    nbformat.write(nb, root / "notebooks" / "01_demo.ipynb")
    assert views.check(root, DEMO) == [views.keep_your_work(Path("notebooks/01_demo.ipynb"), ["Exercise 1.1"])]


def test_check_reports_leaked_markers_and_orphans(tmp_path):
    root = kit(tmp_path, good_solution())
    views.write(root, DEMO)
    leaked = make_nb(new_code_cell("### BEGIN SOLUTION\nsecret = 1\n### END SOLUTION"))
    nbformat.write(leaked, root / "notebooks" / "02_orphan.ipynb")
    (root / "labkit" / "reference").mkdir(parents=True)
    (root / "labkit" / "reference" / "gone.py").write_text("x = 1\n")
    problems = views.check(root, DEMO)
    assert "labkit/reference/gone.py: no solution exports it any more (delete it)" in problems
    assert "notebooks/02_orphan.ipynb: no solutions/02_orphan.ipynb to generate it from" in problems
    assert "notebooks/02_orphan.ipynb, cell 0: a solution marker leaked" in problems


@pytest.mark.parametrize("marker", [stubs.BEGIN, stubs.END])
def test_check_reports_a_lone_leaked_marker(tmp_path, marker):
    root = kit(tmp_path, good_solution())
    views.write(root, DEMO)
    nb = nbformat.read(root / "notebooks" / "01_demo.ipynb", as_version=4)
    nb.cells.append(new_code_cell(f"x = 1\n{marker}"))
    nbformat.write(nb, root / "notebooks" / "01_demo.ipynb")
    assert f"notebooks/01_demo.ipynb, cell {len(nb.cells) - 1}: a solution marker leaked" in views.check(root, DEMO)


def run_cli(root: Path, *args: str, labs: tuple[Lab, ...] = DEMO) -> subprocess.CompletedProcess:
    code = ("import sys, labkit.__main__ as m, labkit.cli.notebooks as n, labkit.course.catalog as c; "
            "from pathlib import Path; "
            f"c.LABS = tuple(c.Lab(*lab) for lab in {[(lab.number, lab.name) for lab in labs]!r}); "
            f"n.ROOT = Path({str(root)!r}); sys.exit(m.main({list(args)!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_cli_unclosed_marker_fails_and_writes_nothing(tmp_path):
    bad = make_nb(new_markdown_cell("## Exercise 1.1: one"), new_code_cell("x = 1\n### BEGIN SOLUTION\ny = 2\n"))
    root = kit(tmp_path, nbformat.writes(bad))
    result = run_cli(root, "student")
    assert result.returncode == 2
    assert "solutions/01_demo.ipynb, cell 1, line 2: ### BEGIN SOLUTION is never closed" in result.stderr
    assert "nothing was written" in result.stderr
    assert list((root / "notebooks").iterdir()) == []


def test_cli_invalid_json_names_the_file_and_writes_nothing(tmp_path):
    root = kit(tmp_path, good_solution())
    (root / "solutions" / "02_broken.ipynb").write_text('{"cells": [')
    result = run_cli(root, "student", labs=DEMO + (Lab("02", "broken"),))
    assert result.returncode == 2
    assert "02_broken.ipynb: not a valid notebook" in result.stderr
    assert list((root / "notebooks").iterdir()) == []


def test_cli_check_exits_nonzero_when_stale(tmp_path):
    root = kit(tmp_path, good_solution())
    result = run_cli(root, "student", "--check")
    assert result.returncode == 1 and "notebooks/01_demo.ipynb: missing" in result.stderr
    assert run_cli(root, "student").returncode == 0
    assert run_cli(root, "student", "--check").returncode == 0


def _autosave(root: Path, edit) -> tuple[Path, str]:
    """What JupyterLab's autosave leaves in notebooks/ once a student worked: `edit` changes the notebook."""
    path = root / "notebooks" / "01_demo.ipynb"
    nb = nbformat.read(path, as_version=4)
    edit(nb)
    nbformat.write(nb, path)
    return path, path.read_text()


def _stub(nb):
    return next(c for c in nb.cells if "NotImplementedError" in c.source)


def _answer(nb):
    _stub(nb).source = "def f():\n    return 1  # my answer"


def _half_way(nb):  # typed above the stub, which is still there
    _stub(nb).source = _stub(nb).source.replace("# YOUR CODE HERE", "x = 1  # started")


def _new_cell(nb):
    nb.cells.append(new_code_cell("def helper():\n    return 2"))


def _pasted(nb):  # the stub cell cut, pasted back with another id, and answered there
    cell = _stub(nb)
    cell.id, cell.source = "pasted1", "def f():\n    return 1"


@pytest.mark.parametrize("edit, where", [(_answer, "Exercise 1.1"), (_half_way, "Exercise 1.1"),
                                         (_new_cell, "Exercise 1.1"), (_pasted, "Exercise 1.1")],
                         ids=["answered", "half-way", "a-new-cell", "pasted-with-a-new-id"])
def test_an_autosaved_answer_survives_every_command_that_regenerates_or_checks(tmp_path, edit, where):
    root = kit(tmp_path, good_solution())
    views.write(root, DEMO)
    path, saved = _autosave(root, edit)
    assert views.check(root, DEMO) == [views.keep_your_work(Path("notebooks/01_demo.ipynb"), [where])]
    with pytest.raises(student.NotebookError, match=r"notebooks/01_demo.ipynb holds your work \(Exercise 1.1"):
        views.write(root, DEMO)
    (root / "solutions" / "01_demo.ipynb").write_text(good_solution().replace("one", "one, reworded"))  # stale too
    for args, code in ((("student",), 2), (("student", "--check"), 1)):
        result = run_cli(root, *args)
        assert result.returncode == code and "holds your work (Exercise 1.1" in result.stderr, result.stderr
        assert "cp notebooks/01_demo.ipynb" in result.stderr and "Regenerate" not in result.stderr
        assert path.read_text() == saved


def test_a_stale_view_nobody_edited_is_regenerated_even_where_a_given_cell_became_an_exercise(tmp_path):
    given = make_nb(new_markdown_cell("## Exercise 1.1: one"), solved_cell("def f():\n    return 1"))
    root = kit(tmp_path, nbformat.writes(given))
    views.write(root, DEMO)
    (root / "solutions" / "01_demo.ipynb").write_text(good_solution())  # the given cell is now an exercise's
    assert views.check(root, DEMO) == ["notebooks/01_demo.ipynb: out of date (cell 1 differs from the solution's "
                                       "student view)"]
    assert run_cli(root, "student").returncode == 0 and views.check(root, DEMO) == []


def test_a_solution_outside_the_catalog_and_a_lab_without_its_solution_are_named(tmp_path):
    root = kit(tmp_path, good_solution())
    (root / "solutions" / "09_stray.ipynb").write_text(good_solution())
    assert "solutions/09_stray.ipynb: not a lab of the catalog (add it to labkit/course/catalog.py)" in \
        views.check(root, DEMO)
    with pytest.raises(student.NotebookError, match="lab 02 of the catalog .* has no solutions/02_gone.ipynb"):
        views.check(root, DEMO + (Lab("02", "gone"),))


def test_the_catalog_is_the_kit_s_labs():
    from labkit.course.catalog import LABS

    assert [lab.notebook for lab in LABS] == sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))
    assert all(lab.student(ROOT).is_file() for lab in LABS)


def test_repository_views_are_current():
    assert views.check(ROOT) == []


# ---------------------------------------------------------------- properties (Hypothesis)

code_line = st.from_regex(r"[a-z_]{1,8} = [0-9]{1,3}", fullmatch=True)
indent = st.sampled_from(["", "    ", "        "])


@st.composite
def cell_with_regions(draw):
    """Source lines of a cell: plain lines and solution regions, at random indentation."""
    lines, regions = [], 0
    for _ in range(draw(st.integers(0, 6))):
        pad = draw(indent)
        if draw(st.booleans()):
            body = [pad + line for line in draw(st.lists(code_line, min_size=0, max_size=3))]
            lines += [pad + stubs.BEGIN, *body, pad + stubs.END]
            regions += 1
        else:
            lines.append(pad + draw(code_line))
    return lines, regions


@settings(max_examples=150, deadline=None)
@given(cell_with_regions())
def test_every_region_becomes_one_stub_and_the_rest_is_kept(drawn):
    lines, regions = drawn
    source = "\n".join(lines)
    out = student.stub_source(source, student.Exercise("3.1", "t"), "nb, cell 0")
    assert stubs.BEGIN not in out and stubs.END not in out
    assert out.count('raise NotImplementedError("Exercise 3.1: t")') == regions
    kept = [line for line in lines if line.strip() not in (stubs.BEGIN, stubs.END)]
    inside, outside = False, []
    for line in lines:  # lines outside regions survive, in order
        if line.strip() == stubs.BEGIN:
            inside = True
        elif line.strip() == stubs.END:
            inside = False
        elif not inside:
            outside.append(line)
    out_lines = [line for line in out.splitlines() if "NotImplementedError" not in line and "YOUR CODE" not in line]
    assert out_lines == outside if regions else out == source
    # the exported text keeps everything but the markers
    exported = student.export_source(stubs.EXPORT + "\n" + source, "nb, cell 0")
    assert exported.strip("\n") == "\n".join(kept).strip("\n")


# ---------------------------------------------------------------- Run All goes past stubs (raises-exception tags)
def test_cells_that_use_an_answer_are_tagged_and_checkers_never():
    nb = make_nb(new_markdown_cell("## Exercise 1.2: double it"),
                 solved_cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
                 solved_cell("lk.checks.ex_1_2(f)"),
                 solved_cell("y = f(3)"),
                 solved_cell("def g():\n    z = 1\n    return z"),
                 solved_cell("print(y + 1)"),
                 solved_cell("from labkit.labs.recompute import checkpoint\nw = 2"),
                 solved_cell("checkpoint(print, w)"),
                 solved_cell("print(w, z)" if False else "print(w)"))
    view = student.student_view(nb, "t.ipynb")
    tagged = [i for i, c in enumerate(view.cells) if student.RAISES in c.metadata.get("tags", [])]
    assert tagged == [3, 5, 7], "f's users (y, then y's), and an earlier lab's code; not g, w alone, or the checker"
    assert student.RAISES not in nb.cells[3].metadata.get("tags", []), "the solution keeps no tag"


def test_a_stub_at_the_top_level_of_a_cell_tags_that_cell():
    nb = make_nb(new_markdown_cell("## Exercise 1.1: a number"),
                 solved_cell("### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION"), solved_cell("print(answer)"))
    view = student.student_view(nb, "t.ipynb")
    assert [student.RAISES in c.metadata.get("tags", []) for c in view.cells] == [False, True, True]


# ---------------------------------------------------------------- labkit.labs: the reference, else the student's notebook
def test_labs_modules_are_generated_for_every_exporting_lab():
    names = {p.name for p in (ROOT / "labkit" / "reference").glob("*.py")} - {"__init__.py"}
    assert names == {p.name for p in (ROOT / "labkit" / "labs").glob("*.py")} - {"__init__.py"}


def test_without_the_reference_a_lab_s_code_is_the_student_s_own_notebook(tmp_path, monkeypatch):
    import labkit.labs
    from labkit.labs import your_code

    monkeypatch.setattr(labkit.labs, "places", lambda: [tmp_path])
    with pytest.raises(ImportError, match="02_recompute.ipynb, which is not in"):
        your_code("recompute", "02_recompute.ipynb")
    (tmp_path / "02_recompute.ipynb").write_text((ROOT / "notebooks" / "02_recompute.ipynb").read_text())
    stubbed = your_code("recompute", "02_recompute.ipynb")
    with pytest.raises(NotImplementedError, match="Exercise 2.4"):
        stubbed["checkpoint"](lambda x: x, None)
    (tmp_path / "02_recompute.ipynb").write_text((ROOT / "solutions" / "02_recompute.ipynb").read_text())
    solved = your_code("recompute", "02_recompute.ipynb")
    import torch

    x = torch.ones(3, requires_grad=True)
    solved["checkpoint"](lambda t: (t * 2).sin(), x).sum().backward()
    assert torch.equal(x.grad, 2 * torch.cos(2 * torch.ones(3)))
    (tmp_path / "02_recompute.ipynb").write_text('{"cells": [')
    with pytest.raises(ImportError, match="not a readable notebook"):
        your_code("recompute", "02_recompute.ipynb")


def test_nbval_markers_are_dropped_from_the_student_view_only():
    source = "# NBVAL_IGNORE_OUTPUT\nimport torch\nx = torch.randn(2)  # NBVAL_ in a comment stays\nx"
    nb = make_nb(new_markdown_cell("# 01 · Demo"), solved_cell(source))
    view = student.student_view(nb, "01_demo")
    assert view.cells[1].source == "import torch\nx = torch.randn(2)  # NBVAL_ in a comment stays\nx"
    assert nb.cells[1].source == source  # the solution keeps it: nbval reads it there


def test_no_student_notebook_of_the_kit_shows_nbval_markers():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert "NBVAL" not in path.read_text(), path.name


def test_check_reports_a_leaked_nbval_marker(tmp_path):
    root = kit(tmp_path, good_solution())
    views.write(root, DEMO)
    nb = nbformat.read(root / "notebooks" / "01_demo.ipynb", as_version=4)
    nb.cells.append(new_code_cell("# NBVAL_SKIP\nx = 1"))
    nbformat.write(nb, root / "notebooks" / "01_demo.ipynb")
    assert f"notebooks/01_demo.ipynb, cell {len(nb.cells) - 1}: an nbval marker leaked" in views.check(root, DEMO)
