"""Paged attention in NumPy, one page at a time: the lesson.

What it computes
----------------
For every sequence ``b`` of a batch, its ``n_q`` new queries attend to the
``seq_len`` keys and values already in the KV cache. Those keys do not sit in
one array: they are spread over *pages* of the arena, and the sequence's
*block table* says which page holds which stretch of tokens::

    logical page i of sequence b   ->   page id block_tables[b, i]
    token position j               ->   page block_tables[b, j // page_size],
                                        row j % page_size of that page

How: online softmax
-------------------
Softmax needs the maximum and the sum over *all* of a row's scores, but we see
the scores one page at a time. So each (query, head) row keeps three running
values and corrects them as each page arrives (Milakov & Gimelshein 2018; the
trick behind FlashAttention and vLLM's PagedAttention)::

    m    running max of the scores seen so far
    l    running sum of exp(score - m)
    acc  running sum of exp(score - m) * v        (a head_dim vector)

When a page brings scores ``s`` with max ``m_page``::

    m_new = max(m, m_page)
    alpha = exp(m - m_new)           # how much the old max shrinks the old terms
    p     = exp(s - m_new)           # this page's unnormalised weights
    l     = alpha * l + sum(p)
    acc   = alpha * acc + p @ v_page
    m     = m_new

and at the end ``out = acc / l`` and ``lse = m + log(l)``. The result equals
the dense softmax exactly (up to rounding): every term ends up multiplied by
``exp(-m_final)`` whichever page it came from.

**Attention sinks** (StreamingLLM): with a window, the first
``attention_sinks`` keys stay visible to every query, so a page holding them
is never skipped, and the sinks a row's window leaves out are scored with
``q_sinks`` (the query as the model rotates it for them; ``q`` when None).
Everything else is the same.

To follow one page's contribution, call :func:`attend_sequence` with
``first_page=i, end_page=i + 1``: it returns that page alone as a partial
``(out, lse)``, and merging the partials of all pages
(:func:`paged_np.merge_attention_states`) gives back the full result.

Vectorised over heads, over the tokens of a page and over the queries of a
sequence; a Python loop over sequences and pages. Fast kernels
(:mod:`paged_np.attention.numba_cpu`) loop differently but compute the same.

Simplifications compared with vLLM: no tensor cores or shared memory, of
course; float16 and 8-bit pages are upcast to float32 page by page; one code path serves
decode and prefill (vLLM has separate kernels).

This module's :func:`forward` takes already validated inputs (see
:func:`paged_np.paged_attention`, which checks them and then calls it).
"""

from __future__ import annotations

import numpy as np


def forward(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, scale,
            sliding_window, return_lse, k_scales=None, v_scales=None, attention_sinks=0,
            q_sinks=None, kv_layout="hnd"):
    """Paged attention of a batch (validated inputs, see the module docstring).

    q ``[T, num_heads, head_dim]`` float32; k_pages, v_pages
    ``[num_pages, num_kv_heads, page_size, head_dim]``; block_tables int32
    ``[B, max_pages]``; seq_lens int32 ``[B]``; query_start_loc int32 ``[B+1]``.
    Returns ``(out, lse)``: float32 ``[T, num_heads, head_dim]`` and
    ``[T, num_heads]`` (``lse`` is None unless ``return_lse``). 8-bit pages come
    with ``k_scales, v_scales`` float32 ``[num_pages, num_kv_heads, page_size]``;
    ``attention_sinks``, ``q_sinks`` (like q, or None), ``kv_layout`` as in :func:`attend_sequence`.
    """
    out = np.empty(q.shape, dtype=np.float32)                    # [T, H, D]
    lse = np.empty(q.shape[:2], dtype=np.float32)                # [T, H]
    for b in range(len(seq_lens)):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        if start == end:                                         # no queries this step
            continue
        out[start:end], lse[start:end] = attend_sequence(
            q[start:end], k_pages, v_pages, block_tables[b], int(seq_lens[b]),
            scale, sliding_window, k_scales=k_scales, v_scales=v_scales,
            attention_sinks=attention_sinks,
            q_sinks=None if q_sinks is None else q_sinks[start:end], kv_layout=kv_layout)
    return out, (lse if return_lse else None)


