"""The notebooks' exercise checker: says "not done yet", gives a hint, or confirms.

An exercise cell leaves blanks for the learner (``n_pages = None``, or a function
whose body is ``raise NotImplementedError``). The check cell below it computes the
right values from the package and calls :func:`check`, which prints one line:

    Exercise 1a: not done yet (fill in n_pages, then run this cell again)
    Exercise 1a: not right yet: n_pages = 2. Hint: ...
    Exercise 1a: right! ...

An exercise that asks for a function is run beside the package on random cases
(:func:`check_function`), or judged by a property of what it does
(:func:`check_property`: 5d's sampling rule, by the distribution it draws). A wrong
answer shows every part of it; a function that returns nothing is told so ("returned
None"). A :class:`Hint` comes in tiers: the failing case alone on the first wrong
try, then the idea, and the code only when asked for (``hint("1c")``).

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

__all__ = ["check", "check_function", "check_property", "attempt", "is_blank", "hint", "Hint",
           "Raised", "ReturnedNone", "OneAtATime", "KeptThePages", "in_one_pass",
           "ties_at_random"]


class Raised:
    """What :func:`attempt` returns when the learner's function raised."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __repr__(self) -> str:
        return f"an error ({type(self.exc).__name__}: {self.exc})"


class ReturnedNone:
    """What :func:`attempt` returns when the learner's function ran to its end and gave
    back nothing: a body without ``return`` is a bug to name, not a blank."""

    def __repr__(self) -> str:
        return "None (the function returned None: does its body end with a return?)"


RETURNED_NONE = ReturnedNone()


class Hint:
    """A hint in tiers. A wrong answer is first shown only with the case it failed;
    from the second wrong try on, ``idea`` (the concept) is added; ``code`` (the
    answer's shape in code) is printed only on request, by ``hint(name)``."""

    def __init__(self, idea: str, code: str = ""):
        self.idea, self.code = idea, code


_tries: dict = {}     # exercise name -> wrong tries so far (this kernel's session)
_code: dict = {}      # exercise name -> its code hints, for hint(name)


def hint(name: str) -> None:
    """Print the code-level hint of exercise ``name`` (after its check has run once)."""
    code = _code.get(name)
    print(f"Exercise {name}: {code}" if code else
          f"Exercise {name}: no code hint (run its check first; some exercises have none)")


def _hint_text(name: str, hints, wrong=None) -> str:
    """The hint for this wrong try of exercise ``name``.

    ``hints`` is a string, a :class:`Hint`, or a dict of either per variable (only
    those in ``wrong`` are used). Strings are shown at once. With a :class:`Hint`,
    the first wrong try shows only the case; later ones add the idea; the code is
    kept for :func:`hint`.
    """
    if isinstance(hints, dict):
        chosen = {k: hints[k] for k in (wrong if wrong is not None else hints) if k in hints}
    else:
        chosen = {"": hints}
    label = len(chosen) > 1

    def say(k, text):
        return f"({k}) {text}" if label else text

    idea = " ".join(say(k, h.idea if isinstance(h, Hint) else h) for k, h in chosen.items())
    if not any(isinstance(h, Hint) for h in chosen.values()):
        return idea
    _tries[name] = tries = _tries.get(name, 0) + 1
    codes = [say(k, h.code) for k, h in chosen.items() if isinstance(h, Hint) and h.code]
    if codes:
        _code[name] = " ".join(codes)
    if tries == 1:
        return ("compare the two answers on this case first; run the check again after "
                "your next try for a hint on the idea")
    return idea + (f" Still stuck? hint({name!r}) prints the code." if codes else "")


def is_blank(answer) -> bool:
    """A blank is ``None`` or ``...``: the learner has not written an answer."""
    return answer is None or answer is Ellipsis


def attempt(fn, *args, **kwargs):
    """Call the learner's function: its result, ``None`` if it is still a blank
    (raises ``NotImplementedError``), or a :class:`Raised` if it fails otherwise."""
    if is_blank(fn):
        return None
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError:
        return None
    except Exception as exc:  # the learner's bug: report it, do not stop the notebook
        return Raised(exc)
    return RETURNED_NONE if result is None else result


