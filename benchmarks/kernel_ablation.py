"""Where decode's time goes, part by part, and what each trick of the kernel buys.

Run from the repository root::

    python benchmarks/kernel_ablation.py                 # the code Numba makes for this CPU
    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= python benchmarks/kernel_ablation.py  # AVX2 code
    NUMBA_NUM_THREADS=1 python benchmarks/kernel_ablation.py --ctx 128  # from cache, one core

The case is the bench's decode step (``paged_np.cli.bench``: batch 8, 32 query
heads on 8 kv heads, head_dim 128, pages of 16, shuffled) at context 2048, or
``--ctx N``: at 128 the 8 MiB of K/V stay in the last-level cache, so on one
thread the rows show what the arithmetic costs with little waiting on memory. The
script rebuilds the kernel's item loop (``numba_cpu._attend_item``, decode
only) from the same helpers of ``numba_kernels``, with switches: which parts
run (the score tile, the softmax's ``exp2`` without and with the rescaling of
the accumulator, the value accumulation), whether the next page is prefetched,
and which score tile (four rows x four keys or four rows x two keys). Every
variant runs on all Numba threads, items dealt as the kernel deals them, and
all are timed in alternation (best of several rounds), so their ratios hold on
a noisy machine. *dispatch* is ``numba_cpu.forward`` on a one-page context:
planning, the thread pool and the call, with almost no arithmetic.

Prints a markdown table; ``docs/concepts/kernels.md`` quotes it.
"""

from __future__ import annotations

import functools
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit

from paged_np.attention import numba_cpu
from paged_np.attention import numba_kernels as nk
from paged_np.attention import numba_kt as kt_kernels
from paged_np.cli.bench import HKV, PAGE, B, D, H, isa_info, make_decode_case, paged_reader

CTX = 2048  # the default context; --ctx N for another
G = H // HKV
SCORES, SOFTMAX, RESCALE, PV = 1, 2, 4, 8
ALL = SCORES | SOFTMAX | RESCALE | PV


