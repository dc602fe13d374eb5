"""Solutions to notebook 6's exercises (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercises first.
"""

# %% exercise 6a
t, d = np.indices((16, 8))     # [16, 8]: t[i, j] = i (the key), d[i, j] = j (the dim)
addr_hnd = t * 8 + d           # memory [page_size, head_dim]: t rows of 8, then d
addr_kt = d * 16 + t           # memory [head_dim, page_size]: d rows of 16, then t

# %% exercise 6
# intensity = (H / Hkv) / (2 * bytes per value): each key byte serves H / Hkv query heads
intensity_fp16 = bench.H / (2 * bench.HKV) * 4 / 2      # half the bytes per value: x2
intensity_mqa = 32 / (2 * 1)                             # one kv head for 32 query heads

# %% exercise 6b
from numba import njit, prange


@njit(parallel=True, cache=False)
def decode_nhd(q, k_pages, v_pages, block_tables, seq_lens):
    """q [B, H, D]; k_pages, v_pages [num_pages, P, Hkv, D] (NHD) -> out [B, H, D]."""
    B, H, D = q.shape
    P, Hkv = k_pages.shape[1], k_pages.shape[2]
    out = np.zeros((B, H, D), np.float32)
    scale = np.float32(1.0 / np.sqrt(D))
    for bh in prange(B * H):                     # one (sequence, query head) per task
        b, h = bh // H, bh % H
        kvh = h // (H // Hkv)
        m, l = np.float32(-1e30), np.float32(0.0)  # finite start: see STYLE (fastmath)
        acc = np.zeros(D, np.float32)
        for t in range(seq_lens[b]):
            page, off = block_tables[b, t // P], t % P
            s = np.float32(0.0)
            for d in range(D):
                s += q[b, h, d] * k_pages[page, off, kvh, d]
            s *= scale
            m_new = max(m, s)
            alpha, p = np.exp(m - m_new), np.exp(s - m_new)
            l = alpha * l + p
            for d in range(D):
                acc[d] = alpha * acc[d] + p * v_pages[page, off, kvh, d]
            m = m_new
        for d in range(D):
            out[b, h, d] = acc[d] / l
    return out
