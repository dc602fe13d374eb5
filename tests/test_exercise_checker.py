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
import pytest

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


# ------------------------------------------------------------ the checks, planted bugs
# Each notebook's check cell is run in this process with a planted answer in its
# exercise cell: the cells before it run as shipped (figures to Agg, animations
# skipped), so the check sees the state it sees in Jupyter.
NB = ROOT / "notebooks"
_SKIP = ("viz.animation_html", "viz.event_slider")


def run_check(stem: str, name: str, answer: str) -> str:
    """What the check of exercise ``name`` prints with ``answer`` as its exercise cell."""
    import contextlib
    import io
    import os
    import sys

    import matplotlib
    import nbformat

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if str(NB) not in sys.path:
        sys.path.insert(0, str(NB))
    os.environ.setdefault("MPLBACKEND", "Agg")
    import _exercise

    _exercise._tries.clear()              # a fresh learner: the first wrong try comes first
    nb = nbformat.read(NB / f"{stem}.ipynb", as_version=4)
    ns: dict = {}
    try:
        for cell in nb.cells:
            if cell.cell_type != "code" or cell.source.lstrip().startswith(_SKIP):
                continue
            src = answer if cell.metadata.get("exercise") == name else cell.source
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(src, f"{stem}:{name}", "exec"), ns)
            if cell.metadata.get("check") == name:
                return out.getvalue()
    finally:
        plt.close("all")
    raise AssertionError(f"{stem} has no check {name}")


def _verdict(text: str, name: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith(f"Exercise {name}:")]
    assert len(lines) == 1, text
    return lines[0]


def _solution(stem: str, name: str) -> str:
    build_spec = importlib.util.spec_from_file_location("nb_build", NB / "_build.py")
    build = importlib.util.module_from_spec(build_spec)
    build_spec.loader.exec_module(build)
    return build.solutions(NB / "_src" / f"{stem}.py")[name]


ONLINE_2B = ("def online_attention(q, pages, seq_len):\n"
             "    D = q.shape[0]\n"
             "    {keep}\n"
             "    K = np.concatenate(ks)[:seq_len]\n"
             "    V = np.concatenate(vs)[:seq_len]\n"
             "    s = K @ q / np.sqrt(D)\n"
             "    w = np.exp(s - s.max())\n"
             "    return w @ V / w.sum(), s.max() + np.log(w.sum())\n")


@pytest.mark.parametrize("keep", [
    "ks, vs = zip(*[(k, v) for k, v in pages])",                 # the pages as handed over
    "ks, vs = zip(*[(k.copy(), v.copy()) for k, v in pages])",   # every page copied
], ids=["views", "copies"])
def test_2b_refuses_a_dense_gather_and_softmax(keep):
    out = _verdict(run_check("02_paged_attention_step_by_step", "2b",
                             ONLINE_2B.format(keep=keep)), "2b")
    assert out.startswith("Exercise 2b: not right yet"), out
    assert "One pass" not in out


def test_2b_accepts_the_one_pass_loop_and_shows_every_part_of_a_wrong_lse():
    stem = "02_paged_attention_step_by_step"
    good = _solution(stem, "2b")
    assert _verdict(run_check(stem, "2b", good), "2b").startswith("Exercise 2b: right!")
    wrong = good.replace("return acc / l, m + np.log(l)", "return acc / l, m + np.log(l) + 1")
    out = _verdict(run_check(stem, "2b", wrong), "2b")
    assert "(part 2 of 2 differs)" in out
    mine, theirs = out.split("yours gives ")[1].split(", the package ")
    assert mine.count(", ") >= 6 and mine.rstrip(")").split(", ")[-1] != \
        theirs.split(")")[0].split(", ")[-1]          # the lse is shown, both of them


def test_3d_tests_the_lru_tie_break():
    stem = "03_lru_eviction_and_prefix_caching"
    policy = ("class MyLFU(pnp.EvictionPolicy):\n    name = 'my-lfu'\n\n"
              "    def priority(self, entry):\n        {body}\n")
    right = run_check(stem, "3d", policy.format(
        body="return (entry.hit_count, entry.last_access_time)"))
    assert _verdict(right, "3d").startswith("Exercise 3d: right!")
    for body in ("return entry.hit_count", "return (entry.hit_count, entry.creation_time)",
                 "return entry.last_access_time"):
        out = _verdict(run_check(stem, "3d", policy.format(body=body)), "3d")
        assert out.startswith("Exercise 3d: not right yet"), (body, out)
    out = _verdict(run_check(stem, "3d", policy.format(body="x = entry.hit_count")), "3d")
    assert "returned None" in out


