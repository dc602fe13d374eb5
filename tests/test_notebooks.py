"""Every notebook runs top to bottom, its exercises check, and it is stored clean.

The notebooks are the main way people learn from this package, so CI executes
them all (nbclient, kernel ``python3``) in a temporary directory, with this
checkout's ``paged_np`` and ``notebooks/_exercise.py`` first on the path.

Each notebook runs once, as a learner would go through it: the shipped cells in
order, each exercise's check run on the blank answers (it must print
"Exercise NAME: not done yet" and not stop the notebook), then the solution from
``notebooks/solutions/NN.py`` run in its place and the check run again (it must
print "Exercise NAME: right!"). So one execution covers the notebook as shipped up
to every check, the notebook with the solutions put in after it, and a check cell
that can be run twice (a learner runs it again after each try). Running every
notebook twice in full would double the ~3 minutes they take here (notebook 7 on
the CUDA simulator alone takes over a minute) for no extra coverage, except of a
later cell reading an answer while it is still blank; ``test_no_cell_reads_a_blank``
rules that out statically.

A notebook also fails if it shows no figure (a PNG or an animation's HTML), or if
the file in the repository holds outputs (outputs make diffs unreadable).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbclient  # the dev extra: missing, it fails the run (never a skip)
import nbformat
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name} cell {i} is stored with outputs"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


def _shows_a_figure(nb) -> bool:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                return True
            if "animation" in data.get("text/html", "").lower():  # to_jshtml output
                return True
    return False


def _load_build():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nb_build", ROOT / "notebooks" / "_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def _exercise_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nb_exercise",
                                                  ROOT / "notebooks" / "_exercise.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _names(nb, role):
    return [c.metadata[role] for c in nb.cells if role in c.metadata]


def _verdicts(cell) -> list[str]:
    """The "Exercise NAME: ..." lines a cell printed."""
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")
    return [ln for ln in text.splitlines() if ln.startswith("Exercise ")]


def _blank_then_solved(path):
    """The shipped notebook with, after each check cell, its solution and the check again."""
    solutions = _load_build().solutions(ROOT / "notebooks" / "_src" / f"{path.stem}.py")
    nb = nbformat.read(path, as_version=4)
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if "check" in cell.metadata:
            name = cell.metadata["check"]
            cells.append(nbformat.v4.new_code_cell(solutions[name], metadata={"solution": name}))
            cells.append(nbformat.v4.new_code_cell(cell.source, metadata={"recheck": name}))
    nb.cells = cells
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_exercises_have_a_check_and_a_solution(path):
    build = _load_build()
    nb = nbformat.read(path, as_version=4)
    exercises, checks = _names(nb, "exercise"), _names(nb, "check")
    assert exercises, f"{path.name} has no exercise for the learner to do"
    assert exercises == checks, (exercises, checks)          # one check per exercise, in order
    assert len(set(exercises)) == len(exercises)
    solutions = build.solutions(ROOT / "notebooks" / "_src" / f"{path.stem}.py")
    assert sorted(solutions) == sorted(exercises), "notebooks/solutions/ and the notebook differ"
    for i, cell in enumerate(nb.cells):  # a check follows its exercise; no answer in the blank
        if "exercise" in cell.metadata:
            name = cell.metadata["exercise"]
            after = [c for c in nb.cells[i + 1:] if c.cell_type == "code"]
            assert after and after[0].metadata.get("check") == name, f"{name}: check must follow"
            assert cell.source != solutions[name], f"{name}: the shipped cell holds the solution"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_cell_reads_a_blank(path):
    """Cells after an exercise's check never read the names its blank cell defines, so
    the notebook as shipped (answers left blank) runs to the end like the solved one."""
    import ast

    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if "exercise" not in cell.metadata:
            continue
        tree = ast.parse(cell.source)
        defined = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   for t in node.targets if isinstance(t, ast.Name)}
        defined |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        check = next(j for j in range(i + 1, len(nb.cells)) if "check" in nb.cells[j].metadata)
        for later in nb.cells[check + 1:]:
            if later.cell_type != "code":
                continue
            used = {n.id for n in ast.walk(ast.parse(later.source)) if isinstance(n, ast.Name)}
            assert not used & defined, f"{path.name}: a later cell reads {used & defined}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_blank_then_solved(path, tmp_path, monkeypatch):
    # The kernel inherits this environment: import this checkout's paged_np and the
    # exercise checker, keep Jupyter's inline backend (an inherited MPLBACKEND=Agg
    # would hide the figures).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), str(ROOT / "notebooks")]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = _blank_then_solved(path)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the failing cell
    print(f"{path.name}: {time.perf_counter() - t0:.1f} s")
    assert _shows_a_figure(nb), f"{path.name} draws no figure"
    for cell in nb.cells:
        if "check" in cell.metadata:      # as shipped: the answers are blank
            name = cell.metadata["check"]
            got = _verdicts(cell)
            assert len(got) == 1 and got[0].startswith(f"Exercise {name}: not done yet"), got
        elif "recheck" in cell.metadata:  # with the solution put in
            name = cell.metadata["recheck"]
            got = _verdicts(cell)
            assert len(got) == 1 and got[0].startswith(f"Exercise {name}: right!"), got
        elif "solution" not in cell.metadata:
            assert not _verdicts(cell), "only check cells print verdicts"


def test_check_says_not_done_wrong_or_right(capsys):
    ex = _exercise_module()
    want = {"n": 3, "x": 0.25}
    ex.check("t", {"n": None, "x": ...}, want, hints="h")
    ex.check("t", {"n": 3, "x": 0.5}, want, hints={"n": "hint n", "x": "hint x"})
    ex.check("t", {"n": "3", "x": 0.25}, want, hints={"n": "hint n", "x": "hint x"})
    ex.check("t", {"n": 3, "x": 0.25 + 1e-9}, want, hints="h", done="well done")
    ex.check("t", {"n": 4, "x": 0.5}, want, hints={"n": "hint n", "x": "hint x"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Exercise t: not done yet (fill in n, x, then run this cell again)"
    assert lines[1] == "Exercise t: not right yet: x = 0.5. Hint: hint x"
    assert lines[2] == "Exercise t: not right yet: n = '3'. Hint: hint n"
    assert lines[3] == "Exercise t: right! well done"
    assert lines[4] == "Exercise t: not right yet: n = 4; x = 0.5. Hint: (n) hint n (x) hint x"


def test_attempt_reports_blank_and_raising_functions(capsys):
    ex = _exercise_module()

    def blank(a):
        raise NotImplementedError

    def buggy(a):
        return a[5]

    assert ex.attempt(blank, [1]) is None
    assert ex.attempt(lambda a: a[0] * 2, [4]) == 8
    raised = ex.attempt(buggy, [1])
    assert isinstance(raised, ex.Raised) and isinstance(raised.exc, IndexError)
    ex.check("f", {"f": raised}, {"f": 1}, hints="index from 0")
    ex.check("f", {"f": ex.attempt(blank, [1])}, {"f": 1}, hints="")
    ex.check("f", {"f": [1.0, 2.0]}, {"f": np.array([1.0, 2.0, 3.0])}, hints="shape")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Exercise f: not right yet: f = an error (IndexError")
    assert out[0].endswith("Hint: index from 0")
    assert out[1].startswith("Exercise f: not done yet")
    assert out[2].startswith("Exercise f: not right yet")


def test_build_solved_puts_the_solutions_in(tmp_path):
    build = _load_build()
    assert build.main(["--solved", str(tmp_path)]) == 0
    for path in NOTEBOOKS:
        solved = nbformat.read(tmp_path / path.name, as_version=4)
        sols = build.solutions(ROOT / "notebooks" / "_src" / f"{path.stem}.py")
        cells = [c for c in solved.cells if "exercise" in c.metadata]
        assert cells and all(c.source == sols[c.metadata["exercise"]] for c in cells)


def test_notebooks_match_their_sources():
    """Each stored notebook is what ``notebooks/_build.py`` makes of its ``_src`` file."""
    build = _load_build()
    sources = sorted((ROOT / "notebooks" / "_src").glob("[0-9][0-9]_*.py"))
    assert [s.stem for s in sources] == [p.stem for p in NOTEBOOKS]
    for src in sources:
        want = [(c.cell_type, c.source, c.metadata) for c in build.build(src).cells]
        stored = nbformat.read(ROOT / "notebooks" / f"{src.stem}.ipynb", as_version=4)
        have = [(c.cell_type, c.source, c.metadata) for c in stored.cells]
        assert have == want, f"{src.stem}.ipynb differs from _src: run python notebooks/_build.py"
