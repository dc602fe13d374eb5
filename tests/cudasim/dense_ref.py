"""A float64 dense reference and random paged batches for the cuda tests.

Obviously correct, slow: gather each sequence's keys through its block table,
then plain softmax attention in float64 with the causal / sliding-window mask.
"""

from __future__ import annotations

import numpy as np


def dense_attention(q, k_pages, v_pages, block_tables, seq_lens, qsl, scale, window=0):
    """out float64 [T, H, D], lse float64 [T, H] (-inf for rows that see no key)."""
    T, H, D = q.shape
    Hkv, page_size = k_pages.shape[1], k_pages.shape[2]
    group = H // Hkv
    out = np.zeros((T, H, D))
    lse = np.full((T, H), -np.inf)
    for b, L in enumerate(seq_lens):
        n_q = qsl[b + 1] - qsl[b]
        pos = np.arange(L)                                            # [L]
        pages = block_tables[b, pos // page_size]                     # [L]
        k = k_pages[pages, :, pos % page_size].astype(np.float64)     # [L, Hkv, D]
        v = v_pages[pages, :, pos % page_size].astype(np.float64)
        for i in range(n_q):
            p = L - n_q + i
            seen = pos <= p
            if window:
                seen &= pos > p - window
            for h in range(H):
                s = k[seen, h // group] @ q[qsl[b] + i, h].astype(np.float64) * scale  # [n]
                m = s.max()
                e = np.exp(s - m)
                out[qsl[b] + i, h] = e @ v[seen, h // group] / e.sum()
                lse[qsl[b] + i, h] = m + np.log(e.sum())
    return out, lse


def random_batch(rng, seq_lens, n_qs, num_heads, num_kv_heads, head_dim, page_size,
                 dtype=np.float32, spare_pages=3):
    """Pages in a shuffled order, NaN in every unused slot, -1 past each table's end."""
    seq_lens = np.asarray(seq_lens, dtype=np.int32)
    n_pages_per = -(-seq_lens // page_size)
    num_pages = int(n_pages_per.sum()) + spare_pages
    perm = rng.permutation(num_pages).astype(np.int32)
    max_pages = int(n_pages_per.max(initial=0)) + 1
    block_tables = np.full((len(seq_lens), max_pages), -1, dtype=np.int32)
    shape = (num_pages, num_kv_heads, page_size, head_dim)
    k_pages = np.full(shape, np.nan, dtype=dtype)
    v_pages = np.full(shape, np.nan, dtype=dtype)
    used = 0
    for b, L in enumerate(seq_lens):
        ids = perm[used:used + n_pages_per[b]]
        used += n_pages_per[b]
        block_tables[b, :len(ids)] = ids
        pos = np.arange(L)
        for pages in (k_pages, v_pages):
            vals = rng.standard_normal((L, num_kv_heads, head_dim)).astype(dtype)
            pages[ids[pos // page_size], :, pos % page_size] = vals
    qsl = np.concatenate([[0], np.cumsum(n_qs)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), num_heads, head_dim)).astype(np.float32)
    return q, k_pages, v_pages, block_tables, seq_lens, qsl


def write_fork_and_copy_on_write(cache, kv):
    """On ``cache``: sequence "a" of 6 tokens written from ``kv`` ``[2, 6, Hkv, D]`` (K, V),
    forked to "b", whose next token's write copies the shared last page (one COW copy)."""
    cache.add_sequence("a", list(range(1, 7)))
    cache.write_kv(0, cache.allocate_slots("a", 6), kv[0], kv[1])
    cache.append_tokens("a", list(range(1, 7)))
    cache.fork("a", "b")
    cache.write_kv(0, cache.allocate_slots("b", 1), kv[0, :1], kv[1, :1])  # copy-on-write
    cache.append_tokens("b", [7])
