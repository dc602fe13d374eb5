"""Sliding window: pages outside the window go back to the pool, tokens stay exact."""

from __future__ import annotations

import numpy as np
import pytest

import paged_np as pnp
from paged_np.attention.reference import dense_attention


@pytest.mark.parametrize("backend", ["numpy"])
def test_paged_attention_accepts_holes_outside_the_window(backend):
    """-1 entries for pages wholly before every query's window are allowed and unread."""
    rng = np.random.default_rng(0)
    ps, L, n_q, w, hkv, h, d = 4, 23, 3, 6, 2, 4, 8
    k = rng.standard_normal((L, hkv, d)).astype(np.float32)
    v = rng.standard_normal((L, hkv, d)).astype(np.float32)
    q = rng.standard_normal((n_q, h, d)).astype(np.float32)
    n_pages = -(-L // ps)
    k_pages = np.full((n_pages, hkv, ps, d), np.nan, np.float32)
    v_pages = np.full((n_pages, hkv, ps, d), np.nan, np.float32)
    for j in range(L):
        k_pages[j // ps, :, j % ps] = k[j]
        v_pages[j // ps, :, j % ps] = v[j]
    table = np.arange(n_pages, dtype=np.int32)
    # First query at 20 sees keys > 14: pages 0..2 (positions 0..11) are dead.
    dead = (L - n_q - w + 1) // ps
    assert dead == 3
    k_pages[:dead] = np.nan                                     # never read
    table[:dead] = -1
    out = pnp.paged_attention(q, k_pages, v_pages, table[None], np.array([L], np.int32),
                              np.array([0, n_q], np.int32), sliding_window=w, backend=backend)
    ref, _ = dense_attention(q, k, v, sliding_window=w)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    table[dead] = -1                                            # a page the window needs
    with pytest.raises(pnp.InvalidBlockTable):
        pnp.paged_attention(q, k_pages, v_pages, table[None], np.array([L], np.int32),
                            np.array([0, n_q], np.int32), sliding_window=w, backend=backend)
