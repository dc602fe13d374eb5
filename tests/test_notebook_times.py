"""The course's time table (``notebooks/_times.py``): computed from the notebook sources
and the recorded run times, shown as estimates, and the same in every place it appears."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _times():
    spec = importlib.util.spec_from_file_location("nb_times", ROOT / "notebooks" / "_times.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("target", ["notebooks/README.md", "docs/notebooks/course.md"])
def test_the_table_in_the_docs_is_the_scripts(target):
    t = _times()
    text = (ROOT / target).read_text()
    shown = text[text.index(t.BEGIN) + len(t.BEGIN):text.index(t.END)].strip("\n")
    assert shown == t.table(), f"{target}: run python notebooks/_times.py --write"


def test_every_notebook_has_a_measured_run_time():
    t = _times()
    recorded = t.run_times()
    assert {s.stem for s in t.sources()} <= set(recorded["seconds"]), recorded
    assert recorded.get("machine")
    assert all(r["run_seconds"] > 0 for r in t.rows())


def test_the_exercises_counted_are_the_notebooks_checks():
    """Every check cell is counted once, as values or as a function; the ones that run
    the learner's code on cases are the function exercises."""
    t = _times()
    functions = set()
    for src in t.sources():
        nb = nbformat.read(ROOT / "notebooks" / f"{src.stem}.ipynb", as_version=4)
        checks = [c for c in nb.cells if "check" in c.metadata]
        c = t.counts(src)
        assert c["value_exercises"] + c["function_exercises"] == len(checks), src.stem
        functions |= {cell.metadata["check"] for cell in checks
                      if "check_function(" in cell.source or "check_property(" in cell.source}
    assert functions == {"1c", "2b", "3c", "3d", "4b", "5c", "5d", "6b"}


def test_the_estimate_grows_with_each_thing_a_reader_does():
    t = _times()
    base = {"words": 1000, "code_lines": 100, "value_exercises": 1, "function_exercises": 1}
    low, high = t.estimate(base, 60)
    assert low < high
    for key, more in (("words", 1500), ("code_lines", 60), ("value_exercises", 2),
                      ("function_exercises", 1)):
        bigger = t.estimate({**base, key: base[key] + more}, 60)
        assert bigger[0] > low and bigger[1] > high, key
    assert t.estimate(base, 60 * 30)[0] > low                    # a slow notebook too


def test_the_table_says_it_is_an_estimate_and_how():
    text = _times().table()
    assert "*Estimates*" in text and "150 words a minute" in text
    assert "Nobody new to the course has been timed" in text
    count = len(list((ROOT / "notebooks" / "_src").glob("[0-9][0-9]_*.py")))
    assert f"| **all {count}** |" in text and " h** |" in text
