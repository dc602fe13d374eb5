"""The notebooks' exercise checker (``notebooks/_exercise.py``) on its own.

Floats are compared within a tolerance, never with ``==`` (issue 29: a correct
``waste_fraction`` was refused because it differed from the package's in the last
bit), and a wrong float is printed with enough digits to see where it differs.
``check_function`` runs the learner's function against the package's and reports the
first case where they differ.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _ex():
    spec = importlib.util.spec_from_file_location("nb_exercise",
                                                  ROOT / "notebooks" / "_exercise.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_correct_float_list_passes_though_not_bit_equal(capsys):
    ex = _ex()
    lengths = np.random.default_rng(0).integers(50, 800, size=16)
    want, got = [], []
    for ps in (1, 16, 256):
        reserved = int(np.sum(-(-lengths // ps)) * ps)
        want.append(1 - lengths.sum() / reserved)                 # the package's way
        got.append((reserved - lengths.sum()) / reserved)         # the learner's way
    assert got != want          # the case of the issue: equal maths, different last bits
    ex.check("1b", {"waste_fraction": got}, {"waste_fraction": want}, hints="h")
    assert capsys.readouterr().out.startswith("Exercise 1b: right!")


def test_a_wrong_float_fails_and_shows_its_digits(capsys):
    ex = _ex()
    want = [0.0144009216589862, 0.25]
    ex.check("1b", {"w": [0.0144012, 0.25]}, {"w": want}, hints="h")   # off by 3e-7 rel 2e-5
    ex.check("1b", {"w": 0.0144012}, {"w": 0.0144009216589862}, hints="h", atol=1e-8)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Exercise 1b: not right yet: w = [0.0144012, 0.25]"), out[0]
    assert out[1].startswith("Exercise 1b: not right yet: w = 0.0144012."), out[1]
    # 10 significant digits: two values that differ in the 7th digit print differently
    assert ex._show(0.01440092166) != ex._show(0.01440092)


def test_tuples_of_results_compare_item_by_item():
    ex = _ex()
    a = (np.ones(3), 2.0)
    assert ex.same((np.ones(3) + 1e-9, 2.0), a)
    assert not ex.same((np.ones(3), 2.1), a)
    assert not ex.same((np.ones(3),), a)
    assert not ex.same("x", a)


def test_check_function_reports_not_done_first_difference_and_right(capsys):
    ex = _ex()

    def blank(xs):
        raise NotImplementedError

    def wrong(xs):
        xs.sort()                    # changes its argument: the oracle must not see it
        return xs[:2] if len(xs) > 3 else xs[:1]

    def right(xs):
        return sorted(xs)[:1]

    def oracle(xs):
        return [min(xs)]

    cases = [([3, 1, 2],), ([5, 4, 6, 7],), ([9, 8],)]
    ex.check_function("f", blank, oracle, cases, hints="the smallest")
    ex.check_function("f", wrong, oracle, cases, hints="the smallest")
    ex.check_function("f", right, oracle, cases, done="ok")
    ex.check_function("f", lambda xs: xs[10], oracle, cases, hints="h")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Exercise f: not done yet (write the body of blank, then run this cell again)"
    assert out[1] == ("Exercise f: not right yet: case 2 of 3 ([5, 4, 6, 7]): yours gives "
                      "[4, 5], the package [4] (first difference at index 1: yours 5, the package "
                      "nothing). Hint: the smallest")
    assert out[2] == "Exercise f: right! 3 random cases agree with the package. ok"
    assert out[3].startswith("Exercise f: not right yet: case 1 of 3") and "IndexError" in out[3]