@pytest.mark.parametrize("stem, name, wrong, code", [
    ("01_pages_arena_block_tables", "1c",
     "def allocate_slots(free, block_table, num_tokens, n, page_size):\n"
     "    return list(range(num_tokens, num_tokens + n))\n", "free.pop()"),
    ("03_lru_eviction_and_prefix_caching", "3d",
     "class MyLFU(pnp.EvictionPolicy):\n    name = 'x'\n\n    def priority(self, entry):\n"
     "        return entry.hit_count\n", "entry.last_access_time)"),
    ("04_sharing_fork_copy_on_write", "4b",
     "def allocate_with_cow(block_table, ref_counts, free, num_tokens, n, page_size):\n"
     "    return list(block_table), []\n", "ref_counts[bt[i]] > 1"),
    ("10_kv_quantization", "10",
     "def my_quantize(page):\n    s = np.abs(page).max(axis=1).astype(np.float32)\n"
     "    return np.rint(page / s[:, None]).astype(np.int8), s\n\n\nworst = 1.0\n",
     "astype(np.int8)"),
])
def test_the_first_failure_shows_the_case_not_the_code(stem, name, wrong, code):
    out = _verdict(run_check(stem, name, wrong), name)
    assert out.startswith(f"Exercise {name}: not right yet"), out
    assert code not in out and "run the check again" in out


def test_hints_come_in_tiers_and_code_on_request(capsys):
    ex = _ex()
    hint = ex.Hint("IDEA", code="CODE")
    for _ in range(3):
        ex.check_function("t9", lambda x: x + 1, lambda x: x, [(1,)], hints=hint)
    ex.hint("t9")
    out = capsys.readouterr().out.splitlines()
    assert "IDEA" not in out[0] and "CODE" not in out[0] and "run the check again" in out[0]
    assert out[1].endswith("Hint: IDEA Still stuck? hint('t9') prints the code.")
    assert out[2] == out[1]
    assert out[3] == "Exercise t9: CODE"


def test_a_tuple_mismatch_shows_every_part_and_which_differ(capsys):
    ex = _ex()
    want = (np.linspace(0, 1, 8) * 1.23456789, 3.0504322)
    got = (want[0].copy(), 3.5504322)
    ex.check_function("tt", lambda: got, lambda: want, [()])
    out = capsys.readouterr().out
    assert "3.5504322" in out and "3.0504322" in out and "(part 2 of 2 differs)" in out
    assert "..." not in out.split("yours gives ")[1].split("the package")[0][-40:]


def test_a_body_without_return_is_told_it_returned_none(capsys):
    ex = _ex()

    def no_return(x):
        x + 1

    ex.check_function("tn", no_return, lambda x: x, [(1,)])
    ex.check("tv", {"f": ex.attempt(no_return, 1)}, {"f": 2}, hints="h")
    out = capsys.readouterr().out.splitlines()
    assert "yours returned None" in out[0] and "not done yet" not in out[0]
    assert "returned None" in out[1] and out[1].startswith("Exercise tv: not right yet")


# ------------------------------------------------ 5d: the sampling rule, by chi-square
def _five_d():
    src = (NB / "_src" / "05_serving_continuous_batching.py").read_text()
    return src.split("# %% check 5d")[1].split("# %% [markdown]")[0]


def _run_5d(accept, resid) -> str:
    import contextlib
    import io
    import sys

    if str(NB) not in sys.path:
        sys.path.insert(0, str(NB))
    ex = _ex()
    ns = {"np": np, "Hint": ex.Hint, "check_property": ex.check_property,
          "accept_probability": accept, "residual": resid}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_five_d(), ns)
    return _verdict(out.getvalue(), "5d")


def _normalised(r):
    return r / r.sum()


def test_5d_accepts_the_rule_and_refuses_wrong_ones():
    right = _run_5d(lambda p, q, d: min(1.0, p[d] / q[d]),
                    lambda p, q: _normalised(np.maximum(p - q, 0.0)))
    assert right.startswith("Exercise 5d: right!"), right
    for accept, resid in [
        (lambda p, q, d: min(1.0, p[d] / q[d]), lambda p, q: p),            # resample from p
        (lambda p, q, d: 1.0, lambda p, q: p),                               # keep every draft
        (lambda p, q, d: p[d], lambda p, q: _normalised(np.maximum(p - q, 0.0))),
        (lambda p, q, d: min(1.0, p[d] / q[d]),
         lambda p, q: _normalised(np.maximum(q - p, 0.0))),
    ]:
        out = _run_5d(accept, resid)
        assert out.startswith("Exercise 5d: not right yet") and "chi-square" in out, out


def test_the_package_rejection_sampler_passes_the_same_chi_square_test():
    """paged_np.engine.rejection with a draft distribution: one draft, its row and the
    bonus row; the first emitted token must be distributed as p (the check's test)."""
    import paged_np as pnp
    from paged_np.engine.rejection import rejection_sample

    ns: dict = {"np": np, "Hint": _ex().Hint, "check_property": lambda *a, **k: None}
    exec(_five_d().split("r = np.random.default_rng(8)")[0], ns)
    rng = np.random.default_rng(0)
    V, N = 6, 20_000
    p = rng.dirichlet(np.ones(V))
    q = rng.dirichlet(np.ones(V) * 0.5)
    logits = np.log(np.vstack([p, p]))                      # temperature 1: probs = p
    params = pnp.SamplingParams(temperature=1.0)
    first = np.empty(N, np.int64)
    for i in range(N):
        d = int(rng.choice(V, p=q))
        first[i] = rejection_sample(logits, [d], q[None], params, rng)[0]
    spec = np.bincount(first, minlength=V)
    plain = np.bincount(rng.choice(V, size=N, p=p), minlength=V)
    stat, df = ns["chi_square"](spec, plain)
    assert stat <= ns["critical"](df), (stat, spec, plain)
