"""Attention sinks + sliding window: every backend equals the dense masked reference.

A query at position ``p`` sees keys ``j <= p`` with ``j > p - window`` or
``j < sinks``; the sinks outside the window are scored with ``q_sinks`` when given. Pages
wholly between the sinks and every query's window are -1 holes with NaN
contents: a backend that reads them fails. tests/cudasim/test_cuda_sinks.py
runs :func:`check_sinks` on backend="cuda".
"""

from __future__ import annotations

import numpy as np
import pytest
from attention_cases import TOL, make_paged_case, rel_error
from engine_helpers import BACKENDS

import paged_np as pnp
from paged_np.attention.reference import causal_window_mask, dense_attention

# (page_size, window, sinks): page sizes that divide the window and the sinks and
# ones that do not, a sink page that the window also covers, one sink.
CASES = [(4, 8, 4), (4, 10, 3), (3, 7, 5), (8, 16, 1), (16, 12, 4), (1, 5, 2)]


def sink_case(page_size, window, sinks, n_queries, seq_lens, *, heads=(8, 2), seed=0,
              same_q=False, threads=None):
    """A paged batch with holes outside sinks + window, its q_sinks and its reference."""
    case = make_paged_case(seq_lens, n_queries, num_heads=heads[0], num_kv_heads=heads[1],
                           head_dim=16, page_size=page_size, seed=seed)
    qsl = case.qsl
    rng = np.random.default_rng(seed + 1)
    q_sinks = None if same_q else rng.standard_normal(case.q.shape).astype(np.float32)
    bt = case.block_tables.copy()
    out = np.zeros(case.q.shape)
    lse = np.zeros(case.q.shape[:2])
    for b, L in enumerate(case.seq_lens):
        s, e = int(qsl[b]), int(qsl[b + 1])
        n_q = e - s
        # Pages no query of this sequence reads: wholly past the sinks, before the window.
        first_window_key = max(0, int(L) - n_q - window + 1)
        for i in range(-(-sinks // page_size), first_window_key // page_size):
            case.k_pages[bt[b, i]] = np.nan
            case.v_pages[bt[b, i]] = np.nan
            bt[b, i] = -1
        if n_q:
            out[s:e], lse[s:e] = dense_attention(
                case.q[s:e], case.k_dense[b], case.v_dense[b], sliding_window=window,
                attention_sinks=sinks, q_sinks=None if q_sinks is None else q_sinks[s:e])
    case.block_tables = bt
    return case, q_sinks, (out, lse)


def check_sinks(backend, page_size, window, sinks, n_queries, seq_lens, **kw):
    case, q_sinks, (ref_out, ref_lse) = sink_case(page_size, window, sinks, n_queries,
                                                  seq_lens, **kw)
    out, lse = pnp.paged_attention(*case.args(), sliding_window=window, attention_sinks=sinks,
                                   q_sinks=q_sinks, backend=backend, return_lse=True)
    assert rel_error(out, ref_out) <= TOL, rel_error(out, ref_out)
    assert rel_error(lse, ref_lse) <= TOL
    # The same through a step's metadata (what the model passes every layer).
    meta = pnp.AttentionMetadata.build(case.block_tables, case.seq_lens, case.query_start_loc,
                                       window, num_pages=case.k_pages.shape[0],
                                       page_size=page_size, attention_sinks=sinks)
    out2 = pnp.paged_attention(case.q, case.k_pages, case.v_pages, metadata=meta,
                               q_sinks=q_sinks, backend=backend)
    assert rel_error(out2, ref_out) <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size,window,sinks", CASES)
def test_decode_sees_sinks_and_window(backend, page_size, window, sinks):
    check_sinks(backend, page_size, window, sinks, None, [1, sinks, window + sinks + 1, 37, 70])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size,window,sinks", CASES)
def test_prefill_and_chunks_see_sinks_and_window(backend, page_size, window, sinks):
    # a whole prompt, a chunk deep past the window, a chunk across it, one token
    check_sinks(backend, page_size, window, sinks, [40, 9, 13, 1], [40, 61, 20, 33])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads", [(4, 4), (8, 1), (12, 4)])
def test_gqa_and_sinks_scored_with_q(backend, heads):
    check_sinks(backend, 4, 9, 4, [30, 1, 5], [30, 50, 52], heads=heads, same_q=True)


def test_numba_long_chunk_and_split_k_see_sinks():
    """The BLAS path (chunks of 128+ queries) and split-K decode items (forced)."""
    check_sinks("numba", 16, 100, 4, [300, 140], [300, 400])
    from paged_np.attention import numba_cpu

    case, q_sinks, (ref, _) = sink_case(8, 64, 4, None, [500, 700, 30])
    out, _ = numba_cpu.forward(*case.args()[:5], case.qsl, 0.25, 64, False, num_splits=3,
                               attention_sinks=4, q_sinks=q_sinks)
    case_ref = dense_ref_scaled(case, q_sinks, 64, 4, 0.25)
    assert rel_error(out, case_ref) <= TOL
    assert ref.shape == out.shape


def dense_ref_scaled(case, q_sinks, window, sinks, scale):
    out = np.zeros(case.q.shape)
    for b in range(len(case.seq_lens)):
        s, e = int(case.qsl[b]), int(case.qsl[b + 1])
        out[s:e] = dense_attention(case.q[s:e], case.k_dense[b], case.v_dense[b], scale=scale,
                                   sliding_window=window, attention_sinks=sinks,
                                   q_sinks=q_sinks[s:e])[0]
    return out


def test_mask_is_window_or_sink():
    m = causal_window_mask(3, 10, sliding_window=3, attention_sinks=2)
    assert m.astype(int).tolist() == [
        [1, 1, 0, 0, 0, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 1, 0],
        [1, 1, 0, 0, 0, 0, 0, 1, 1, 1]]
    assert (causal_window_mask(4, 4, 0, 2) == causal_window_mask(4, 4)).all()  # no window


@pytest.mark.parametrize("bad,match", [
    (dict(attention_sinks=-1), "attention_sinks"),
    (dict(attention_sinks=9), "attention_sinks=9 is larger than sliding_window=8"),
    (dict(attention_sinks=1.5), "attention_sinks"),
    (dict(attention_sinks=2, q_sinks=np.zeros((2, 4, 8), np.float32)), "q_sinks"),
])
def test_bad_sinks_are_refused_by_name(bad, match):
    case = make_paged_case([20], None, num_heads=4, num_kv_heads=2, head_dim=8, page_size=4)
    with pytest.raises(pnp.PagedNPError, match=match):
        pnp.paged_attention(*case.args(), sliding_window=8, backend="numpy", **bad)
    if "q_sinks" not in bad:
        with pytest.raises(pnp.PagedNPError, match=match):
            pnp.AttentionMetadata.build(case.block_tables, case.seq_lens, None, 8,
                                        num_pages=case.k_pages.shape[0], page_size=4, **bad)


def test_a_missing_sink_page_is_refused():
    case, q_sinks, _ = sink_case(4, 8, 4, None, [40])
    case.block_tables[0, 0] = -1
    with pytest.raises(pnp.InvalidBlockTable, match=r"block_tables\[0, 0\]"):
        pnp.paged_attention(*case.args(), sliding_window=8, attention_sinks=4, backend="numpy")
    pnp.paged_attention(*case.args(), sliding_window=8, backend="numpy")  # no sinks: unread
