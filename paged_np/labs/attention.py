"""Lab 2, paged attention in one pass: ``attend_page(state, q, k_page, v_page, mask)``
and ``finish(state)``.

The learner writes the online softmax (Milakov & Gimelshein 2018, the loop
inside FlashAttention and vLLM's PagedAttention): a running max ``m``, a
running sum ``l`` and a running weighted sum ``acc``, corrected as each page
arrives, then ``out = acc / l`` and ``lse = m + log(l)``.

How one pass is enforced: the lab's attention backend (a module with
``forward``, registered in ``ATTENTION_BACKENDS``) walks each sequence's block
table itself and hands the learner **one page at a time**, a fresh copy of
that page's valid rows which it poisons (fills with NaN) as soon as the call
returns; and the state must come back as the three running values of fixed
shape, whatever the number of pages seen. A dense gather-then-softmax has
nothing to gather, and a state that keeps pages is refused by its shape.

Rows: the queries of one sequence times the query heads that read one kv head
(GQA), already multiplied by the softmax scale; the mask says which keys of
the page each row may see (causal, and the sliding window if the model has
one). The lab checks ``finish`` alone, then the state after every page
against the package's attention over the pages so far, then whole batches
against :mod:`paged_np.attention.numpy_paged`, then serves.
"""

from __future__ import annotations

import types

import numpy as np

from ..attention import numpy_paged
from ..attention.numpy_paged import to_float32
from .report import LabFailure, expect, show

TITLE = "paged attention with the one-pass online softmax"
FILE = "02_attention.py"
FUNCTIONS = ("attend_page", "finish")
BLAME = "attend_page"
ATOL, RTOL = 2e-5, 1e-4

HINTS = {
    "attend_page": (
        "Softmax needs the max and the sum over all of a row's scores, but you see one "
        "page at a time. Keep m (max so far), l (sum of exp(s - m)) and acc (sum of "
        "exp(s - m) * v). When a page raises the max, every old term was measured against "
        "the old max: multiply l and acc by exp(m_old - m_new) before adding the page. A "
        "row may see no key of a page yet (its max is still -inf): use 0 as the "
        "reference there, or exp(-inf - (-inf)) is NaN.",
        "s = np.where(mask, q @ k_page.T, -np.inf)  [R, P]; m_new = np.maximum(m, "
        "s.max(axis=1)); ref = np.where(np.isfinite(m_new), m_new, 0); alpha = np.exp(m - "
        "ref); p = np.exp(s - ref[:, None]); l = alpha * l + p.sum(axis=1); acc = "
        "alpha[:, None] * acc + p @ v_page; return m_new, l, acc."),
    "finish": (
        "acc holds the weighted sum of values and l the total weight, both measured "
        "against the same max m; the log of the total mass exp(m) * l is the row's lse.",
        "return acc / l[:, None], m + np.log(l)."),
}


def initial_state(rows: int, head_dim: int) -> tuple:
    """``(m, l, acc)`` before any page: -inf, 0, zeros (float32)."""
    return (np.full(rows, -np.inf, np.float32), np.zeros(rows, np.float32),
            np.zeros((rows, head_dim), np.float32))


def call_attend_page(learner, state, q, k_page, v_page, mask, case: str = "") -> tuple:
    """The learner's update on one page; the page it saw is poisoned afterwards."""
    k, v = k_page.copy(), v_page.copy()                  # its own copy of this page only
    got = learner.call("attend_page", tuple(x.copy() for x in state), q, k, v, mask.copy(),
                       case=case)
    k.fill(np.nan)                                       # kept for later? it reads NaN
    v.fill(np.nan)
    rows, d = q.shape
    shapes = [[rows], [rows], [rows, d]]
    if not isinstance(got, (tuple, list)) or len(got) != 3 or \
            [list(np.shape(x)) for x in got] != shapes:
        parts = ([list(np.shape(x)) for x in got] if isinstance(got, (tuple, list))
                 else show(got))
        raise LabFailure("attend_page", [
            f"returned a state of shapes {parts}; expected (m, l, acc) of shapes {shapes}",
            "the state is three running values, the same size whatever the number of pages "
            "seen: keeping pages (or scores) in it would be a second pass"], case)
    return tuple(np.asarray(x, np.float32) for x in got)


