"""TEMPORARY stand-in for paged_np.attention until that branch is merged (then deleted)."""

from __future__ import annotations

import numpy as np


def dense_attention(q, k, v, scale=None, sliding_window=0, dtype=np.float64):
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    n_q, nh, d = q.shape
    L, nkv, _ = k.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    g = nh // nkv
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) * scale
    qp = np.arange(L - n_q, L)[:, None]
    kp = np.arange(L)[None, :]
    mask = kp <= qp
    if sliding_window:
        mask &= kp > qp - sliding_window
    s = np.where(mask[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p / den, v), (m + np.log(den))[..., 0].T


def paged_attention(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc=None,
                    scale=None, sliding_window=None, backend="auto", return_lse=False):
    ps = k_pages.shape[2]
    out = np.zeros(q.shape, np.float32)
    for b in range(len(seq_lens)):
        a, e, L = int(query_start_loc[b]), int(query_start_loc[b + 1]), int(seq_lens[b])
        if a == e:
            continue
        pos = np.arange(L)
        pages = np.asarray(block_tables[b])[pos // ps]
        pages = np.where(pages < 0, 0, pages)
        k = k_pages[pages, :, pos % ps]
        v = v_pages[pages, :, pos % ps]
        out[a:e] = dense_attention(q[a:e], k, v, scale, sliding_window or 0, np.float32)[0]
    return out
