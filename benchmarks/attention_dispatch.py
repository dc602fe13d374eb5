"""The fixed cost of one ``paged_attention`` call, and what metadata built once per step saves.

Run from the repository root::

    python benchmarks/attention_dispatch.py

A model calls ``paged_attention`` once per layer (30 times a token for
SmolLM2-135M). At batch 1 the arithmetic of a layer is tiny, so what a call
costs before and after the kernel decides the speed. This script times, on the
calling thread, for two shapes (a SmolLM2-135M decode layer at context 300,
and the kernel bench's batch of 8 at a one-page context):

- *plain call*: ``paged_attention(q, k, v, block_tables, seq_lens, qsl)``:
  validation, planning and the kernel, every call;
- *with metadata*: ``paged_attention(q, k, v, metadata=meta)`` with ``meta``
  built once (what the model does): only q and the pages are checked, and the
  numba backend reuses its plan;
- *with metadata, Numba's threads*: the same with ``threads="numba"`` in the
  metadata, as the quantized model builds it: the items run on Numba's OpenMP
  workers from ``numba_plan.MIN_BYTES_PER_NUMBA_THREAD`` of reads, where Python's
  threads (the default) join only from ``MIN_BYTES_PER_THREAD`` (2 MiB, so
  these calls run on the calling thread);
- the parts: validating the whole call, building the metadata, planning the
  kernel's work (``numba_plan.make_plan``), and the jitted item loop alone, on one
  thread and on Numba's threads.

Then a SmolLM2-135M *verify* layer (one sequence, 9 queries: 1 + 8 drafts, at
context 300), the jitted item loop alone: on one thread, and on two of Numba's
threads with the queries cut into tiles of 9, 5 and 1 (the plan picks 5, see
``numba_plan.choose_verify_tile``). Every variant is checked to give the same
bits.

Prints markdown tables; ``docs/concepts/kernels.md`` and ``numba_plan`` quote them.
"""

from __future__ import annotations

import sys
import time

import numba
import numpy as np

from paged_np.attention import (
    AttentionMetadata,
    numba_cpu,
    numba_plan,
    paged_attention,
    validate_paged_attention_inputs,
)


