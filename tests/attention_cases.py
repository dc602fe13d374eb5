"""Builders shared by the attention tests of every backend (numpy, numba, cuda).

Import from a test file in ``tests/`` as ``from attention_cases import ...``
(pytest puts ``tests/`` on ``sys.path``).

- :func:`make_paged_case` builds a random batch: dense per-sequence K/V
  scattered into the pages of an arena through *shuffled* block tables, with
  every slot no sequence uses (tails of last pages, spare pages) set to NaN,
  so any read of an unused slot shows up as NaN in the output.
- :meth:`PagedCase.reference` is the float64 ground truth for that batch.
- :func:`rel_error` and :data:`TOL` state the correctness bar.
- :func:`available_backends` lists the backends that import here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

from paged_np.attention.reference import dense_attention

#: Correctness bar: ``max|x - ref| <= TOL * max(1, max|ref|)`` for out and lse.
TOL = 1e-5

HEAD_DIMS = (32, 64, 80, 128, 256)
PAGE_SIZES = (1, 8, 16, 32)
HEADS = ((4, 4), (8, 2), (8, 1), (12, 4))          # (num_heads, num_kv_heads)
KV_DTYPES = (np.float32, np.float16)


def sweep_seq_lens(page_size: int) -> list:
    """The issue's sequence lengths: 1, ps-1, ps, ps+1, 137, 300 (ps-1 may be 0)."""
    return [1, page_size - 1, page_size, page_size + 1, 137, 300]


