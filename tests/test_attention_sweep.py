"""paged_attention equals the float64 dense reference across the issue's sweep.

Bar: ``max|out - ref| <= 1e-5 * max(1, max|ref|)``, and the same for ``lse``
(see ``attention_cases.rel_error``).

Coverage of the sweep's axes without the full cartesian product (3,840 runs):
the product of page_size x heads x kv dtype x (decode, chunked prefill) x
(window off, on) is taken in full (128 configurations), head_dim is cycled over
them (each of the 5 values meets every page size), and every configuration's
batch holds all six sequence lengths {1, ps-1, ps, ps+1, 137, 300} at once
(ps-1 = 0 only in prefill, with no queries). Block tables are shuffled and every
unused slot and spare page is NaN. Hypothesis then draws free configurations.

The tests take ``backend`` as a parameter; other backends' test files reuse
them with ``from test_attention_sweep import ...`` or extend ``BACKENDS``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from attention_cases import (
    HEAD_DIMS,
    HEADS,
    KV_DTYPES,
    PAGE_SIZES,
    TOL,
    available_backends,
    make_paged_case,
    prefill_query_counts,
    rel_error,
    sweep_seq_lens,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paged_np as pnp

BACKENDS = available_backends()


def _sweep_configs():
    combos = itertools.product(PAGE_SIZES, HEADS, KV_DTYPES, ("decode", "prefill"),
                               (False, True))
    for i, (ps, heads, dtype, mode, window) in enumerate(combos):
        yield pytest.param(HEAD_DIMS[i % len(HEAD_DIMS)], ps, heads, dtype, mode, window,
                           id=f"D{HEAD_DIMS[i % len(HEAD_DIMS)]}-ps{ps}-h{heads[0]}x{heads[1]}"
                              f"-{np.dtype(dtype).name}-{mode}-w{int(window)}")


SWEEP = list(_sweep_configs())


def window_for(page_size: int, head_dim: int) -> int:
    """A window that skips whole pages at seq_len 137/300; varies with the case."""
    return (1, page_size + 3, 2 * page_size + 5, 64, 100)[HEAD_DIMS.index(head_dim)]


def check_against_reference(case, backend, sliding_window=None, scale=None):
    """Run paged_attention on ``case``; assert out and lse match; return the errors."""
    out, lse = pnp.paged_attention(*case.args(), scale=scale, sliding_window=sliding_window,
                                   backend=backend, return_lse=True)
    ref_out, ref_lse = case.reference(scale=scale, sliding_window=sliding_window)
    assert out.dtype == np.float32 and out.shape == case.q.shape
    assert lse.dtype == np.float32 and lse.shape == case.q.shape[:2]
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    err_out, err_lse = rel_error(out, ref_out), rel_error(lse, ref_lse)
    assert err_out <= TOL, f"out error {err_out:.2e}"
    assert err_lse <= TOL, f"lse error {err_lse:.2e}"
    return err_out, err_lse


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("head_dim", "page_size", "heads", "kv_dtype", "mode", "window"), SWEEP)
def test_sweep_matches_reference(backend, head_dim, page_size, heads, kv_dtype, mode, window):
    lens = sweep_seq_lens(page_size)
    if mode == "decode":
        lens = [n for n in lens if n > 0]            # a decode query needs seq_len >= 1
        n_queries = None
    else:
        n_queries = prefill_query_counts(lens)
    case = make_paged_case(lens, n_queries, num_heads=heads[0], num_kv_heads=heads[1],
                           head_dim=head_dim, page_size=page_size, kv_dtype=kv_dtype,
                           seed=page_size * 1000 + head_dim)
    check_against_reference(case, backend,
                            sliding_window=window_for(page_size, head_dim) if window else None)


@pytest.mark.parametrize(("head_dim", "page_size", "heads", "kv_dtype", "mode", "window"), SWEEP)
def test_sweep_threaded_with_metadata(head_dim, page_size, heads, kv_dtype, mode, window,
                                      monkeypatch):
    """The numba backend on several threads, metadata built once, plan reused: same answers.

    These cases are small, so the backend would run them on the calling thread
    (``choose_num_threads``); a threshold of one byte wakes every thread.
    """
    from paged_np.attention import AttentionMetadata, numba_plan

    monkeypatch.setattr(numba_plan, "MIN_BYTES_PER_THREAD", 1)
    lens = sweep_seq_lens(page_size)
    n_queries = prefill_query_counts(lens) if mode == "prefill" else None
    if mode == "decode":
        lens = [n for n in lens if n > 0]
    case = make_paged_case(lens, n_queries, num_heads=heads[0], num_kv_heads=heads[1],
                           head_dim=head_dim, page_size=page_size, kv_dtype=kv_dtype,
                           seed=page_size * 1000 + head_dim + 1)
    w = window_for(page_size, head_dim) if window else None
    meta = AttentionMetadata.build(case.block_tables, case.seq_lens, case.query_start_loc, w,
                                   num_pages=case.k_pages.shape[0],
                                   page_size=case.k_pages.shape[2])
    ref_out, ref_lse = case.reference(sliding_window=w)
    for _ in range(2):  # the second layer finds the plan the first one made
        out, lse = pnp.paged_attention(case.q, case.k_pages, case.v_pages, metadata=meta,
                                       backend="numba", return_lse=True)
        assert rel_error(out, ref_out) <= TOL and rel_error(lse, ref_lse) <= TOL
    (plan,) = meta.plans.values()
    assert plan.items is None or plan.num_threads == numba_plan.numba.get_num_threads()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_head_dim_prefill_gqa_float16(backend, head_dim):
    """Each head_dim on the hardest mix: float16, MQA-like GQA, chunked prefill, window."""
    lens = [300, 137, 17, 1]
    case = make_paged_case(lens, prefill_query_counts(lens), num_heads=8, num_kv_heads=1,
                           head_dim=head_dim, page_size=16, kv_dtype=np.float16, seed=head_dim)
    check_against_reference(case, backend, sliding_window=45)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [1, 2, 15, 16, 17, 299, 300, 10**6])
def test_window_edges(backend, window):
    """Window 1 (only itself), page-size multiples, and windows as long as the context."""
    lens = [300, 33, 16]
    case = make_paged_case(lens, [5, 33, 1], num_heads=4, num_kv_heads=2, head_dim=32,
                           page_size=16, seed=window % 1000)
    check_against_reference(case, backend, sliding_window=window)


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_one_returns_own_value(backend):
    case = make_paged_case([9, 20], [9, 3], num_heads=4, num_kv_heads=2, page_size=8, seed=3)
    out = pnp.paged_attention(*case.args(), sliding_window=1, backend=backend)
    own = np.concatenate([case.v_dense[0][-9:], case.v_dense[1][-3:]])     # [T, KV, D]
    np.testing.assert_allclose(out, np.repeat(own, 2, axis=1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_sequences_and_garbage_padding(backend):
    """seq_len 0 with no queries, zero-query sequences, huge ids in block-table padding."""
    lens = [0, 40, 12, 0, 5]
    case = make_paged_case(lens, [0, 3, 0, 0, 5], page_size=8, pad_value=2**31 - 1, seed=5)
    check_against_reference(case, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_pages_between_sequences(backend):
    """Two sequences may read the same page ids (prefix sharing, forks)."""
    case = make_paged_case([24, 24], [1, 1], page_size=8, shuffle=False, seed=6)
    case.block_tables[1, :3] = case.block_tables[0, :3]
    case.k_dense[1], case.v_dense[1] = case.k_dense[0], case.v_dense[0]
    check_against_reference(case, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_scale_and_no_lse(backend):
    case = make_paged_case([50, 7], page_size=16, seed=7)
    check_against_reference(case, backend, scale=0.37)
    out = pnp.paged_attention(*case.args(), backend=backend)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, pnp.paged_attention(*case.args(), backend=backend,
                                                           return_lse=True)[0])


def test_auto_backend_matches_reference():
    case = make_paged_case([33, 2], [4, 2], num_heads=8, num_kv_heads=2, seed=8)
    check_against_reference(case, "auto")


def test_empty_batch():
    q = np.zeros((0, 4, 32), np.float32)
    pages = np.zeros((2, 2, 8, 32), np.float32)
    out, lse = pnp.paged_attention(q, pages, pages, np.zeros((0, 3), np.int32),
                                   np.zeros(0, np.int32), backend="numpy", return_lse=True)
    assert out.shape == (0, 4, 32) and lse.shape == (0, 4)


@st.composite
def paged_configs(draw):
    """A random configuration from the sweep's axes, with free sequence lengths."""
    page_size = draw(st.sampled_from(PAGE_SIZES))
    num_heads, num_kv_heads = draw(st.sampled_from(HEADS))
    special = st.sampled_from([1, max(1, page_size - 1), page_size, page_size + 1, 137, 300])
    lens = draw(st.lists(st.one_of(special, st.integers(0, 300)), min_size=1, max_size=4))
    if draw(st.booleans()) and all(n > 0 for n in lens):
        n_queries = None                                     # decode
    else:
        n_queries = [draw(st.integers(0, n)) for n in lens]  # chunked prefill
    return dict(
        seq_lens=lens, n_queries=n_queries, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=draw(st.sampled_from(HEAD_DIMS)), page_size=page_size,
        kv_dtype=draw(st.sampled_from(KV_DTYPES)), seed=draw(st.integers(0, 2**16)),
        window=draw(st.one_of(st.none(), st.integers(1, 320))),
    )


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=paged_configs())
def test_hypothesis_matches_reference(backend, cfg):
    window = cfg.pop("window")
    case = make_paged_case(**cfg)
    check_against_reference(case, backend, sliding_window=window)
