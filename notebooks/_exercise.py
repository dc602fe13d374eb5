"""The notebooks' exercise checker: says "not done yet", gives a hint, or confirms.

An exercise cell leaves blanks for the learner (``n_pages = None``, or a function
whose body is ``raise NotImplementedError``). The check cell below it computes the
right values from the package and calls :func:`check`, which prints one line:

    Exercise 1a: not done yet (fill in n_pages, then run this cell again)
    Exercise 1a: not right yet: n_pages = 2. Hint: ...
    Exercise 1a: right! ...

It never raises, so a notebook with every exercise left blank still runs top to
bottom (that is how it is shipped, and how CI runs it). ``tests/test_notebooks.py``
reads these lines. Solutions live apart, in ``notebooks/solutions/NN.py``.

The notebooks import it as ``from _exercise import check, attempt``: Jupyter starts
a notebook's kernel in the notebook's folder, and the tests and the docs build put
this folder on ``PYTHONPATH``. Not part of ``paged_np``: it only teaches.
"""

from __future__ import annotations

import copy

import numpy as np

__all__ = ["check", "check_function", "attempt", "is_blank", "Raised"]


class Raised:
    """What :func:`attempt` returns when the learner's function raised."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __repr__(self) -> str:
        return f"an error ({type(self.exc).__name__}: {self.exc})"


def is_blank(answer) -> bool:
    """A blank is ``None`` or ``...``: the learner has not written an answer."""
    return answer is None or answer is Ellipsis


def attempt(fn, *args, **kwargs):
    """Call the learner's function: its result, ``None`` if it is still a blank
    (raises ``NotImplementedError``), or a :class:`Raised` if it fails otherwise."""
    if is_blank(fn):
        return None
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        return None
    except Exception as exc:  # the learner's bug: report it, do not stop the notebook
        return Raised(exc)


def same(answer, expected, atol: float = 1e-9, rtol: float = 1e-7) -> bool:
    """Equal values; numbers, lists of numbers and arrays within tolerance.

    Numbers are never compared with ``==``: a correct ``(reserved - used) / reserved``
    and the package's ``1 - used / reserved`` differ in the last bits of a float.
    """
    if isinstance(answer, Raised):
        return False
    if isinstance(expected, tuple):  # several results: each within tolerance
        return (isinstance(answer, (tuple, list)) and len(answer) == len(expected)
                and all(same(a, e, atol, rtol) for a, e in zip(answer, expected)))
    try:
        e = np.asarray(expected)
        if e.dtype.kind not in "biuf":  # a name, a tuple of names, ...
            return bool(answer == expected)
        a = np.asarray(answer)
        if a.dtype.kind not in "biuf" or a.shape != e.shape:
            return False
        return bool(np.allclose(a, e, rtol=rtol, atol=atol))
    except Exception:  # an answer of the wrong kind is simply not right
        return False


def _show(answer, width: int = 100) -> str:
    """A short form of an answer: numbers to 10 significant digits (enough to see
    where two close floats differ), at most ``width`` characters."""
    try:
        a = np.asarray(answer)
        numeric = a.dtype.kind in "biuf" and not isinstance(answer, (str, bytes))
    except Exception:
        numeric = False
    if isinstance(answer, tuple):
        text = "(" + ", ".join(_show(x, width) for x in answer) + ")"
    elif numeric and a.ndim == 0:
        text = f"{a.item():.10g}" if a.dtype.kind == "f" else repr(a.item())
    elif numeric:
        text = np.array2string(a, threshold=8, separator=", ", max_line_width=10**6,
                               formatter={"float_kind": lambda x: f"{x:.10g}"})
    else:
        text = repr(answer)
    return text if len(text) <= width else text[:width - 3] + "..."


def check(name: str, answers: dict, expected: dict, hints, done: str = "",
          atol: float = 1e-9, rtol: float = 1e-7) -> None:
    """Print one line: exercise ``name`` is not done yet, not right yet (with a hint),
    or right.

    Parameters
    ----------
    name : str
        The exercise's label in the notebook ("1a").
    answers : dict
        ``{variable name: the learner's value}``; a blank (``None``, ``...``)
        means not done yet.
    expected : dict
        ``{variable name: the right value}``, computed by the check cell.
    hints : str or dict
        One hint, or one per variable; shown for the wrong ones only.
    done : str
        A sentence printed with the confirmation (what the answer means).
    atol, rtol : float
        Tolerances for numbers and arrays (``|a - e| <= atol + rtol * |e|``): tight
        enough to refuse a wrong formula, loose enough for the same formula written
        another way.
    """
    blanks = [k for k, v in answers.items() if is_blank(v)]
    if blanks:
        print(f"Exercise {name}: not done yet (fill in {', '.join(blanks)}, "
              f"then run this cell again)")
        return
    wrong = [k for k in answers if not same(answers[k], expected[k], atol, rtol)]
    if wrong:
        shown = "; ".join(f"{k} = {_show(answers[k])}" for k in wrong)
        if isinstance(hints, str):
            tips = hints
        elif len(wrong) == 1:
            tips = hints.get(wrong[0], "")
        else:
            tips = " ".join(f"({k}) {hints[k]}" for k in wrong if k in hints)
        print(f"Exercise {name}: not right yet: {shown}. Hint: {tips}")
        return
    print(f"Exercise {name}: right! {done}".rstrip())


def _where(got, want) -> str:
    """Where two sequences first differ, when that is not plain from the short forms."""
    try:
        g, w = np.asarray(got), np.asarray(want)
        if g.ndim != 1 or w.ndim != 1 or g.dtype.kind not in "biuf":
            return ""
        n = min(len(g), len(w))
        bad = [j for j in range(n) if not np.isclose(g[j], w[j])]
        j = bad[0] if bad else n
        if j >= n and len(g) == len(w):
            return ""
        mine = _show(g[j]) if j < len(g) else "nothing"
        theirs = _show(w[j]) if j < len(w) else "nothing"
        return f" (first difference at index {j}: yours {mine}, the package {theirs})"
    except Exception:
        return ""


def check_function(name: str, fn, oracle, cases, hints: str = "", done: str = "",
                   atol: float = 1e-9, rtol: float = 1e-7, describe=None,
                   blank: str | None = None) -> None:
    """Run the learner's ``fn`` and the package's ``oracle`` on every case; print one line.

    The package is the oracle: ``cases`` is a list of argument tuples (random ones,
    made by the check cell), each case is run through both (on copies, so a function
    that changes its arguments changes nothing the other one sees), and the first case
    where they differ is reported with both results::

        Exercise 1c: not right yet: case 3 of 20 (free=[5, 2], ...): yours gives
        [8, 9], the package [20, 21]. Hint: ...

    Parameters
    ----------
    name : str
        The exercise's label ("1c").
    fn : callable
        The learner's function (a blank raises ``NotImplementedError``: not done yet).
    oracle : callable
        The same signature, answered by ``paged_np``.
    cases : list of tuple
        The arguments of each case.
    hints : str
        Shown with the first difference.
    done : str
        A sentence printed with the confirmation.
    atol, rtol : float
        Tolerances for numbers and arrays (a tuple of results is compared item by item).
    describe : callable, optional
        ``describe(*args) -> str``: a short account of a case (default: its arguments).
    blank : str, optional
        What the learner has still to write, for "not done yet" (default: the body of
        ``fn``).
    """
    cases = list(cases)
    for i, args in enumerate(cases):
        got = attempt(fn, *copy.deepcopy(args))
        if got is None:
            label = blank or f"the body of {getattr(fn, '__name__', 'the function')}"
            print(f"Exercise {name}: not done yet (write {label}, then run this cell again)")
            return
        want = oracle(*copy.deepcopy(args))
        if not same(got, want, atol, rtol):
            what = (describe(*args) if describe else
                    ", ".join(_show(a, max(40, 160 // len(args))) for a in args))
            print(f"Exercise {name}: not right yet: case {i + 1} of {len(cases)} ({what}): "
                  f"yours gives {_show(got)}, the package {_show(want)}{_where(got, want)}. "
                  f"Hint: {hints}".rstrip())
            return
    print(f"Exercise {name}: right! {len(cases)} random cases agree with the package. "
          f"{done}".rstrip())
