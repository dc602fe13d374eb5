"""Dense attention for one sequence: the ground truth every kernel is tested against.

No pages, no online softmax, no cleverness: the whole score matrix is built,
masked and soft-maxed in one go, by default in ``float64``. If a paged kernel and
this function disagree, the kernel is wrong.

It follows the semantics of :func:`paged_np.paged_attention` exactly:

- **causal with an offset**: the ``n_q`` queries are the *last* ``n_q`` tokens
  of a sequence of ``seq_len`` tokens, so query ``i`` sits at position
  ``p = seq_len - n_q + i`` and sees keys ``j <= p``. With ``n_q == seq_len``
  this is ordinary causal prefill; with ``n_q == 1`` it is decode (the query
  sees everything); in between it is a chunk of a chunked prefill.
- **sliding window** ``w``: query ``p`` also needs ``j > p - w``, i.e. it sees
  its last ``w`` keys, itself included.
- **attention sinks** ``s`` (StreamingLLM): the first ``s`` keys stay visible
  to every later query, window or not: ``j <= p and (j > p - w or j < s)``.
  The sinks a query's window leaves out may be scored with a second query,
  ``q_sinks`` (the same query rotated to its cache-relative position: see
  :mod:`paged_np.models.llama`).
- **GQA / MQA**: query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``.
- ``lse`` is the natural-log log-sum-exp of each row's scaled scores: the
  softmax denominator in log space, which is what lets two partial results be
  merged exactly (see :mod:`paged_np.attention.split_k`).

Run ``python -m pytest tests/test_attention_reference.py`` to see it checked
against a plain Python loop.
"""

from __future__ import annotations

import numpy as np


def causal_window_mask(n_q: int, seq_len: int, sliding_window: int = 0,
                       attention_sinks: int = 0) -> np.ndarray:
    """Which keys each query may see: bool ``[n_q, seq_len]``.

    ``mask[i, j]`` is True when query ``i`` (at position ``seq_len - n_q + i``)
    may attend to key ``j``. ``sliding_window == 0`` means no window; with one,
    the first ``attention_sinks`` keys stay visible too.
    Every row has at least one True (the query's own position).
    """
    q_pos = np.arange(seq_len - n_q, seq_len)[:, None]   # [n_q, 1]  absolute positions
    k_pos = np.arange(seq_len)[None, :]                  # [1, seq_len]
    mask = k_pos <= q_pos                                # [n_q, seq_len]  causal
    if sliding_window:
        # window, and the sinks: [n_q, seq_len]
        mask &= (k_pos > q_pos - sliding_window) | (k_pos < attention_sinks)
    return mask


def dense_attention(q, k, v, scale=None, sliding_window=0, dtype=np.float64,
                    attention_sinks=0, q_sinks=None):
    """Attention of one sequence's queries over its contiguous K/V.

    Parameters
    ----------
    q : array ``[n_q, num_heads, head_dim]``, the last ``n_q`` tokens' queries
    k, v : arrays ``[seq_len, num_kv_heads, head_dim]``, ``seq_len >= n_q``
    scale : float, default ``1 / sqrt(head_dim)``
    sliding_window : int, ``0`` for none
    dtype : compute dtype (``float64`` for the ground truth)
    attention_sinks : int, the first keys every query sees (with a window)
    q_sinks : array like ``q``, optional: the queries that score the sink keys
        a query's window leaves out; None: ``q``

    Returns
    -------
    out : ``[n_q, num_heads, head_dim]`` in ``dtype``
    lse : ``[n_q, num_heads]`` in ``dtype``, natural log
    """
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    n_q, num_heads, head_dim = q.shape
    seq_len, num_kv_heads, _ = k.shape
    if scale is None:
        scale = 1.0 / np.sqrt(head_dim)
    scale = q.dtype.type(scale)                            # keep the compute dtype
    group = num_heads // num_kv_heads

    # GQA: repeat each kv head for the `group` query heads that read it.
    k = np.repeat(k, group, axis=1)                        # [seq_len, num_heads, head_dim]
    v = np.repeat(v, group, axis=1)                        # [seq_len, num_heads, head_dim]

    scores = np.einsum("qhd,khd->hqk", q, k) * scale       # [num_heads, n_q, seq_len]
    mask = causal_window_mask(n_q, seq_len, sliding_window, attention_sinks)  # [n_q, seq_len]
    if q_sinks is not None and attention_sinks and sliding_window:
        # The sinks a query's window leaves out are scored with its sinks' query.
        qs = np.asarray(q_sinks, dtype=dtype)              # [n_q, num_heads, head_dim]
        s = min(attention_sinks, seq_len)
        outside = ~causal_window_mask(n_q, seq_len, sliding_window)[:, :s]  # [n_q, s]
        sink_scores = np.einsum("qhd,khd->hqk", qs, k[:s]) * scale  # [H, n_q, s]
        scores[..., :s] = np.where(outside[None], sink_scores, scores[..., :s])
    scores = np.where(mask[None], scores, -np.inf)         # [num_heads, n_q, seq_len]

    m = scores.max(axis=-1, keepdims=True)                 # [num_heads, n_q, 1] never -inf
    p = np.exp(scores - m)                                 # [num_heads, n_q, seq_len] masked -> 0
    denom = p.sum(axis=-1, keepdims=True)                  # [num_heads, n_q, 1]
    out = np.einsum("hqk,khd->qhd", p / denom, v)          # [n_q, num_heads, head_dim]
    lse = (m + np.log(denom))[..., 0].T                    # [n_q, num_heads]
    return out, lse
