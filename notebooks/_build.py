"""Build the notebooks from their sources: ``python notebooks/_build.py``.

Each notebook is written as a plain Python file in ``notebooks/_src/`` with
cells marked the "percent" way (as in Jupytext / VS Code)::

    # %% [markdown]
    # # A title
    # Some prose.

    # %%
    x = 1 + 1

The notebooks are stored without outputs, so a diff shows only what changed in
the lesson. Edit the source, run this script, and commit both.

Exercises. A code cell headed ``# %% exercise 1a`` holds the blanks the learner
fills in (``n_pages = None``, a function that raises ``NotImplementedError``);
the cell headed ``# %% check 1a`` checks them with ``_exercise.check``. The
solutions live apart, in ``solutions/NN.py``, as cells headed the same way
(``# %% exercise 1a``). ``python notebooks/_build.py --solved DIR`` writes the
notebooks with every blank cell replaced by its solution into ``DIR`` (the
shipped notebooks stay blank). The cells carry their exercise's name in their
metadata (``{"exercise": "1a"}`` or ``{"check": "1a"}``), which is how
``tests/test_notebooks.py`` finds them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent


def cells_from_source(text: str) -> list:
    """Split a percent-format file into nbformat cells."""
    cells, kind, role, lines = [], None, None, []

    def flush():
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(ln[2:] if ln.startswith("# ") else ln.lstrip("#")
                             for ln in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body))
        elif kind == "code" and body:
            cell = nbformat.v4.new_code_cell(body)
            if role:  # ("exercise", "1a") or ("check", "1a")
                cell.metadata[role[0]] = role[1]
            cells.append(cell)

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
            words = line.split()[2:]                    # "# %% exercise 1a" -> [exercise, 1a]
            role = tuple(words) if len(words) == 2 and words[0] in ("exercise", "check") else None
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def solutions(src: Path) -> dict:
    """``{exercise name: solution source}`` from ``solutions/NN.py`` of notebook ``src``."""
    path = HERE / "solutions" / f"{src.stem[:2]}.py"
    if not path.exists():
        return {}
    return {c.metadata["exercise"]: c.source for c in cells_from_source(path.read_text())
            if "exercise" in c.metadata}


def build(src: Path, solved: bool = False) -> nbformat.NotebookNode:
    """The notebook of ``src``; with ``solved``, each exercise cell holds its solution."""
    nb = nbformat.v4.new_notebook()
    nb.cells = cells_from_source(src.read_text())
    if solved:
        answers = solutions(src)
        for cell in nb.cells:
            if "exercise" in cell.metadata:
                cell.source = answers[cell.metadata["exercise"]]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{src.stem[:2]}-{i:03d}"  # stable ids: no churn in diffs
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"},
                   "language_info": {"name": "python"}}
    return nb


def main(argv=None) -> int:
    argv = list(argv or [])
    out, solved = HERE, False
    if argv[:1] == ["--solved"] and len(argv) == 2:   # the variant with the solutions in
        out, solved = Path(argv[1]), True
        out.mkdir(parents=True, exist_ok=True)
    elif argv:
        print("usage: python notebooks/_build.py [--solved DIR]", file=sys.stderr)
        return 2
    for src in sorted((HERE / "_src").glob("[0-9]*.py")):
        nbformat.write(build(src, solved), out / f"{src.stem}.ipynb")
        print("wrote", out / f"{src.stem}.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
