"""Split-K attention and the exact merge of attention states.

Why split
---------
A decode step has one query per sequence, so a kernel that gives each
(sequence, head) to one worker leaves most workers idle when the batch is small
and the context long. Split-K (vLLM's PagedAttention v2, FlashDecoding,
FlashInfer's cascade) cuts one sequence's pages into parts, attends to each part
independently (in parallel), and merges the partial results.

Why the merge is exact
----------------------
A part ``a`` that attended to keys ``K_a`` returns its normalised output and
the log of its softmax denominator::

    out_a = sum_{j in K_a} exp(s_j) v_j / Z_a,      lse_a = log Z_a,
    Z_a   = sum_{j in K_a} exp(s_j)

For the union of two disjoint key sets, ``Z = Z_a + Z_b``, and the full output
is the two outputs weighted by their share of ``Z``::

    lse = log(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

Nothing is approximated: it is the same sum, regrouped. The weights are
computed relative to ``max(lse_a, lse_b)`` so no ``exp`` overflows. A part that
saw no key at all has ``Z = 0``, ``lse = -inf``, and weight 0 (its ``out`` is
ignored, even if it is NaN). Merging is commutative and associative (up to
rounding), so any number of parts merge in any order.

:func:`forward` below is the split-K form of
:func:`paged_np.attention.numpy_paged.forward`: same (validated) arguments plus
``num_splits``. Run ``python -m pytest tests/test_attention_merge.py``.
"""

from __future__ import annotations

import numpy as np

