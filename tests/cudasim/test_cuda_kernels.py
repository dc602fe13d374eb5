"""The cuda backend against a float64 dense reference (see conftest.py to run)."""

import zlib

import numpy as np
import pytest
from dense_ref import dense_attention, random_batch

import paged_np as pnp
from paged_np.attention import numba_cuda as nc
from paged_np.errors import InvalidBlockTable, ShapeError

pytestmark = pytest.mark.cudasim

TOL = dict(atol=2e-5, rtol=2e-5)

# seq_lens, queries per sequence, H, Hkv, D, page_size, window, page dtype
CASES = {
    "decode-gqa-page4": ([5, 20, 1], [1, 1, 1], 4, 2, 8, 4, 0, np.float32),
    "decode-mqa-fp16-page16": ([17, 40], [1, 1], 4, 1, 16, 16, 0, np.float16),
    "decode-window-page1": ([9, 21], [1, 1], 2, 2, 8, 1, 5, np.float32),
    "prefill-gqa-page1": ([6, 11], [6, 4], 4, 2, 8, 1, 0, np.float32),
    "prefill-mqa-window-fp16": ([14, 25], [14, 9], 4, 1, 8, 16, 4, np.float16),
    "chunked-empty-seqs": ([0, 7, 19], [0, 0, 5], 2, 1, 32, 4, 0, np.float32),
    "prefill-mha-d24-page16": ([35], [18], 2, 2, 24, 16, 0, np.float32),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense_reference(name):
    lens, nqs, H, Hkv, D, ps, window, dtype = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q, kp, vp, bt, sl, qsl = random_batch(rng, lens, nqs, H, Hkv, D, ps, dtype)
    scale = 1 / np.sqrt(D)
    out, lse = nc.forward(q, kp, vp, bt, sl, qsl, scale, window, True)
    ref_out, ref_lse = dense_attention(q, kp, vp, bt, sl, qsl, scale, window)
    assert out.dtype == np.float32 and out.shape == q.shape and lse.shape == q.shape[:2]
    assert np.all(np.isfinite(out)), "NaN from an unused slot leaked into the output"
    np.testing.assert_allclose(out, ref_out, **TOL)
    np.testing.assert_allclose(lse, ref_lse, **TOL)


@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_k_merge_equals_one_pass(num_splits):
    """Cutting the keys into ranges and merging by log-sum-exp changes nothing.

    5 splits of a 40-key decode leave some splits empty (lse -inf): they must weigh 0.
    """
    rng = np.random.default_rng(num_splits)
    q, kp, vp, bt, sl, qsl = random_batch(rng, [40, 3], [1, 2], 2, 1, 8, 4)
    one, lse1 = nc.forward(q, kp, vp, bt, sl, qsl, 0.3, 0, True, num_splits=1)
    many, lsen = nc.forward(q, kp, vp, bt, sl, qsl, 0.3, 0, True, num_splits=num_splits)
    ref_out, ref_lse = dense_attention(q, kp, vp, bt, sl, qsl, 0.3)
    np.testing.assert_allclose(many, ref_out, **TOL)
    np.testing.assert_allclose(lsen, ref_lse, **TOL)
    np.testing.assert_allclose(many, one, **TOL)


def test_device_arrays_in_device_arrays_out():
    from numba import cuda

    rng = np.random.default_rng(1)
    q, kp, vp, bt, sl, qsl = random_batch(rng, [12, 5], [1, 1], 2, 1, 8, 4)
    host_out, _ = nc.forward(q, kp, vp, bt, sl, qsl, 0.5, 0, False)
    d_out, d_lse = nc.forward(cuda.to_device(q), cuda.to_device(kp), cuda.to_device(vp),
                              cuda.to_device(bt), cuda.to_device(sl), cuda.to_device(qsl),
                              0.5, 0, True)
    assert nc.is_device_array(d_out) and nc.is_device_array(d_lse)
    np.testing.assert_array_equal(d_out.copy_to_host(), host_out)
    out, lse = nc.forward(q, kp, vp, bt, sl, qsl, 0.5, 0, False)
    assert isinstance(out, np.ndarray) and lse is None


def test_refuses_bad_page_ids_at_the_public_boundary_and_large_head_dim():
    rng = np.random.default_rng(2)
    q, kp, vp, bt, sl, qsl = random_batch(rng, [6], [1], 2, 1, 8, 4)
    bad = bt.copy()
    bad[0, 1] = kp.shape[0]                     # page 1 is used: seq_len 6 > page_size 4
    with pytest.raises(InvalidBlockTable, match=r"block_tables\[0, 1\]"):
        pnp.paged_attention(q, kp, vp, bad, sl, qsl, backend="cuda")
    big = np.zeros((1, 1, 1, nc.MAX_HEAD_DIM + 2), np.float32)
    with pytest.raises(ShapeError, match="head_dim"):
        nc.forward(np.zeros((1, 1, nc.MAX_HEAD_DIM + 2), np.float32), big, big,
                   np.zeros((1, 1), np.int32), np.ones(1, np.int32),
                   np.array([0, 1], np.int32), 1.0, 0, False)


# seq_lens, queries per sequence, page_size, window: pages wholly before every
# query's window become -1 holes (what PagedKVCache.release_pages_before writes).
HOLE_CASES = {
    "decode-5-pages-window-3": ([5], [1], 1, 3),
    "decode-two-seqs-page4": ([23, 9], [1, 1], 4, 6),
    "chunk-of-3-page4": ([23], [3], 4, 6),
    "prefill-chunk-page2-split": ([40, 12], [5, 2], 2, 7),
}


@pytest.mark.parametrize("name", list(HOLE_CASES))
def test_sliding_window_with_holes_before_the_window(name):
    """-1 entries outside the window: forward and paged_attention both accept them."""
    lens, nqs, ps, window = HOLE_CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q, kp, vp, bt, sl, qsl = random_batch(rng, lens, nqs, 4, 2, 8, ps)
    ref_out, ref_lse = dense_attention(q, kp, vp, bt, sl, qsl, 0.4, window)
    holes = 0
    for b, (L, n_q) in enumerate(zip(lens, nqs)):
        dead = max(L - n_q - window + 1, 0) // ps       # pages before every query's window
        kp[bt[b, :dead]] = np.nan                        # never read...
        vp[bt[b, :dead]] = np.nan
        bt[b, :dead] = -1                                # ...and given back
        holes += dead
    assert holes > 0
    for num_splits in (1, 3):
        out, lse = nc.forward(q, kp, vp, bt, sl, qsl, 0.4, window, True, num_splits=num_splits)
        np.testing.assert_allclose(out, ref_out, **TOL)
        np.testing.assert_allclose(lse, ref_lse, **TOL)
    out, lse = pnp.paged_attention(q, kp, vp, bt, sl, qsl, scale=0.4, sliding_window=window,
                                   backend="cuda", return_lse=True)
    np.testing.assert_allclose(out, ref_out, **TOL)
    # A hole inside some query's window is still refused, at the public boundary.
    b = int(np.argmax(bt[:, 0] == -1))
    first_live = int(np.argmax(bt[b] >= 0))
    bt[b, first_live] = -1
    with pytest.raises(InvalidBlockTable):
        pnp.paged_attention(q, kp, vp, bt, sl, qsl, scale=0.4, sliding_window=window,
                            backend="cuda")
