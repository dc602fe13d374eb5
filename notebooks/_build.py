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
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent


def cells_from_source(text: str) -> list:
    """Split a percent-format file into nbformat cells."""
    cells, kind, lines = [], None, []

    def flush():
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(ln[2:] if ln.startswith("# ") else ln.lstrip("#")
                             for ln in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body))
        elif kind == "code" and body:
            cells.append(nbformat.v4.new_code_cell(body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def build(src: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells_from_source(src.read_text())
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{src.stem[:2]}-{i:03d}"  # stable ids: no churn in diffs
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"},
                   "language_info": {"name": "python"}}
    return nb


def main(argv=None) -> int:
    for src in sorted((HERE / "_src").glob("[0-9]*.py")):
        nbformat.write(build(src), HERE / f"{src.stem}.ipynb")
        print("wrote", f"{src.stem}.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