from ..checks import check_positive_int
from ..errors import DTypeError, InvalidArgument, ShapeError
from .numpy_paged import attend_sequence


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Merge two partial attention results over disjoint key sets.

    Parameters
    ----------
    out_a, out_b : ndarray, float, shape [T, num_heads, head_dim]
        Each part's normalised attention output.
    lse_a, lse_b : ndarray, float, shape [T, num_heads]
        Each part's log-sum-exp of its scaled scores (natural log). ``-inf`` marks
        an empty part (its ``out`` is ignored, even if NaN). ``+inf`` and NaN are
        refused.

    Returns
    -------
    out : ndarray, shape [T, num_heads, head_dim]
        Attention over the union of the two key sets.
    lse : ndarray, shape [T, num_heads]
        Its log-sum-exp. Both are in the common dtype of the inputs (float32 or
        float64; float16 computes in float32). Where both parts are empty, ``out``
        is 0 and ``lse`` is ``-inf``.

    Example
    -------
    Attention over keys 0-3 equals the merge of attention over keys 0-1 and 2-3:

    >>> import numpy as np, paged_np as pnp
    >>> from paged_np.attention.reference import dense_attention
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((1, 2, 8))                       # the last of 4 tokens
    >>> k, v = rng.standard_normal((2, 4, 2, 8))
    >>> full, _ = dense_attention(q, k, v)
    >>> out_a, lse_a = dense_attention(q, k[:2], v[:2], dtype=np.float64)
    >>> out_b, lse_b = dense_attention(q, k[2:], v[2:], dtype=np.float64)
    >>> out, lse = pnp.merge_attention_states(out_a, lse_a, out_b, lse_b)
    >>> bool(np.allclose(out, full))
    True
    """
    arrays = {"out_a": out_a, "lse_a": lse_a, "out_b": out_b, "lse_b": lse_b}
    for name, x in arrays.items():
        if not isinstance(x, np.ndarray):
            raise DTypeError(f"{name} must be a numpy array, got {type(x).__name__}")
        if x.dtype.kind != "f":
            raise DTypeError(f"{name} must have a float dtype, got {x.dtype}")
    for name, want in (("out_a", 3), ("out_b", 3), ("lse_a", 2), ("lse_b", 2)):
        if arrays[name].ndim != want:
            raise ShapeError(f"{name} must be {want}-D, got shape {arrays[name].shape}")
    if out_b.shape != out_a.shape:
        raise ShapeError(f"out_b shape {out_b.shape} differs from out_a shape {out_a.shape}")
    for name in ("lse_a", "lse_b"):
        if arrays[name].shape != out_a.shape[:2]:
            raise ShapeError(f"{name} must have shape {out_a.shape[:2]} (out_a's [T, num_heads]),"
                             f" got {arrays[name].shape}")
        bad = np.isnan(arrays[name]) | (arrays[name] == np.inf)
        if bad.any():
            raise InvalidArgument(f"{name} holds NaN or +inf (first at index "
                                  f"{tuple(int(i) for i in np.argwhere(bad)[0])})")
    dtype = np.promote_types(np.result_type(out_a, lse_a, out_b, lse_b), np.float32)
    return _merge(*(x.astype(dtype, copy=False) for x in (out_a, lse_a, out_b, lse_b)))


def _merge(out_a, lse_a, out_b, lse_b):
    """The merge itself, on checked arrays (see the module docstring)."""
    m = np.maximum(lse_a, lse_b)                                 # [T, H]
    m_ref = np.where(np.isfinite(m), m, 0).astype(m.dtype)       # [T, H] 0 if both empty
    w_a = np.exp(lse_a - m_ref)                                  # [T, H] = Z_a / exp(m)
    w_b = np.exp(lse_b - m_ref)                                  # [T, H] = Z_b / exp(m)
    z = w_a + w_b                                                # [T, H] = Z / exp(m)
    nonempty = z > 0                                             # [T, H]
    z_safe = np.where(nonempty, z, 1)                            # [T, H]
    # An empty part's out is never read: np.where, not 0 * out (0 * NaN = NaN).
    part_a = np.where((w_a > 0)[..., None], out_a * (w_a / z_safe)[..., None], 0)  # [T, H, D]
    part_b = np.where((w_b > 0)[..., None], out_b * (w_b / z_safe)[..., None], 0)  # [T, H, D]
    out = (part_a + part_b).astype(out_a.dtype, copy=False)      # [T, H, D]
    with np.errstate(divide="ignore"):
        lse = np.where(nonempty, m_ref + np.log(z_safe), -np.inf).astype(m.dtype)  # [T, H]
    return out, lse


def forward(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, scale,
            sliding_window, return_lse, num_splits=2, kv_layout="hnd"):
    """Split-K paged attention: same arguments and result as ``numpy_paged.forward``.

    Each sequence's pages are cut into ``num_splits`` nearly equal runs of
    consecutive pages (fewer when it has fewer pages); each run is attended to
    on its own, giving a partial ``(out, lse)``, and the partials are merged
    left to right with :func:`merge_attention_states`. ``kv_layout`` as in
    :func:`~paged_np.attention.numpy_paged.attend_sequence`.
    """
    num_splits = check_positive_int("num_splits", num_splits)
    page_size = v_pages.shape[2]
    out = np.empty(q.shape, dtype=np.float32)                    # [T, H, D]
    lse = np.empty(q.shape[:2], dtype=np.float32)                # [T, H]
    for b in range(len(seq_lens)):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        if start == end:
            continue
        seq_len = int(seq_lens[b])
        n_pages = -(-seq_len // page_size)
        # Page boundaries of the parts: [0, ..., n_pages], as even as possible.
        bounds = np.linspace(0, n_pages, min(num_splits, n_pages) + 1).round().astype(int)
        acc_out = acc_lse = None
        for first, last in zip(bounds[:-1], bounds[1:], strict=True):
            part_out, part_lse = attend_sequence(                # [n_q, H, D], [n_q, H]
                q[start:end], k_pages, v_pages, block_tables[b], seq_len, scale,
                sliding_window, first_page=int(first), end_page=int(last), kv_layout=kv_layout)
            if acc_out is None:
                acc_out, acc_lse = part_out, part_lse
            else:
                acc_out, acc_lse = _merge(acc_out, acc_lse, part_out, part_lse)
        out[start:end], lse[start:end] = acc_out, acc_lse
    return out, (lse if return_lse else None)