def same(answer, expected, atol: float = 1e-9, rtol: float = 1e-7) -> bool:
    """Equal values; numbers, lists of numbers and arrays within tolerance.

    Numbers are never compared with ``==``: a correct ``(reserved - used) / reserved``
    and the package's ``1 - used / reserved`` differ in the last bits of a float.
    """
    if isinstance(answer, (Raised, ReturnedNone)):
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
    where two close floats differ), at most ``width`` characters; a tuple shows every
    part, each in its own short form, never cut as a whole."""
    try:
        a = np.asarray(answer)
        numeric = a.dtype.kind in "biuf" and not isinstance(answer, (str, bytes))
    except Exception:
        numeric = False
    if isinstance(answer, tuple):
        return "(" + ", ".join(_show(x, width) for x in answer) + ")"
    if numeric and a.ndim == 0:
        text = f"{a.item():.10g}" if a.dtype.kind == "f" else repr(a.item())
    elif numeric:
        text = np.array2string(a, threshold=8, separator=", ", max_line_width=10**6,
                               formatter={"float_kind": lambda x: f"{x:.10g}"})
        text = " ".join(text.split())                # a 2-D array on the verdict's line
    else:
        text = repr(answer)
        if isinstance(answer, Raised):
            return text                              # an error message is shown whole
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
    hints : str, Hint or dict
        One hint, or one per variable; shown for the wrong ones only. A
        :class:`Hint` comes in tiers: the case first, then the idea, the code on
        request.
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
        tips = _hint_text(name, hints, wrong)
        print(f"Exercise {name}: not right yet: {shown}. Hint: {tips}")
        return
    print(f"Exercise {name}: right! {done}".rstrip())


def _where(got, want, atol: float = 1e-9, rtol: float = 1e-7) -> str:
    """Where two answers first differ, when that is not plain from the short forms:
    the parts of a tuple that differ, or a sequence's first differing index."""
    if isinstance(want, tuple) and isinstance(got, (tuple, list)) and len(got) == len(want):
        bad = [j + 1 for j, (g, w) in enumerate(zip(got, want)) if not same(g, w, atol, rtol)]
        if bad and len(want) > 1:
            return f" (part{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} of " \
                   f"{len(want)} differ{'' if len(bad) > 1 else 's'})"
        return ""
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
    hints : str or Hint
        Shown with the first difference (a :class:`Hint`: in tiers, the case alone on
        the first wrong try).
    done : str
        A sentence printed with the confirmation.
    atol, rtol : float
        Tolerances for numbers and arrays (a tuple of results is compared item by item,
        and every part is shown).
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
            if isinstance(got, ReturnedNone):
                gives = f"yours returned None (a body without a return?), the package {_show(want)}"
            else:
                gives = (f"yours gives {_show(got)}, the package {_show(want)}"
                         f"{_where(got, want, atol, rtol)}")
            tip = _hint_text(name, hints)
            print(f"Exercise {name}: not right yet: case {i + 1} of {len(cases)} ({what}): "
                  f"{gives}." + (f" Hint: {tip}" if tip else ""))
            return
    print(f"Exercise {name}: right! {len(cases)} random cases agree with the package. "
          f"{done}".rstrip())


