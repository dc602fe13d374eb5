"""Solutions to notebook 6's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

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
