"""The decode case every kernel benchmark measures: its shape, and its arrays.

A Llama-3-8B-like attention layer (32 query heads over 8 KV heads of 128,
batch 8, pages of 16 tokens) decoding one token per sequence over a context
of ``ctx`` tokens, with its pages shuffled in the arena as a long-running
cache leaves them. ``python -m paged_np bench`` (:mod:`.bench`), its report
(:mod:`.bench_report`) and ``benchmarks/kernel_ablation.py`` all read the
shape from here, so a table and the run that made it cannot disagree.
"""

from __future__ import annotations

import numpy as np

#: Batch, query heads, KV heads, head size, page size.
B, H, HKV, D, PAGE = 8, 32, 8, 128, 16


def make_decode_case(ctx: int, dtype, page_size: int = PAGE, seed: int = 0,
                     kv_layout: str = "hnd"):
    """Arrays of one decode step: B sequences of ``ctx`` tokens, shuffled pages.

    Returns ``q [B, H, D]``, ``k, v [B * n_pages, HKV, page_size, D]`` in
    ``dtype``, ``tables [B, n_pages]`` (int32), ``seq_lens [B]`` and
    ``query_start_loc [B + 1]``: the arguments of a backend's ``forward``.
    ``kv_layout="k_transposed"``: the same keys, each K page stored ``[D, page_size]``.
    """
    rng = np.random.default_rng(seed)
    n_pages = -(-ctx // page_size)
    k = rng.standard_normal((B * n_pages, HKV, page_size, D), np.float32).astype(dtype)
    v = rng.standard_normal((B * n_pages, HKV, page_size, D), np.float32).astype(dtype)
    tables = rng.permutation(B * n_pages).reshape(B, n_pages).astype(np.int32)
    q = rng.standard_normal((B, H, D), np.float32)
    seq_lens = np.full(B, ctx, np.int32)
    qsl = np.arange(B + 1, dtype=np.int32)
    if kv_layout != "hnd":
        k = np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    return q, k, v, tables, seq_lens, qsl
