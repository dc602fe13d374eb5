"""Every notebook runs top to bottom, draws at least one figure, and is stored clean.

The notebooks are the main way people learn from this package, so CI executes
them all (nbclient, kernel ``python3``) in a temporary directory, with this
checkout's ``paged_np`` first on the path. A notebook fails here if a cell
raises, if it shows no figure (a PNG or an animation's HTML), or if the file in
the repository holds outputs (outputs make diffs unreadable).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_and_draws(path, tmp_path, monkeypatch):
    # The kernel inherits this environment: import this checkout's paged_np, keep
    # Jupyter's inline backend (an inherited MPLBACKEND=Agg would hide the figures).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the failing cell
    print(f"{path.name}: {time.perf_counter() - t0:.1f} s")
    assert _shows_a_figure(nb), f"{path.name} draws no figure"


def test_notebooks_match_their_sources():
    """Each stored notebook is what ``notebooks/_build.py`` makes of its ``_src`` file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nb_build", ROOT / "notebooks" / "_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    sources = sorted((ROOT / "notebooks" / "_src").glob("[0-9][0-9]_*.py"))
    assert [s.stem for s in sources] == [p.stem for p in NOTEBOOKS]
    for src in sources:
        want = [(c.cell_type, c.source) for c in build.build(src).cells]
        stored = nbformat.read(ROOT / "notebooks" / f"{src.stem}.ipynb", as_version=4)
        have = [(c.cell_type, c.source) for c in stored.cells]
        assert have == want, f"{src.stem}.ipynb differs from _src: run python notebooks/_build.py"