def case(batch, num_heads, num_kv_heads, head_dim, ctx, page_size=16, seed=0):
    rng = np.random.default_rng(seed)
    n_pages = -(-ctx // page_size)
    k = rng.standard_normal((batch * n_pages, num_kv_heads, page_size, head_dim),
                            dtype=np.float32)
    v = rng.standard_normal(k.shape, dtype=np.float32)
    tables = rng.permutation(batch * n_pages).reshape(batch, n_pages).astype(np.int32)
    q = rng.standard_normal((batch, num_heads, head_dim), dtype=np.float32)
    return q, k, v, tables, np.full(batch, ctx, np.int32), np.arange(batch + 1, dtype=np.int32)


def best_us(fn, n=300, rounds=5):
    """Best mean over ``rounds`` runs of ``n`` calls, in microseconds."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def measure(q, k, v, bt, sl, qsl):
    P, Hkv, H, D = k.shape[2], k.shape[1], q.shape[1], q.shape[2]
    meta = AttentionMetadata.build(bt, sl, qsl, num_pages=k.shape[0], page_size=P)
    numba_meta = AttentionMetadata.build(bt, sl, qsl, num_pages=k.shape[0], page_size=P,
                                         threads="numba")
    args = validate_paged_attention_inputs(q, k, v, bt, sl, qsl)
    sl64, qsl64 = sl.astype(np.int64), qsl.astype(np.int64)
    plan = numba_plan.make_plan(sl64, qsl64, H, Hkv, P, k.itemsize, D, 0, threads="numba")
    q2 = q * np.float32(0.1)
    out, lse = np.zeros(q.shape, np.float32)[None], np.zeros(q.shape[:2], np.float32)[None]
    items, rows = plan.items, plan.q_tile * (H // Hkv)
    return {
        "plain call": best_us(lambda: paged_attention(q, k, v, bt, sl, qsl, backend="numba")),
        "with metadata (Python threads, the default)": best_us(
            lambda: paged_attention(q, k, v, metadata=meta, backend="numba")),
        "with metadata, Numba's threads (the quantized model's)": best_us(
            lambda: paged_attention(q, k, v, metadata=numba_meta, backend="numba")),
        "validate (whole call)": best_us(lambda: validate_paged_attention_inputs(*args[:6])),
        "build metadata": best_us(lambda: AttentionMetadata.build(
            bt, sl, qsl, num_pages=k.shape[0], page_size=P)),
        "plan (make_plan)": best_us(lambda: numba_plan.make_plan(
            sl64, qsl64, H, Hkv, P, k.itemsize, D, 0)),
        "jitted item loop alone, one thread": best_us(lambda: numba_cpu._run_items(
            q2, k, v, bt, sl64, qsl64, items, 0, len(items), rows, 0, out, lse,
            plan.heads_per_item, None, None)),
        "jitted item loop on Numba's threads": best_us(lambda: numba_cpu._attend_items(
            q2, k, v, bt, sl64, qsl64, items, plan.num_threads, rows, 0, out, lse,
            plan.heads_per_item, None, None, "numba")),
    }, (numba_plan.make_plan(sl64, qsl64, H, Hkv, P, k.itemsize, D, 0).num_threads,
        plan.num_threads)


def verify_tiles() -> dict:
    """A 9-query verify layer's item loop: one thread, then two threads and query tiles."""
    q, k, v, bt, _, _ = case(1, 9, 3, 64, 309)
    q = np.random.default_rng(1).standard_normal((9, 9, 64), dtype=np.float32)
    sl, qsl = np.array([309], np.int64), np.array([0, 9], np.int64)
    G, P, D = 3, k.shape[2], 64
    res, want = {}, None
    variants = [("one thread, one tile of 9 queries", 1, 9)] + [
        (f"two threads, tiles of {t} queries", 2, t) for t in (9, 5, 1)]
    for name, threads, tile in variants:
        plan = numba_plan.make_plan(sl, qsl, 9, 3, P, 4, D, 0, num_threads=threads,
                                    num_splits=1, q_tile=tile)
        out = np.zeros((1, 9, 9, D), np.float32)
        lse = np.zeros((1, 9, 9), np.float32)
        args = (q, k, v, bt, sl, qsl, plan.items, threads, tile * G, 0, out, lse,
                plan.heads_per_item, None, None, "numba")
        res[name] = best_us(lambda args=args: numba_cpu._attend_items(*args))
        want = out.copy() if want is None else want
        assert np.array_equal(out, want), name                    # the same bits
    return res


def main(argv) -> int:
    shapes = {
        "SmolLM2-135M decode layer (B=1, heads 9/3, head_dim 64, context 300)":
            case(1, 9, 3, 64, 300),
        "kernel bench's dispatch case (B=8, heads 32/8, head_dim 128, context 16)":
            case(8, 32, 8, 128, 16),
    }
    print(f"{numba.get_num_threads()} Numba threads available; microseconds per call, best "
          f"of 5 runs of 300 calls.\n")
    rows, names = {}, list(shapes)
    for name, arrays in shapes.items():
        rows[name], (python, on_numba) = measure(*arrays)
        print(f"- {name}: the plan runs it on {python} Python thread(s), or on {on_numba} of "
              f"Numba's")
    print("\n| part | " + " | ".join(f"case {i + 1} us" for i in range(len(names))) + " |")
    print("|---|" + "---|" * len(names))
    for part in rows[names[0]]:
        print(f"| {part} | " + " | ".join(f"{rows[n][part]:.0f}" for n in names) + " |")
    print("\nSmolLM2-135M verify layer (B=1, 9 queries, heads 9/3, head_dim 64, context 300), "
          "the jitted item loop:\n\n| variant | us |\n|---|---|")
    for name, us in verify_tiles().items():
        print(f"| {name} | {us:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