def call_finish(learner, state, case: str = "") -> tuple:
    got = learner.call("finish", tuple(x.copy() for x in state), case=case)
    rows, d = state[2].shape
    if not isinstance(got, (tuple, list)) or len(got) != 2 or \
            [list(np.shape(x)) for x in got] != [[rows, d], [rows]]:
        raise LabFailure("finish", [f"returned {show(got)}",
                                    f"expected (out [{rows}, {d}], lse [{rows}])"], case)
    return tuple(np.asarray(x, np.float32) for x in got)


def finish_reference(state) -> tuple:
    """The package's normalisation: rows that saw nothing give out 0 and lse -inf."""
    m, l, acc = state
    seen = l > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        out = acc / np.where(seen, l, 1)[:, None]
        lse = np.where(seen, m + np.log(np.where(seen, l, 1)), -np.inf)
    return out.astype(np.float32), lse.astype(np.float32)


def attend(learner, q, k_pages, v_pages, block_table, seq_len, scale, window,
           k_scales=None, v_scales=None, after_page=None):
    """One sequence's queries ``q`` [n_q, H, D] over its pages, through the learner's
    functions, page by page and kv head by kv head; ``(out [n_q, H, D], lse [n_q, H])``.

    ``after_page(kv, i, state)`` is called after each page (the checks use it)."""
    n_q, num_heads, d = q.shape
    _, num_kv, ps, _ = k_pages.shape
    group = num_heads // num_kv
    q_pos = np.arange(seq_len - n_q, seq_len)                            # [n_q]
    row_pos = np.repeat(q_pos, group)                                    # [R]
    qg = q.reshape(n_q, num_kv, group, d).transpose(1, 0, 2, 3).reshape(num_kv, -1, d)
    qg = (qg * np.float32(scale)).astype(np.float32)                     # [KV, R, D]
    out = np.empty((num_kv, n_q * group, d), np.float32)
    lse = np.empty((num_kv, n_q * group), np.float32)
    seq_text = (f"seq_len={seq_len}, page_size={ps}, block_table="
                f"{[int(p) for p in block_table[:-(-seq_len // ps)]]}, {n_q} queries x "
                f"{group} heads per kv head")
    for kv in range(num_kv):
        state = initial_state(n_q * group, d)
        for i in range(-(-seq_len // ps)):
            start = i * ps
            n_valid = min(ps, seq_len - start)
            if window and start + n_valid - 1 <= q_pos[0] - window:
                continue                                  # wholly before every window
            k_pos = np.arange(start, start + n_valid)
            mask = k_pos[None, :] <= row_pos[:, None]                    # [R, P] causal
            if window:
                mask &= k_pos[None, :] > row_pos[:, None] - window
            page = block_table[i]
            ks = None if k_scales is None else k_scales[page, kv, :n_valid]
            vs = None if v_scales is None else v_scales[page, kv, :n_valid]
            case = (f"{seq_text}; kv head {kv}, page {i} (page id {page}, {n_valid} valid "
                    "rows)")
            state = call_attend_page(learner, state, qg[kv],
                                     to_float32(k_pages[page, kv, :n_valid], ks),
                                     to_float32(v_pages[page, kv, :n_valid], vs), mask, case)
            if after_page is not None:
                after_page(kv, i, state)
        out[kv], lse[kv] = call_finish(learner, state, f"seq_len={seq_len}, kv head {kv}")
    out = out.reshape(num_kv, n_q, group, d).transpose(1, 0, 2, 3).reshape(n_q, num_heads, d)
    lse = lse.reshape(num_kv, n_q, group).transpose(1, 0, 2).reshape(n_q, num_heads)
    return out, lse


def backend(learner):
    """An attention backend module (``forward``, as :mod:`~paged_np.attention.numpy_paged`)."""

    def forward(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, scale,
                sliding_window, return_lse, k_scales=None, v_scales=None):
        out = np.empty(q.shape, np.float32)                              # [T, H, D]
        lse = np.empty(q.shape[:2], np.float32)                          # [T, H]
        for b in range(len(seq_lens)):
            s, e = int(query_start_loc[b]), int(query_start_loc[b + 1])
            if s < e:
                out[s:e], lse[s:e] = attend(learner, q[s:e], k_pages, v_pages,
                                            block_tables[b], int(seq_lens[b]), scale,
                                            sliding_window, k_scales, v_scales)
        return out, (lse if return_lse else None)

    return types.SimpleNamespace(forward=forward, __name__="lab attention")


def random_sequence(r, window=None):
    ps, d, kv, group = int(r.choice([2, 4, 8])), 8, 2, 2
    seq_len = int(r.integers(1, 40))
    n_q = int(r.integers(1, min(seq_len, 5) + 1))
    pages = -(-seq_len // ps)
    kp, vp = (r.normal(size=(pages + 6, kv, ps, d)).astype(np.float32) for _ in range(2))
    q = (3 * r.normal(size=(n_q, kv * group, d))).astype(np.float32)   # spread scores
    table = r.permutation(pages + 6)[:pages].astype(np.int32)
    return q, kp, vp, table, seq_len, 1 / np.sqrt(d), window


def check(learner, rng) -> None:
    """``finish`` alone, then the state after each page, then whole batches."""
    for _ in range(10):
        rows, d = int(rng.integers(1, 6)), 8
        state = (rng.normal(size=rows).astype(np.float32),
                 rng.uniform(0.5, 5, rows).astype(np.float32),
                 rng.normal(size=(rows, d)).astype(np.float32))
        expect("finish", f"state m={show(state[0])}, l={show(state[1])}, acc={show(state[2])}",
               call_finish(learner, state), finish_reference(state), ATOL, RTOL)
    cases = [random_sequence(rng) for _ in range(25)]
    cases += [random_sequence(rng, window=int(rng.integers(1, 6))) for _ in range(8)]
    for q, kp, vp, table, seq_len, scale, window in cases:
        n_q, ps, group = q.shape[0], kp.shape[2], q.shape[1] // kp.shape[1]
        desc = (f"one sequence: seq_len={seq_len}, page_size={ps}, block_table="
                f"{table.tolist()}, {n_q} queries (positions {seq_len - n_q}..{seq_len - 1}) "
                f"x {group} heads per kv head, sliding_window={window}")

        def after_page(kv, i, state, q=q, kp=kp, vp=vp, table=table, seq_len=seq_len,
                       scale=scale, window=window, desc=desc, group=group):
            o, s = numpy_paged.attend_sequence(q, kp, vp, table, seq_len, scale, window,
                                               end_page=i + 1)
            heads = slice(kv * group, (kv + 1) * group)
            want = (o[:, heads].reshape(-1, q.shape[2]), s[:, heads].reshape(-1))
            expect("attend_page", f"{desc}; kv head {kv}, after page {i} (page id "
                                  f"{int(table[i])}, positions {i * kp.shape[2]}..)",
                   finish_reference(state), want, ATOL, RTOL,
                   why="(out, lse) of your state so far, against attention over the pages "
                       f"0..{i} (the state is finished the package's way, acc / l and "
                       "m + log(l), to judge attend_page alone)")

        attend(learner, q, kp, vp, table, seq_len, scale, window, after_page=after_page)
    for _ in range(5):                                    # batches, as the model calls it
        seqs = [random_sequence(rng) for _ in range(3)]
        for q, kp, vp, table, seq_len, scale, window in seqs:
            got = attend(learner, q, kp, vp, table, seq_len, scale, window)
            want = numpy_paged.attend_sequence(q, kp, vp, table, seq_len, scale, window)
            expect("attend_page", f"seq_len={seq_len}, block_table={table.tolist()}, "
                                  f"{q.shape[0]} queries, all heads", got, want, ATOL, RTOL)


def swap(learner):
    from ..registry import ATTENTION_BACKENDS
    from .runner import Swap

    return Swap(entries=[(ATTENTION_BACKENDS, backend(learner))])