@njit(nogil=True, fastmath=True)
def _items(q2, kp, vp, bt, w0, w1, n_kv, parts, prefetch, four_keys, kt):
    """Decode items ``w0:w1`` (item = sequence, group of ``n_kv`` kv heads), parts chosen;
    ``kt``: K pages transposed, scored by ``numba_kt.tile_scores_kt``, values by
    ``numba_kt.accumulate_pv_kt``."""
    P = vp.shape[2]
    KB = max(1, 128 // P) * P  # keys per softmax block, as numba_cpu.BLOCK_KEYS
    RT = n_kv * G
    qt = np.empty((RT, D), np.float32)
    qtt = np.empty((D, RT), np.float32)
    scratch = np.empty(nk.LANES + RT, np.float32)  # the softmax's lane sums and maxima
    kw = np.empty((1, 1, D, P), np.float32)  # transposed K pages widened (float16)
    vw = np.empty((1, 1, P, D), np.float32)
    s = np.ones((RT, KB), np.float32)
    m = np.empty(RT, np.float32)
    l = np.empty(RT, np.float32)
    acc = np.zeros((RT, D if parts & RESCALE else 0), np.float32)
    acc_pv = np.zeros((RT, D), np.float32)
    n_pages = bt.shape[1]
    per_seq = HKV // n_kv
    for w in range(w0, w1):
        b, kvh0 = w // per_seq, (w % per_seq) * n_kv
        for rt in range(RT):
            h, g = rt // G, rt % G
            m[rt] = nk.EMPTY
            l[rt] = 0.0
            for d in range(D):
                qt[rt, d] = q2[b, (kvh0 + h) * G + g, d]
                qtt[d, rt] = qt[rt, d]
        PB = KB // P
        for blk in range(0, n_pages, PB):
            blk_hi = min(blk + PB, n_pages)
            n = (blk_hi - blk) * P
            if parts & SCORES:
                for j in range(blk, blk_hi):
                    nxt = bt[b, j + 1] if prefetch and j + 1 < n_pages else -1
                    for h in range(n_kv):
                        if kt:
                            kt_kernels.tile_scores_kt(qt, qtt, kp, bt[b, j], kvh0 + h, s, h * G,
                                                      (h + 1) * G, (j - blk) * P, P, nxt, kw)
                        elif four_keys:
                            nk.tile_scores_4x4(qt, kp, bt[b, j], kvh0 + h, s, h * G,
                                               (h + 1) * G, (j - blk) * P, P, nxt)
                        else:
                            nk.tile_scores_4x2(qt, kp, bt[b, j], kvh0 + h, s, h * G,
                                               (h + 1) * G, (j - blk) * P, P, nxt)
            if parts & SOFTMAX:
                nk.online_softmax(s, m, l, acc, RT, n, scratch)
            if parts & PV:
                for j in range(blk, blk_hi):
                    nxt = bt[b, j + 1] if prefetch and j + 1 < n_pages else -1
                    for h in range(n_kv):
                        if kt:
                            kt_kernels.accumulate_pv_kt(s, vp, bt[b, j], kvh0 + h, acc_pv,
                                                        h * G, (h + 1) * G, (j - blk) * P, P,
                                                        nxt, vw)
                        else:
                            nk.accumulate_pv(s, vp, bt[b, j], kvh0 + h, acc_pv, h * G,
                                             (h + 1) * G, (j - blk) * P, P, nxt)
    return acc_pv[0, 0] + acc[0, 0] if acc.shape[1] else acc_pv[0, 0]


def variant(case, parts=ALL, prefetch=True, n_kv=2, four_keys=True, kt=False):
    """A function that runs one decode step's items with these switches on all threads."""
    q, k, v, bt = case[:4]
    if kt:  # the same keys, each K page [D, page]
        k = np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    if k.dtype == np.float16:
        k, v = k.view(np.uint16), v.view(np.uint16)
    q2 = (q * np.float32(D**-0.5 * nk.LOG2E)).astype(np.float32)
    threads = numba.get_num_threads()
    n_items = B * HKV // n_kv
    cuts = np.linspace(0, n_items, threads + 1).astype(int)
    pool = ThreadPoolExecutor(max(1, threads - 1))
    args = (q2, k, v, bt)
    tail = (n_kv, parts, prefetch, four_keys, kt)

    def run():
        fs = [pool.submit(_items, *args, cuts[i], cuts[i + 1], *tail) for i in range(1, threads)]
        _items(*args, cuts[0], cuts[1], *tail)
        for f in fs:
            f.result()

    return run


def best_alternating(fns: dict, rounds: int = 5, repeat: int = 5) -> dict:
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()  # compile, first touch
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main(argv) -> int:
    dtype = np.float16 if "--f16" in argv else np.float32
    ctx = int(argv[argv.index("--ctx") + 1]) if "--ctx" in argv else CTX
    case = make_decode_case(ctx, dtype)
    small = make_decode_case(PAGE, dtype)
    four = nk.vector_registers() == 32  # the kernel's own choice of score tile
    fwd = functools.partial(numba_cpu.forward, *case, D**-0.5, 0, False)
    case_t = make_decode_case(ctx, dtype, kv_layout="k_transposed")
    fns = {
        "kernel (numba_cpu.forward)": fwd,
        "kernel, K transposed (kv_layout='k_transposed')": functools.partial(
            numba_cpu.forward, *case_t, D**-0.5, 0, False, kv_layout="k_transposed"),
        "paged read (sum of the same tiles)": paged_reader(*case[1:4]),
        "rebuilt item loop, all parts": variant(case, four_keys=four),
        "score tile only": variant(case, SCORES, four_keys=four),
        "exp2 only (softmax, no rescale)": variant(case, SOFTMAX),
        "exp2 + rescale of acc": variant(case, SOFTMAX | RESCALE),
        "value accumulation only": variant(case, PV),
        "all parts, no prefetch": variant(case, prefetch=False, four_keys=four),
        "all parts, one-head items": variant(case, n_kv=1, four_keys=four),
        "all parts, score tile 4 rows x 4 keys": variant(case, four_keys=True),
        "all parts, score tile 4 rows x 2 keys": variant(case, four_keys=False),
        "K transposed: all parts": variant(case, kt=True),
        "K transposed: score tile only": variant(case, SCORES, kt=True),
        "K transposed: value accumulation (vectors) only": variant(case, PV, kt=True),
        "K transposed: all parts, no prefetch": variant(case, prefetch=False, kt=True),
        "dispatch (forward on a 1-page context)": functools.partial(
            numba_cpu.forward, *small, D**-0.5, 0, False),
    }
    best = best_alternating(fns)
    isa = isa_info()
    gb = 2 * B * HKV * ctx * D * np.dtype(dtype).itemsize / 1e9
    print(f"{isa['codegen']} code on {isa['cpu']} (Numba target `{isa['numba_cpu_name']}`), "
          f"{numba.get_num_threads()} threads; decode {np.dtype(dtype).name}, context {ctx}, "
          f"B={B}, heads {H}/{HKV}, head_dim {D}, page {PAGE}; kernel's score tile: "
          f"{'4x4' if four else '4x2'}.\n")
    print("| variant | ms | K/V GB/s |\n|---|---|---|")
    for name, t in best.items():
        print(f"| {name} | {t * 1e3:.2f} | {gb / t:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
