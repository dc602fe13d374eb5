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

import numpy as np

__all__ = ["check", "attempt", "is_blank"]


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


def same(answer, expected, atol: float = 1e-6) -> bool:
    """Equal values; numbers and arrays within ``atol`` (and of the same shape)."""
    if isinstance(answer, Raised):
        return False
    try:
        numeric = isinstance(expected, np.ndarray) or (
            np.isscalar(expected) and not isinstance(expected, (str, bytes)))
        if not numeric:  # a name, a tuple of names, ...
            return bool(answer == expected)
        a, e = np.asarray(answer), np.asarray(expected)
        if a.dtype.kind not in "biuf" or a.shape != e.shape:
            return False
        return bool(np.allclose(a, e, rtol=0, atol=atol))
    except Exception:  # an answer of the wrong kind is simply not right
        return False


def _show(answer) -> str:
    """A short form of an answer: numbers to 4 digits, at most 60 characters."""
    try:
        a = np.asarray(answer)
        numeric = a.dtype.kind in "biuf" and a.ndim > 0
    except Exception:
        numeric = False
    text = (np.array2string(a, precision=4, threshold=6, separator=", ") if numeric
            else repr(answer))
    return text if len(text) <= 60 else text[:57] + "..."


def check(name: str, answers: dict, expected: dict, hints, done: str = "",
          atol: float = 1e-6) -> None:
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
    atol : float
        Tolerance for numbers and arrays.
    """
    blanks = [k for k, v in answers.items() if is_blank(v)]
    if blanks:
        print(f"Exercise {name}: not done yet (fill in {', '.join(blanks)}, "
              f"then run this cell again)")
        return
    wrong = [k for k in answers if not same(answers[k], expected[k], atol)]
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