def prefill_query_counts(seq_lens) -> list:
    """Chunked-prefill query counts: whole prompt, half, a 7-token chunk, one token.

    Cycled over the batch, each never more than the sequence's length.
    """
    out = []
    for b, n in enumerate(seq_lens):
        pick = (n, -(-n // 2), min(n, 7), min(n, 1))[b % 4]
        out.append(int(pick))
    return out


def available_backends() -> list:
    """``["numpy"]`` plus ``"numba"`` when :mod:`paged_np.attention.numba_cpu` imports."""
    names = ["numpy"]
    try:
        importlib.import_module("paged_np.attention.numba_cpu")
        names.append("numba")
    except Exception:  # noqa: BLE001 - any failure means "not available here"
        pass
    return names


def rel_error(x, ref) -> float:
    """``max|x - ref| / max(1, max|ref|)``, ignoring positions where both are -inf."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    both_inf = np.isneginf(x) & np.isneginf(ref)
    diff = np.where(both_inf, 0.0, np.abs(x - ref))
    if diff.size == 0:
        return 0.0
    finite_ref = np.where(np.isfinite(ref), np.abs(ref), 0.0)
    return float(diff.max() / max(1.0, finite_ref.max()))


@dataclass
class PagedCase:
    """One batch, paged and dense. Arrays in the layout ``paged_attention`` takes.

    q : float32 ``[T, num_heads, head_dim]``
    k_pages, v_pages : ``[num_pages, num_kv_heads, page_size, head_dim]`` views
        ``arena[0, 0]`` and ``arena[0, 1]`` of a one-layer arena (kv dtype)
    block_tables : int32 ``[B, max_pages]``, padded with ``pad_value``
    seq_lens : int32 ``[B]``
    query_start_loc : int32 ``[B+1]``, or None for decode (one query per sequence)
    k_dense, v_dense : lists of ``[seq_len_b, num_kv_heads, head_dim]`` (kv dtype),
        exactly the values stored in the pages
    n_queries : list of per-sequence query counts
    """

    q: np.ndarray
    k_pages: np.ndarray
    v_pages: np.ndarray
    block_tables: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray | None
    k_dense: list = field(repr=False)
    v_dense: list = field(repr=False)
    n_queries: list = field(default_factory=list)

    @property
    def qsl(self) -> np.ndarray:
        """``query_start_loc`` as an array even for decode (``0..B``)."""
        if self.query_start_loc is None:
            return np.arange(len(self.seq_lens) + 1, dtype=np.int32)
        return self.query_start_loc

    def args(self):
        """Positional args for ``paged_attention``: q, k_pages, ..., query_start_loc."""
        return (self.q, self.k_pages, self.v_pages, self.block_tables, self.seq_lens,
                self.query_start_loc)

    def reference(self, scale=None, sliding_window=None):
        """Float64 dense attention per sequence: ``(out [T,H,D], lse [T,H])``."""
        T, H, D = self.q.shape
        out = np.zeros((T, H, D))
        lse = np.zeros((T, H))
        qsl = self.qsl
        for b in range(len(self.seq_lens)):
            s, e = int(qsl[b]), int(qsl[b + 1])
            if s == e:
                continue
            out[s:e], lse[s:e] = dense_attention(self.q[s:e], self.k_dense[b], self.v_dense[b],
                                                 scale=scale, sliding_window=sliding_window or 0)
        return out, lse


def make_paged_case(seq_lens, n_queries=None, *, num_heads=4, num_kv_heads=2, head_dim=32,
                    page_size=8, kv_dtype=np.float32, seed=0, spare_pages=3, pad_columns=2,
                    pad_value=-1, shuffle=True, poison=True) -> PagedCase:
    """Build a random paged batch and its dense twin.

    Parameters
    ----------
    seq_lens : sequence of int >= 0, tokens per sequence in the cache
    n_queries : None for decode (one query each; ``query_start_loc`` is then None),
        or per-sequence query counts (``0 <= n <= seq_len``), e.g.
        :func:`prefill_query_counts`
    num_heads, num_kv_heads, head_dim, page_size : shapes
    kv_dtype : np.float32 or np.float16, dtype of the pages
    seed : int, for ``np.random.default_rng``
    spare_pages : pages no sequence uses (NaN when ``poison``)
    pad_columns : extra block-table columns past the longest sequence
    pad_value : what fills block-table entries no sequence uses (-1, or e.g.
        a huge id to prove they are never read)
    shuffle : page ids in random order (else 0, 1, 2, ... in sequence order)
    poison : unused slots and spare pages hold NaN (else random values)

    Returns
    -------
    :class:`PagedCase`
    """
    rng = np.random.default_rng(seed)
    seq_lens = [int(n) for n in seq_lens]
    if n_queries is None and any(n == 0 for n in seq_lens):
        raise ValueError("decode needs seq_len >= 1 for every sequence")
    pages_needed = [-(-n // page_size) for n in seq_lens]
    num_pages = max(1, sum(pages_needed) + spare_pages)
    shape = (1, 2, num_pages, num_kv_heads, page_size, head_dim)
    if poison:
        arena = np.full(shape, np.nan, dtype=kv_dtype)
    else:
        arena = rng.standard_normal(shape).astype(kv_dtype)
    ids = rng.permutation(num_pages) if shuffle else np.arange(num_pages)

    max_pages = max(pages_needed, default=0) + pad_columns
    block_tables = np.full((len(seq_lens), max_pages), pad_value, dtype=np.int64)
    k_dense, v_dense, nxt = [], [], 0
    for b, n in enumerate(seq_lens):
        k = rng.standard_normal((n, num_kv_heads, head_dim)).astype(kv_dtype)  # [n, KV, D]
        v = rng.standard_normal((n, num_kv_heads, head_dim)).astype(kv_dtype)  # [n, KV, D]
        k_dense.append(k)
        v_dense.append(v)
        for i in range(pages_needed[b]):
            page = int(ids[nxt])
            nxt += 1
            block_tables[b, i] = page
            tok = slice(i * page_size, min(n, (i + 1) * page_size))
            # [P, KV, D] tokens -> the page's [KV, P, D] tile (HND layout)
            arena[0, 0, page, :, : tok.stop - tok.start] = k[tok].transpose(1, 0, 2)
            arena[0, 1, page, :, : tok.stop - tok.start] = v[tok].transpose(1, 0, 2)

    if n_queries is None:
        counts, qsl = [1] * len(seq_lens), None
    else:
        counts = [int(c) for c in n_queries]
        qsl = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    q = rng.standard_normal((sum(counts), num_heads, head_dim)).astype(np.float32)
    bt = block_tables.astype(np.int32) if -2**31 <= pad_value < 2**31 else block_tables
    return PagedCase(q, arena[0, 0], arena[0, 1], bt, np.asarray(seq_lens, np.int32), qsl,
                     k_dense, v_dense, counts)


@dataclass
class QuantizedCase:
    """A :class:`PagedCase` with its pages quantized (kv_cache_dtype int8 or fp8_e4m3).

    ``case`` is the original, with ``k_dense``/``v_dense`` replaced by the
    dequantized values the kernels must see; ``float_case`` keeps the float32
    K/V (for the error of the format itself). ``k_scales``/``v_scales``:
    float32 ``[num_pages, num_kv_heads, page_size]``.
    """

    case: PagedCase
    float_case: PagedCase
    k_scales: np.ndarray
    v_scales: np.ndarray

    def kwargs(self) -> dict:
        return dict(k_scales=self.k_scales, v_scales=self.v_scales)


def quantize_case(case: PagedCase, fmt: str) -> QuantizedCase:
    """Quantize every row of ``case``'s pages with :func:`paged_np.cache.kv_quant.quantize`.

    Poisoned (NaN) slots get NaN scales and arbitrary codes: a kernel that
    reads one shows NaN.
    """
    from dataclasses import replace

    from paged_np.cache.kv_quant import dequantize, quantize

    with np.errstate(invalid="ignore"):                          # NaN rows -> any code
        kq, ks = quantize(case.k_pages, fmt)                     # [P, KV, ps, D], [P, KV, ps]
        vq, vs = quantize(case.v_pages, fmt)
    kd, vd = dequantize(kq, ks), dequantize(vq, vs)              # [P, KV, ps, D] float32
    ps = case.k_pages.shape[2]
    k_dense, v_dense = [], []
    for b, n in enumerate(case.seq_lens):
        pages = case.block_tables[b, :-(-int(n) // ps)]          # the pages sequence b uses
        for dense, src in ((k_dense, kd), (v_dense, vd)):
            rows = src[pages].transpose(0, 2, 1, 3).reshape(-1, *src.shape[1:2], src.shape[3])
            dense.append(rows[:int(n)])                          # [n, KV, D]
    quant = replace(case, k_pages=kq, v_pages=vq, k_dense=k_dense, v_dense=v_dense)
    return QuantizedCase(quant, case, ks, vs)
