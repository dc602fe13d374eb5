"""merge_attention_states is exact, commutative, associative and -inf safe;
split-K attention equals unsplit attention."""

from __future__ import annotations

import numpy as np
import pytest
from attention_cases import TOL, make_paged_case, prefill_query_counts, rel_error
from hypothesis import given, settings
from hypothesis import strategies as st

import paged_np as pnp
from paged_np.attention import split_k, validate_paged_attention_inputs
from paged_np.errors import DTypeError, InvalidArgument, ShapeError


def attend_subset(q, k, v, keys):
    """Float64 softmax attention of q [T,H,D] over k/v [N,H,D] rows ``keys`` only.

    Returns (out [T,H,D], lse [T,H]); an empty subset gives out 0 and lse -inf.
    """
    T, H, D = q.shape
    if len(keys) == 0:
        return np.zeros((T, H, D)), np.full((T, H), -np.inf)
    s = np.einsum("thd,nhd->thn", q, k[keys])                   # [T, H, n]
    m = s.max(-1, keepdims=True)                                # [T, H, 1]
    p = np.exp(s - m)                                           # [T, H, n]
    z = p.sum(-1, keepdims=True)                                # [T, H, 1]
    return np.einsum("thn,nhd->thd", p / z, v[keys]), (m + np.log(z))[..., 0]


def random_qkv(seed, T=5, H=3, D=8, N=40):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, H, D)), 2 * rng.standard_normal((N, H, D)),
            rng.standard_normal((N, H, D)))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n_parts=st.integers(1, 5))