def attend_sequence(q, k_pages, v_pages, block_table, seq_len, scale, sliding_window,
                    first_page=0, end_page=None, k_scales=None, v_scales=None,
                    attention_sinks=0, q_sinks=None, kv_layout="hnd"):
    """One sequence's queries over its pages ``[first_page, end_page)``.

    With a window, keys ``< attention_sinks`` stay visible too, those outside a
    row's window scored with ``q_sinks`` ``[n_q, H, D]`` (None: with ``q``).
    ``kv_layout="k_transposed"``: k_pages are ``[num_pages, KV, D, page_size]``.

    q ``[n_q, H, D]`` are the sequence's last ``n_q`` tokens. With the default
    page range this is the full attention. A sub-range gives a *partial* result
    over those keys only, to be merged with the others (split-K): a query that
    sees no key of the range gets ``out = 0`` and ``lse = -inf``.

    Returns ``out`` float32 ``[n_q, H, D]`` and ``lse`` float32 ``[n_q, H]``.
    """
    n_q, num_heads, head_dim = q.shape
    _, num_kv_heads, page_size, _ = v_pages.shape
    group = num_heads // num_kv_heads                            # query heads per kv head
    if end_page is None:
        end_page = -(-seq_len // page_size)                      # ceil: pages in use

    # --- Group the query heads by the kv head they read (GQA/MQA). ---------
    # Head h = kv * group + g reads kv head kv. Rows r = i * group + g stack the
    # queries and the heads of a group, so one matmul serves them all.
    qg = q.reshape(n_q, num_kv_heads, group, head_dim)           # [n_q, KV, G, D]
    qg = qg.transpose(1, 0, 2, 3).reshape(num_kv_heads, n_q * group, head_dim)  # [KV, R, D]
    qg = qg * np.float32(scale)                                  # [KV, R, D] scale once
    sinks = attention_sinks if sliding_window else 0
    qg_sinks = qg if q_sinks is None else _group_rows(q_sinks, num_kv_heads, scale)  # [KV, R, D]
    # Absolute position of each row's query: the last n_q tokens of the sequence.
    q_pos = np.arange(seq_len - n_q, seq_len)                    # [n_q]
    row_pos = np.repeat(q_pos, group)                            # [R]

    # --- The online-softmax state, one entry per (kv head, row). ------------
    rows = n_q * group
    m = np.full((num_kv_heads, rows), -np.inf, dtype=np.float32)        # [KV, R] running max
    l = np.zeros((num_kv_heads, rows), dtype=np.float32)                # [KV, R] running sum
    acc = np.zeros((num_kv_heads, rows, head_dim), dtype=np.float32)    # [KV, R, D]

    for i in range(first_page, end_page):
        # Positions of this page's tokens; the last page may be partly filled.
        page_start = i * page_size
        n_valid = min(page_size, seq_len - page_start)           # tokens of the page in use
        # Sliding window: skip a page that lies wholly before every query's window
        # (its last token is too old even for the earliest query).
        if (sliding_window and page_start + n_valid - 1 <= q_pos[0] - sliding_window
                and page_start >= sinks):                         # ... and holds no sink
            continue
        k_pos = np.arange(page_start, page_start + n_valid)      # [P] (P = n_valid)

        # Read the page. Slicing to n_valid rows means the unused slots (which may
        # hold garbage or NaN) are never read at all; float16 is upcast here, and
        # 8-bit codes become code * scale of their token (to_float32).
        page_id = block_table[i]
        k_rows = (k_pages[page_id, :, :n_valid] if kv_layout == "hnd"     # [KV, P, D] as
                  else k_pages[page_id, :, :, :n_valid].transpose(0, 2, 1))  # stored, or a view
        k_tile = to_float32(k_rows,                                         # [KV, P, D]
                            None if k_scales is None else k_scales[page_id, :, :n_valid])
        v_tile = to_float32(v_pages[page_id, :, :n_valid],                  # [KV, P, D]
                            None if v_scales is None else v_scales[page_id, :, :n_valid])

        # Scores of every row against the page's tokens, then the causal/window mask.
        s = qg @ k_tile.transpose(0, 2, 1)                       # [KV, R, P]
        visible = k_pos[None, :] <= row_pos[:, None]             # [R, P] causal
        if sliding_window:
            in_window = k_pos[None, :] > row_pos[:, None] - sliding_window  # [R, P]
            visible &= in_window | (k_pos < sinks)[None, :]      # [R, P] window or sink
            n_sink = min(max(sinks - page_start, 0), n_valid)    # sink keys of the page
            if n_sink and qg_sinks is not qg:  # those out of a row's window: its sinks' query
                s_sink = qg_sinks @ k_tile[:, :n_sink].transpose(0, 2, 1)  # [KV, R, n_sink]
                s[..., :n_sink] = np.where(in_window[None, :, :n_sink], s[..., :n_sink], s_sink)
        s = np.where(visible[None], s, -np.inf)                  # [KV, R, P]

        # Online softmax update. A row may see nothing yet (m_new = -inf): then use
        # 0 as the reference, so exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
        m_new = np.maximum(m, s.max(axis=-1))                    # [KV, R]
        m_ref = np.where(np.isfinite(m_new), m_new, np.float32(0))  # [KV, R]
        alpha = np.exp(m - m_ref)                                # [KV, R] rescales the old terms
        p = np.exp(s - m_ref[..., None])                         # [KV, R, P] this page's weights
        l = alpha * l + p.sum(axis=-1)                           # [KV, R]
        acc = alpha[..., None] * acc + p @ v_tile                # [KV, R, D]
        m = m_new                                                # [KV, R]

    # --- Normalise. Rows that saw no key (only possible on a partial range) -----
    # have l == 0: their output is 0 and their lse -inf, "an empty part".
    seen = l > 0                                                 # [KV, R]
    out = acc / np.where(seen, l, np.float32(1))[..., None]      # [KV, R, D]
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m + np.log(l), -np.inf).astype(np.float32)  # [KV, R]

    # Undo the grouping: [KV, n_q*G, ...] -> [n_q, KV*G, ...] = [n_q, H, ...].
    out = out.reshape(num_kv_heads, n_q, group, head_dim).transpose(1, 0, 2, 3)  # [n_q, KV, G, D]
    lse = lse.reshape(num_kv_heads, n_q, group).transpose(1, 0, 2)               # [n_q, KV, G]
    return out.reshape(n_q, num_heads, head_dim), lse.reshape(n_q, num_heads)


def _group_rows(q, num_kv_heads, scale):
    """``q`` [n_q, H, D] as the kernel's rows: [KV, n_q * G, D], times ``scale``."""
    n_q, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    qg = q.reshape(n_q, num_kv_heads, group, head_dim).transpose(1, 0, 2, 3)  # [KV, n_q, G, D]
    return qg.reshape(num_kv_heads, n_q * group, head_dim) * np.float32(scale)


def to_float32(pages: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
    """A page's rows as float32: float pages upcast, 8-bit codes times their token's
    scale (:mod:`paged_np.cache.kv_quant`, loaded only for 8-bit pages)."""
    if scales is None:
        return pages.astype(np.float32, copy=False)
    from ..cache.kv_quant import dequantize

    return dequantize(pages, scales)
