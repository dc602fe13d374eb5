"""Solutions to notebook 2's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 2
def merge_pages(outs, lses):
    """outs [n_pages, D], lses [n_pages] -> the output over all pages, [D]."""
    lse = lses.max() + np.log(np.exp(lses - lses.max()).sum())  # log of the total mass
    return (np.exp(lses - lse)[:, None] * outs).sum(axis=0)      # [D] mass-weighted sum

# %% exercise 2b
def online_attention(q, pages, seq_len):
    """q [D]; pages: (K [P, D], V [P, D]) per page, in order, once -> (out [D], lse)."""
    D = q.shape[0]
    m, l, acc = -np.inf, 0.0, np.zeros(D)
    for i, (K, V) in enumerate(pages):
        rows = min(K.shape[0], seq_len - i * K.shape[0])   # the last page may be part full
        s = K[:rows] @ q / np.sqrt(D)                      # [rows] scores
        m_new = max(m, s.max())
        alpha, p = np.exp(m - m_new), np.exp(s - m_new)
        l = alpha * l + p.sum()
        acc = alpha * acc + p @ V[:rows]                   # [D]
        m = m_new
    return acc / l, m + np.log(l)