def test_merge_of_parts_equals_attention_over_union(seed, n_parts):
    """Random disjoint key subsets (some may be empty), merged in order == all keys."""
    q, k, v = random_qkv(seed)
    owner = np.random.default_rng(seed + 1).integers(0, n_parts, len(k))   # [N] part of key
    out, lse = attend_subset(q, k, v, np.flatnonzero(owner == 0))
    for part in range(1, n_parts):
        part_out, part_lse = attend_subset(q, k, v, np.flatnonzero(owner == part))
        out, lse = pnp.merge_attention_states(out, lse, part_out, part_lse)
    full_out, full_lse = attend_subset(q, k, v, np.arange(len(k)))
    np.testing.assert_allclose(out, full_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, full_lse, rtol=1e-14, atol=0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_merge_commutes_and_associates(seed):
    q, k, v = random_qkv(seed)
    parts = [attend_subset(q, k, v, idx) for idx in np.array_split(np.arange(len(k)), 3)]
    a, b, c = [(o.astype(np.float32), lse.astype(np.float32)) for o, lse in parts]
    ab = pnp.merge_attention_states(*a, *b)
    ba = pnp.merge_attention_states(*b, *a)
    np.testing.assert_array_equal(ab[0], ba[0])                 # commutative: bit-exact
    np.testing.assert_array_equal(ab[1], ba[1])
    left = pnp.merge_attention_states(*ab, *c)                  # (a + b) + c
    right = pnp.merge_attention_states(*a, *pnp.merge_attention_states(*b, *c))  # a + (b + c)
    assert rel_error(left[0], right[0]) <= 1e-6
    assert rel_error(left[1], right[1]) <= 1e-6


def test_empty_part_is_ignored_even_if_nan():
    q, k, v = random_qkv(1)
    out_a, lse_a = attend_subset(q, k, v, np.arange(10))
    out_b = np.full_like(out_a, np.nan)                         # garbage from an empty part
    lse_b = np.full_like(lse_a, -np.inf)
    for args in ((out_a, lse_a, out_b, lse_b), (out_b, lse_b, out_a, lse_a)):
        out, lse = pnp.merge_attention_states(*args)
        np.testing.assert_array_equal(out, out_a)
        np.testing.assert_array_equal(lse, lse_a)


def test_both_empty_gives_zero_and_minus_inf():
    shape = (4, 2, 8)
    empty = np.full(shape, np.nan, np.float32), np.full(shape[:2], -np.inf, np.float32)
    with np.errstate(all="raise"):                             # no warning either
        out, lse = pnp.merge_attention_states(*empty, *empty)
    assert not np.isnan(out).any() and (out == 0).all()
    assert np.isneginf(lse).all() and lse.dtype == np.float32


def test_mixed_rows_empty_and_not():
    q, k, v = random_qkv(2, T=2)
    out_a, lse_a = attend_subset(q, k, v, np.arange(5))
    out_b, lse_b = attend_subset(q, k, v, np.arange(5, 9))
    lse_a[0] = -np.inf                                          # row 0: part a empty
    lse_b[1, 2] = -np.inf                                       # row 1 head 2: part b empty
    out, lse = pnp.merge_attention_states(out_a, lse_a, out_b, lse_b)
    np.testing.assert_array_equal(out[0], out_b[0])
    np.testing.assert_array_equal(out[1, 2], out_a[1, 2])
    assert np.isfinite(out).all()


def test_huge_lse_does_not_overflow():
    out_a, out_b = np.ones((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32)
    lse_a, lse_b = np.array([[1000.0]], np.float32), np.array([[1000.0]], np.float32)
    out, lse = pnp.merge_attention_states(out_a, lse_a, out_b, lse_b)
    np.testing.assert_allclose(out, 0.5)
    np.testing.assert_allclose(lse, 1000 + np.log(2))


def test_dtype_follows_inputs():
    o, lse = np.zeros((2, 2, 4)), np.zeros((2, 2))
    assert pnp.merge_attention_states(o, lse, o, lse)[0].dtype == np.float64
    o16, l16 = o.astype(np.float16), lse.astype(np.float16)
    assert pnp.merge_attention_states(o16, l16, o16, l16)[0].dtype == np.float32


# --- validation of merge_attention_states -----------------------------------
GOOD = (np.zeros((3, 2, 4), np.float32), np.zeros((3, 2), np.float32))


@pytest.mark.parametrize(("which", "bad", "error", "match"), [
    ("out_a", np.zeros((3, 2), np.float32), ShapeError, "out_a must be 3-D"),
    ("out_b", np.zeros((3, 2, 5), np.float32), ShapeError, "out_b shape"),
    ("lse_a", np.zeros((3, 3), np.float32), ShapeError, "lse_a must have shape"),
    ("lse_b", np.zeros((3, 2, 1), np.float32), ShapeError, "lse_b must be 2-D"),
    ("out_b", np.zeros((3, 2, 4), np.int32), DTypeError, "out_b must have a float dtype"),
    ("lse_a", [[0.0, 0.0]] * 3, DTypeError, "lse_a must be a numpy array"),
    ("lse_b", np.full((3, 2), np.nan, np.float32), InvalidArgument, "lse_b holds NaN"),
    ("lse_a", np.full((3, 2), np.inf, np.float32), InvalidArgument, r"lse_a holds NaN or \+inf"),
])
def test_merge_refuses(which, bad, error, match):
    args = dict(out_a=GOOD[0], lse_a=GOOD[1], out_b=GOOD[0], lse_b=GOOD[1])
    args[which] = bad
    with pytest.raises(error, match=match):
        pnp.merge_attention_states(**args)


# --- split-K -------------------------------------------------------------------
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("window", [None, 5, 40])
def test_split_k_equals_unsplit(num_splits, window):
    lens = [300, 137, 17, 9, 1]
    case = make_paged_case(lens, prefill_query_counts(lens), num_heads=8, num_kv_heads=2,
                           head_dim=32, page_size=8, kv_dtype=np.float16, seed=num_splits)
    args = validate_paged_attention_inputs(*case.args(), sliding_window=window)
    out, lse = split_k.forward(*args, True, num_splits=num_splits)
    whole_out, whole_lse = pnp.paged_attention(*case.args(), sliding_window=window,
                                               backend="numpy", return_lse=True)
    assert rel_error(out, whole_out) <= 1e-6 and rel_error(lse, whole_lse) <= 1e-6
    ref_out, ref_lse = case.reference(sliding_window=window)
    assert rel_error(out, ref_out) <= TOL and rel_error(lse, ref_lse) <= TOL


@pytest.mark.parametrize(("num_splits", "error"), [(0, InvalidArgument), (2.0, DTypeError),
                                                   (True, DTypeError)])
def test_split_k_refuses_bad_num_splits(num_splits, error):
    case = make_paged_case([5], page_size=4)
    with pytest.raises(error, match="num_splits"):
        split_k.forward(*validate_paged_attention_inputs(*case.args()), False,
                        num_splits=num_splits)


def test_one_page_at_a_time_merges_to_the_whole():
    """The lesson of numpy_paged: each page alone is a partial (out, lse); merged, the whole."""
    from paged_np.attention.numpy_paged import attend_sequence
    case = make_paged_case([29], [6], num_heads=4, num_kv_heads=1, page_size=8, seed=11)
    args = (case.q, case.k_pages, case.v_pages, case.block_tables[0], 29, 0.2, 0)
    out, lse = attend_sequence(*args, first_page=0, end_page=1)
    for i in range(1, 4):
        out, lse = pnp.merge_attention_states(out, lse, *attend_sequence(
            *args, first_page=i, end_page=i + 1))
    whole_out, whole_lse = attend_sequence(*args)
    assert rel_error(out, whole_out) <= 1e-6 and rel_error(lse, whole_lse) <= 1e-6
