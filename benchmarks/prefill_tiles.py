"""Causal prefill against torch SDPA: the BLAS path's key block, and the kernel path.

Run from the repository root (torch is a comparison peer: ``pip install torch==2.13.0``)::

    python benchmarks/prefill_tiles.py            # writes benchmarks/prefill_tiles.md
    python benchmarks/prefill_tiles.py --tokens 512 --no-write

The case is the bench's (``python -m paged_np bench``): one prompt of 2048 tokens,
32 query heads on 8 kv heads, head_dim 128, pages of 16, shuffled, float32. Rows:

- **BLAS path, key block K**: :func:`paged_np.attention.numba_prefill.attend_sequence`
  with ``K_TILE = K``. The largest block holds a tile's every key, which is how that
  module first computed it (the whole ``S`` row of a tile, up to 4 MiB, through the
  last-level cache three times); smaller blocks keep ``S`` in L2 and fold them in
  with an online softmax (FlashAttention-2's loop order).
- **kernel path**: the decode kernel's item loop on prefill tiles (``blas_min_queries``
  past the prompt), each K/V page tile serving 16 queries x 4 heads, for each K layout.
- **torch SDPA**: ``scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` on
  the same keys laid out contiguously, same thread count.

All run in alternation in one process (best of several rounds), so their ratios
hold on a shared machine; the table gives each one's time, GFLOP/s (the causal
half's multiply-adds) and its speed relative to SDPA (above 1: faster).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numba
import numpy as np

from paged_np.attention import numba_cpu, numba_prefill
from paged_np.cli.bench import _best_alternating
from paged_np.cli.bench_case import HKV, PAGE, D, H
from paged_np.hardware import cpu_model, isa_info
from paged_np.registry import KV_LAYOUTS

K_BLOCKS = (256, 512, 1024, 1 << 30)


def case(T: int):
    """The prompt's arrays: q, K pages per layout, V pages, block table, lens, offsets."""
    rng = np.random.default_rng(1)
    n_pages = -(-T // PAGE)
    k = rng.standard_normal((n_pages, HKV, PAGE, D), np.float32)
    v = rng.standard_normal((n_pages, HKV, PAGE, D), np.float32)
    ks = {layout: k if layout == "hnd" else np.ascontiguousarray(k.transpose(0, 1, 3, 2))
          for layout in KV_LAYOUTS.names()}
    bt = rng.permutation(n_pages).astype(np.int32)[None]
    q = rng.standard_normal((T, H, D), np.float32)
    return q, ks, v, bt, np.array([T], np.int32), np.array([0, T], np.int32)


def blas_path(q, k, v, bt, sl, qsl, k_tile):
    """The BLAS path with key blocks of ``k_tile`` (the module's constant, restored after)."""
    def run():
        saved, numba_prefill.K_TILE = numba_prefill.K_TILE, k_tile
        try:
            numba_cpu.forward(q, k, v, bt, sl, qsl, D**-0.5, 0, False)
        finally:
            numba_prefill.K_TILE = saved
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(numba.get_num_threads())
    T = args.tokens
    q, ks, v, bt, sl, qsl = case(T)
    kc = ks["hnd"][bt[0]].transpose(1, 0, 2, 3).reshape(HKV, -1, D)[None, :, :T]
    vc = v[bt[0]].transpose(1, 0, 2, 3).reshape(HKV, -1, D)[None, :, :T]
    tq = torch.from_numpy(q.transpose(1, 0, 2)[None].copy())
    tk, tv = torch.from_numpy(kc.copy()), torch.from_numpy(vc.copy())
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fns = {"torch SDPA": lambda: sdpa(tq, tk, tv, is_causal=True, enable_gqa=True)}
    for kb in K_BLOCKS:
        name = "whole row (first version)" if kb >= T else f"key block {kb}"
        fns[f"BLAS path, {name}"] = blas_path(q, ks["hnd"], v, bt, sl, qsl, kb)
    for layout in KV_LAYOUTS.names():
        fns[f"kernel path, K {layout}"] = (
            lambda kp=ks[layout], layout=layout: numba_cpu.forward(
                q, kp, v, bt, sl, qsl, D**-0.5, 0, False, kv_layout=layout,
                blas_min_queries=1 << 30))
    for fn in fns.values():  # compile, first touch
        fn()
    best = _best_alternating(fns, 3, 2)
    flops = 4.0 * H * D * T * (T + 1) / 2
    isa = isa_info()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# Causal prefill, {T} tokens, against torch SDPA", "",
             f"`python benchmarks/prefill_tiles.py`: {isa['codegen']} code on {cpu_model()}, "
             f"{numba.get_num_threads()} threads, torch {torch.__version__}; 32/8 heads, "
             f"head_dim 128, page 16, float32; load average {load:.1f} at the end.", "",
             "| variant | ms | GFLOP/s | vs SDPA |", "|---|---|---|---|"]
    for name, t in best.items():
        lines.append(f"| {name} | {t * 1e3:.1f} | {flops / t / 1e9:.0f} | "
                     f"{best['torch SDPA'] / t:.2f}x |")
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_write:
        Path(__file__).with_suffix(".md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
