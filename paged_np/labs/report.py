"""What a lab tells the learner: not done yet, not right yet (and where), or accepted.

A refusal names four things, and shows every part of what differed (nothing is
cut: a wrong ``lse`` hides behind a right ``out`` only if the message stops
early):

- the **function** of the learner's file that is wrong;
- the **case**: the inputs it was given (a random case, a hidden edge case, or
  a step of an engine run);
- **what differed**: each value the learner's code gave against the package's;
- a **hint**, in tiers the learner asks for: the failing case alone by default,
  then the idea behind the function (``--hint 2``), then how to write it
  (``--hint 3``). The solution itself is never printed.

Both refusals are :class:`~paged_np.errors.PagedNPError` s, so a caller that
drives labs from Python (a notebook, the tests) catches them like any other
error of the package.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import PagedNPError

__all__ = ["LabFailure", "NotDoneYet", "expect", "format_refusal", "same", "show"]


class NotDoneYet(PagedNPError):
    """The learner's function still raises ``NotImplementedError`` (the stub's body)."""

    def __init__(self, function: str, path: str = ""):
        self.function, self.path = function, path
        super().__init__(f"{function}: not done yet")


class LabFailure(PagedNPError):
    """The learner's ``function`` gave a wrong answer (or none) on ``case``.

    ``differed`` is a list of lines, each shown in full: ``"returned: ..."``,
    ``"expected: ..."``, or a sentence saying which rule was broken.
    ``case`` may be filled in later by whoever knows it (an engine run knows
    the chat and the step a seam was called in; the seam itself does not).
    """

    def __init__(self, function: str, differed, case: str = ""):
        self.function = function
        self.differed = [differed] if isinstance(differed, str) else list(differed)
        self.case = case
        super().__init__(f"{function}: " + "; ".join(self.differed))


def show(value) -> str:
    """A value in full: arrays with every element, floats to 10 significant digits,
    tuples part by part. Never cut, whatever its length."""
    if isinstance(value, tuple):
        return "(" + ", ".join(show(v) for v in value) + ")"
    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        fmt = {"float_kind": lambda x: f"{x:.10g}"} if kind == "f" else None
        text = np.array2string(value, threshold=sys.maxsize, separator=", ",
                               max_line_width=120, formatter=fmt)
        return f"{text} ({value.dtype}, shape {list(value.shape)})"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.10g}"
    if isinstance(value, np.integer):
        return repr(int(value))
    if isinstance(value, np.bool_):
        return repr(bool(value))
    return repr(value)


def first_difference(got, want, atol: float = 0.0, rtol: float = 0.0) -> str:
    """Where two sequences (or arrays) first differ, as a sentence; "" if they do not."""
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return f"shape {list(g.shape)} where {list(w.shape)} was expected"
    if g.size == 0:
        return ""
    close = np.isclose(g, w, atol=atol, rtol=rtol, equal_nan=False) if g.dtype.kind in "fc" \
        or w.dtype.kind in "fc" else g == w
    if np.all(close):
        return ""
    idx = tuple(int(i) for i in np.argwhere(~close)[0])
    where = idx[0] if len(idx) == 1 else list(idx)
    return f"first difference at index {where}: {show(g[idx])} where {show(w[idx])} was expected"


def format_refusal(lab: str, failure: LabFailure, path: str, hints: dict, level: int) -> str:
    """The message a refused lab prints (see the module docstring).

    ``hints`` maps a function name to ``(idea, how)``; ``level`` is 1 (the case
    only), 2 (and the idea) or 3 (and how to write it).
    """
    lines = [f"lab {lab}: not right yet.",
             f"  function: {failure.function}   ({path})"]
    if failure.case:
        lines.append(f"  case: {failure.case}")
    lines.append("  what differed:")
    lines += [f"    {line}" for part in failure.differed for line in str(part).splitlines()]
    idea, how = hints.get(failure.function, ("", ""))
    if level >= 2 and idea:
        lines.append(f"  idea: {idea}")
    if level >= 3 and how:
        lines.append(f"  how: {how}")
    if level < 3 and (idea or how):
        nxt = 2 if level < 2 and idea else 3
        lines.append(f"  stuck? run it again with --hint {nxt}"
                     + (" for the idea behind it" if nxt == 2 else " for how to write it"))
    return "\n".join(lines)


def same(got, want, atol: float = 0.0, rtol: float = 0.0) -> bool:
    """Equal values: arrays of the same shape within tolerance, tuples part by part."""
    if isinstance(want, tuple):
        return (isinstance(got, (tuple, list)) and len(got) == len(want)
                and all(same(g, w, atol, rtol) for g, w in zip(got, want)))
    try:
        g, w = np.asarray(got), np.asarray(want)
        if g.shape != w.shape or g.dtype.kind not in "biuf" or w.dtype.kind not in "biuf":
            return bool(got == want)
        return bool(np.allclose(g, w, atol=atol, rtol=rtol, equal_nan=True))
    except Exception:                 # a value of the wrong kind is simply not equal
        return False


def expect(function: str, case: str, got, want, atol: float = 0.0, rtol: float = 0.0,
           why: str = "") -> None:
    """Refuse ``function`` on ``case`` unless ``got`` equals ``want``; every part shown."""
    if same(got, want, atol, rtol):
        return
    lines = [f"returned: {show(got)}", f"expected: {show(want)}"]
    if isinstance(want, tuple) and isinstance(got, (tuple, list)) and len(got) == len(want):
        lines = []
        for i, (g, w) in enumerate(zip(got, want)):
            ok = same(g, w, atol, rtol)
            lines += [f"part {i} returned: {show(g)}{'' if ok else '   <- differs'}",
                      f"part {i} expected: {show(w)}"]
            where = "" if ok or not _is_seq(w) else first_difference(g, w, atol, rtol)
            lines += [f"part {i}: {where}"] if where else []
    else:
        where = first_difference(got, want, atol, rtol) if _is_seq(got) else ""
        lines += [where] if where else []
    raise LabFailure(function, lines + ([why] if why else []), case)


def _is_seq(x) -> bool:
    try:
        return np.asarray(x).dtype.kind in "biuf" and np.ndim(x) > 0
    except Exception:
        return False