# ------------------------------------------------------ helpers some checks need
class OneAtATime:
    """A sequence's pages handed over one at a time, as a kernel reads them (2b).

    Iterating gives ``(K, V)`` per page, in logical order, each ``[P, D]`` (of the last
    page only the sequence's rows are its own; the rest is stale). Both arrays are one
    buffer the next page overwrites, and after the last page they hold NaN: a page
    kept to use later is gone. The pages can be walked once. So a function that
    gathers every key and takes one softmax at the end computes from garbage, and
    only the one-pass loop (``m``, ``l``, ``acc`` updated page by page) is right.
    """

    def __init__(self, k_pages, v_pages, block_table, seq_len: int):
        self.k_pages, self.v_pages = k_pages, v_pages    # [num_pages, P, D] each
        self.block_table, self.seq_len = [int(p) for p in block_table], int(seq_len)
        self.walked = False

    def __iter__(self):
        if self.walked:
            raise RuntimeError("the pages come once: one pass, keeping m, l and acc")
        self.walked = True
        P, D = self.k_pages.shape[1:]
        k_buf = np.empty((P, D), self.k_pages.dtype)
        v_buf = np.empty((P, D), self.v_pages.dtype)
        for page in self.block_table:                    # whole pages, as the arena holds
            k_buf[:], v_buf[:] = self.k_pages[page], self.v_pages[page]
            yield k_buf, v_buf
        k_buf[:], v_buf[:] = np.nan, np.nan              # nothing left to read later

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of K (one page of V is as many)."""
        return int(self.k_pages[0].nbytes)

    def __repr__(self) -> str:
        return (f"seq_len={self.seq_len}, P={self.k_pages.shape[1]}, "
                f"block_table={self.block_table}")


class KeptThePages(Exception):
    """Raised by :func:`in_one_pass` when a function held many pages at once."""


def in_one_pass(fn, q, pages: OneAtATime, seq_len: int, pages_held: int = 4):
    """``fn(q, pages, seq_len)`` with its memory traced: :class:`KeptThePages` if at
    any moment it held more than ``pages_held`` pages' bytes (plus 8 KiB), which a
    loop keeping only ``m``, ``l`` and ``acc`` never does, and a copy of every page
    kept for a softmax at the end does on a long sequence."""
    import tracemalloc

    mine = not tracemalloc.is_tracing()
    if mine:
        tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        result = fn(q, pages, seq_len)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if mine:
            tracemalloc.stop()
    budget = pages_held * pages.page_bytes + 8192
    if peak > budget:
        raise KeptThePages(f"it held {peak:,} bytes at once, more than {pages_held} pages' "
                           f"worth ({budget:,}): the one-pass loop keeps m, l and acc, "
                           "never the pages")
    return result


def _mix(*ints) -> int:
    """A 64-bit hash of some ints (splitmix64 steps): a fixed draw per stamps and seed."""
    x = 0
    for v in ints:
        x = (x ^ (int(v) & 0xFFFFFFFFFFFFFFFF)) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
        x = x * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 27
    return x


def ties_at_random(policy, seed: int):
    """An eviction policy with ties broken at random: ``(its key, a hash of the stamps)``.

    ``policy`` is an ``EvictionPolicy`` subclass, object or registered name. Still a
    pure function of the entry's stamps, as the index's heap needs. Without it the
    heap breaks ties in the order entries were queued, which is LRU's order, so a
    key with ties (a hit count alone, a constant) would lean on LRU without saying
    so. The checks of 3d and the capstone run every policy this way.
    """
    import paged_np as pnp
    from paged_np.cache.eviction import make_policy

    inner = make_policy(policy)

    class TiesAtRandom(pnp.EvictionPolicy):
        name = f"{inner.name}, ties at random"

        def priority(self, entry):
            key = inner.priority(entry)
            if key is None:
                raise ValueError(f"{type(inner).__name__}.priority returned None "
                                 "(a body without a return?)")
            return (key,
                    _mix(seed, entry.last_access_time, entry.creation_time or 0,
                         entry.hit_count))

    return TiesAtRandom()


def check_property(name: str, test, cases, hints="", done: str = "", describe=None,
                   blank: str | None = None) -> None:
    """Check a property of the learner's code on every case; print one line.

    For an exercise judged by what its code *does* rather than by equal numbers (5d:
    a sampling rule, judged by the distribution it draws): ``test(*case)`` returns
    None when the property holds and a sentence saying how it fails otherwise; it
    calls the learner's functions (a blank raises ``NotImplementedError``: not done
    yet; another error is reported as such).
    """
    cases = list(cases)
    for i, args in enumerate(cases):
        try:
            failure = test(*copy.deepcopy(args))
        except NotImplementedError:
            print(f"Exercise {name}: not done yet (write {blank or 'the blanks'}, then run "
                  "this cell again)")
            return
        except Exception as exc:  # the learner's bug
            failure = f"an error ({type(exc).__name__}: {exc})"
        if failure:
            what = describe(*args) if describe else ", ".join(_show(a, 60) for a in args)
            tip = _hint_text(name, hints)
            print(f"Exercise {name}: not right yet: case {i + 1} of {len(cases)} ({what}): "
                  f"{failure}." + (f" Hint: {tip}" if tip else ""))
            return
    print(f"Exercise {name}: right! {len(cases)} cases. {done}".rstrip())
