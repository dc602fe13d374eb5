"""The dense reference against the definition, written as plain Python loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paged_np.attention.reference import causal_window_mask, dense_attention


def loop_attention(q, k, v, scale, window):
    """Attention straight from the definition, one (query, head) at a time."""
    n_q, H, D = q.shape
    L, KV, _ = k.shape
    out, lse = np.zeros((n_q, H, D)), np.zeros((n_q, H))
    for i in range(n_q):
        p = L - n_q + i                                         # the query's position
        keys = [j for j in range(L) if j <= p and (window == 0 or j > p - window)]
        for h in range(H):
            kv = h // (H // KV)
            s = [scale * float(np.dot(q[i, h], k[j, kv])) for j in keys]
            z = sum(math.exp(x) for x in s)
            out[i, h] = sum(math.exp(x) / z * v[j, kv] for x, j in zip(s, keys, strict=True))
            lse[i, h] = math.log(z)
    return out, lse


@pytest.mark.parametrize(("n_q", "L", "H", "KV", "window"), [
    (1, 1, 2, 2, 0), (1, 9, 4, 1, 0), (4, 9, 4, 2, 0), (9, 9, 6, 3, 3), (3, 12, 2, 1, 1),
    (5, 5, 4, 4, 100),
])
def test_reference_matches_loops(n_q, L, H, KV, window):
    rng = np.random.default_rng(n_q * 100 + L)
    q = rng.standard_normal((n_q, H, 8))
    k, v = rng.standard_normal((L, KV, 8)), rng.standard_normal((L, KV, 8))
    out, lse = dense_attention(q, k, v, scale=0.3, sliding_window=window)
    ref_out, ref_lse = loop_attention(q, k, v, 0.3, window)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_mask_small_example():
    # 2 queries at positions 3 and 4 of a 5-token sequence, window 2.
    expected = np.array([[0, 0, 1, 1, 0],
                         [0, 0, 0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(causal_window_mask(2, 5, 2), expected)
    assert causal_window_mask(5, 5).sum() == 15                 # lower triangle


def test_default_scale_and_dtype():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 2, 16)), rng.standard_normal((3, 1, 16)), np.ones((3, 1, 16))
    out, lse = dense_attention(q, k, v)
    out2, lse2 = dense_attention(q, k, v, scale=0.25)
    np.testing.assert_array_equal(lse, lse2)
    np.testing.assert_allclose(out, 1.0)                        # weights sum to one
    assert out.dtype == np.float64
    assert dense_attention(q, k, v, dtype=np.float32)[0].dtype == np.float32
