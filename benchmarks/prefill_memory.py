"""Memory the BLAS prefill path allocates per call, against context length.

    python benchmarks/prefill_memory.py            # writes benchmarks/prefill_memory.md
    python benchmarks/prefill_memory.py --quick    # 2K and 8K only, prints the table

The decode kernel allocates nothing that grows with the context. The prefill
path (:mod:`paged_np.attention.numba_prefill`) does: for each kv head it
gathers the sequence's K and V into contiguous float32 buffers (``n_keys *
head_dim`` floats each). Its score buffer ``S`` holds one key block of a query
tile, ``min(n_q, Q_TILE) * G * min(n_keys, K_TILE)`` floats (``G = num_heads //
num_kv_heads``): the tile's softmax runs online over blocks of ``K_TILE`` keys,
FlashAttention-2's loop order, so ``S`` no longer grows with the context. So
its workspace is

    bound = 4 bytes * (min(n_q, Q_TILE) * G * min(n_keys, K_TILE)
                       + 3 * n_keys * head_dim + 4 * n_q * G * head_dim)

(``3 * head_dim``: K and V of one kv head, plus the next head's K gathered
while the last one is still referenced; the last term: one kv head's scaled
queries, a tile's running output, its block product and its normalised copy). This script
runs the last 128-query chunk of a prompt of each context length (a chunked
prefill's most expensive chunk) on a Llama-3-8B-like layer (32 query heads,
8 kv heads, head_dim 128, page 16, float32) and reports the peak of what
NumPy allocated during the call (``tracemalloc``, which NumPy reports its
buffers to), beside the bound.
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

import numpy as np

from paged_np.attention.numba_prefill import K_TILE, Q_TILE, attend_sequence

H, HKV, D, PAGE, N_Q = 32, 8, 128, 16, 128


def bound_bytes(n_keys: int, n_q: int = N_Q, group: int = H // HKV, head_dim: int = D) -> int:
    """The workspace bound of the module docstring, in bytes."""
    return 4 * (min(n_q, Q_TILE) * group * min(n_keys, K_TILE) + 3 * n_keys * head_dim
                + 4 * n_q * group * head_dim)


def measure(context: int, n_q: int = N_Q) -> int:
    """Peak bytes NumPy allocated inside one attend_sequence call."""
    rng = np.random.default_rng(0)
    n_pages = -(-context // PAGE)
    k = rng.standard_normal((n_pages, HKV, PAGE, D), dtype=np.float32)
    v = rng.standard_normal((n_pages, HKV, PAGE, D), dtype=np.float32)
    bt = rng.permutation(n_pages).astype(np.int32)
    q = rng.standard_normal((n_q, H, D), dtype=np.float32)
    out = np.zeros((n_q, H, D), np.float32)
    lse = np.zeros((n_q, H), np.float32)
    attend_sequence(q, k, v, bt, context, 0, n_q, D**-0.5, 0, out, lse)   # compile first
    tracemalloc.start()
    attend_sequence(q, k, v, bt, context, 0, n_q, D**-0.5, 0, out, lse)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    contexts = (2048, 8192) if args.quick else (2048, 8192, 32768)
    mib = 2.0**20
    lines = ["# Prefill workspace per call", "",
             f"`python benchmarks/prefill_memory.py`: the last {N_Q}-query chunk of a prompt, "
             f"{H} query heads / {HKV} kv heads, head_dim {D}, page {PAGE}, float32. "
             "*Peak*: the most NumPy held at once during the call (tracemalloc); *bound*: "
             "`4 B * (min(n_q, Q_TILE) * G * min(n_keys, K_TILE) + 3 * n_keys * head_dim "
             "+ 4 * n_q * G * head_dim)`.",
             "",
             "| context | peak MiB | bound MiB | peak / bound |", "|---|---|---|---|"]
    for ctx in contexts:
        peak, bound = measure(ctx), bound_bytes(ctx)
        lines.append(f"| {ctx:,} | {peak / mib:.1f} | {bound / mib:.1f} | {peak / bound:.2f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.quick:
        (Path(__file__).parent / "prefill_memory.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
