"""Kernel fuzzing beyond the sweep: odd shapes, mixed batches, shared pages, garbage.

``test_attention_sweep.py`` fuzzes the sweep's axes (page sizes 1/8/16/32, four
head layouts, five head dims). Here hypothesis draws what the sweep does not:

- page sizes that are not powers of two (3, 5, 7, 13) and 64;
- any GQA ratio (1..8 query heads per kv head, 1..4 kv heads), odd head dims;
- one batch mixing every kind of sequence: decode (1 query), a chunked-prefill
  chunk, a whole prompt, a sequence with no query this step, an empty one;
- block tables in a random page order, with garbage past each sequence
  (-1 or ids near int32 max), spare NaN pages, pages shared by two sequences;
- a random scale, sliding windows, float16 pages;
- for numba, forced split-K factors and query-tile sizes.

Every result is checked against the float64 dense reference. A second property
corrupts a valid batch (one rule broken) and expects the named error, for
every backend: bad input never reaches a kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from attention_cases import TOL, available_backends, make_paged_case, rel_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paged_np as pnp
from paged_np.attention import validate_paged_attention_inputs

BACKENDS = available_backends()
FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def mixed_batches(draw):
    """A random batch (kwargs for make_paged_case) plus window, scale and sharing."""
    ps = draw(st.sampled_from([1, 2, 3, 5, 7, 8, 13, 16, 64]))
    kv_heads = draw(st.integers(1, 4))
    group = draw(st.sampled_from([1, 2, 3, 4, 8]))
    lens, n_queries = [], []
    kinds = draw(st.lists(st.sampled_from(["decode", "chunk", "prompt", "idle", "empty"]),
                          min_size=1, max_size=6))
    for kind in kinds:
        if kind == "empty":
            lens.append(0)
            n_queries.append(0)
            continue
        edge = st.sampled_from([1, max(1, ps - 1), ps, ps + 1, 2 * ps + 1])
        n = draw(st.one_of(edge, st.integers(1, 160)))
        lens.append(n)
        n_queries.append({"decode": 1, "prompt": n, "idle": 0,
                          "chunk": draw(st.integers(1, n))}[kind])
    return dict(
        case=dict(seq_lens=lens, n_queries=n_queries, num_heads=kv_heads * group,
                  num_kv_heads=kv_heads, head_dim=draw(st.sampled_from([1, 2, 3, 8, 17, 32])),
                  page_size=ps, kv_dtype=draw(st.sampled_from([np.float32, np.float16])),
                  seed=draw(st.integers(0, 2**16)), spare_pages=draw(st.integers(0, 3)),
                  pad_columns=draw(st.integers(0, 3)),
                  pad_value=draw(st.sampled_from([-1, 0, 2**31 - 1]))),
        window=draw(st.one_of(st.none(), st.integers(1, 200))),
        scale=draw(st.one_of(st.none(), st.floats(0.01, 2.0))),
        share=draw(st.integers(0, 3)),
    )


def build(cfg):
    """The case, with the first ``share`` pages of sequence 0 shared by sequence 1."""
    case = make_paged_case(**cfg["case"])
    ps = case.k_pages.shape[2]
    lens = case.seq_lens
    k = min(cfg["share"], int(lens[0]) // ps, int(lens[1]) // ps) if len(lens) > 1 else 0
    if k:   # full pages only: sequence 1 now reads sequence 0's first k pages
        case.block_tables[1, :k] = case.block_tables[0, :k]
        case.k_dense[1][:k * ps] = case.k_dense[0][:k * ps]
        case.v_dense[1][:k * ps] = case.v_dense[0][:k * ps]
    return case


def check(case, out, lse, window, scale):
    ref_out, ref_lse = case.reference(scale=scale, sliding_window=window)
    assert np.isfinite(out).all() and np.isfinite(lse).all()     # no NaN garbage read
    assert rel_error(out, ref_out) <= TOL
    assert rel_error(lse, ref_lse) <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
@FUZZ
@given(cfg=mixed_batches())
def test_fuzz_mixed_batches_match_reference(backend, cfg):
    case = build(cfg)
    out, lse = pnp.paged_attention(*case.args(), scale=cfg["scale"],
                                   sliding_window=cfg["window"], backend=backend,
                                   return_lse=True)
    check(case, out, lse, cfg["window"], cfg["scale"])


@settings(FUZZ, max_examples=60)
@given(cfg=mixed_batches(), num_splits=st.sampled_from([1, 2, 3, 5]),
       q_tile=st.sampled_from([1, 2, 7, 64]))
def test_fuzz_numba_split_k_and_tiles(cfg, num_splits, q_tile):
    from paged_np.attention import numba_cpu
    case = build(cfg)
    args = validate_paged_attention_inputs(*case.args(), scale=cfg["scale"],
                                           sliding_window=cfg["window"])
    out, lse = numba_cpu.forward(*args, True, num_splits=num_splits, q_tile=q_tile)
    check(case, out, lse, cfg["window"], cfg["scale"])


# One broken rule each: (name, how to break the arguments, the error it must raise).
def _live_sequence(case):
    """A sequence with at least one query (its last page is read whatever the window)."""
    n_q = np.diff(case.qsl)
    live = np.flatnonzero(n_q > 0)
    return int(live[0]) if live.size else None


def _bad_page(case, args, rng, negative):
    b = _live_sequence(case)
    last = (int(case.seq_lens[b]) - 1) // case.k_pages.shape[2]
    bt = np.array(args["block_tables"], np.int64)
    num_pages = case.k_pages.shape[0]
    bt[b, last] = -1 - int(rng.integers(0, 2**31)) if negative else \
        num_pages + int(rng.integers(0, 2**40))
    args["block_tables"] = bt


def _too_long(case, args, rng):
    b = _live_sequence(case)
    lens = np.array(args["seq_lens"], np.int64)
    lens[b] = args["block_tables"].shape[1] * case.k_pages.shape[2] + 1 + int(rng.integers(9))
    args["seq_lens"] = lens


def _more_queries_than_tokens(case, args, rng):
    b = _live_sequence(case)
    lens = np.array(args["seq_lens"], np.int64)
    lens[b] = int(np.diff(case.qsl)[b]) - 1
    args["seq_lens"] = lens


def _decreasing_qsl(case, args, rng):
    qsl = np.array(case.qsl, np.int64)
    b = _live_sequence(case)
    qsl[b + 1] = qsl[b] - 1
    args["query_start_loc"] = qsl


CORRUPTIONS = {
    "page id past the arena": (lambda c, a, r: _bad_page(c, a, r, False), pnp.InvalidBlockTable),
    "negative page id": (lambda c, a, r: _bad_page(c, a, r, True), pnp.InvalidBlockTable),
    "seq_len past the block table": (_too_long, pnp.InvalidBlockTable),
    "more queries than tokens": (_more_queries_than_tokens, pnp.InvalidArgument),
    "query_start_loc decreasing": (_decreasing_qsl, pnp.InvalidArgument),
}


@pytest.mark.parametrize("backend", BACKENDS)
@settings(FUZZ, max_examples=50)
@given(cfg=mixed_batches(), which=st.sampled_from(sorted(CORRUPTIONS)),
       seed=st.integers(0, 2**16))
def test_fuzz_one_broken_rule_is_refused(backend, cfg, which, seed):
    case = build(cfg)
    if _live_sequence(case) is None:
        return                                                  # nothing reads any page
    args = dict(q=case.q, k_pages=case.k_pages, v_pages=case.v_pages,
                block_tables=case.block_tables, seq_lens=case.seq_lens,
                query_start_loc=case.qsl, sliding_window=cfg["window"])
    breaker, error = CORRUPTIONS[which]
    breaker(case, args, np.random.default_rng(seed))
    with pytest.raises(error):
        pnp.paged_attention(**args, backend=backend)
