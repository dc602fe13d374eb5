"""Cost per page-pool operation at 1K .. 1M pages: how it grows with the pool.

    python benchmarks/pool_ops.py            # writes benchmarks/pool_ops.md
    python benchmarks/pool_ops.py --quick    # 1K and 100K only

Three operations, each timed over many repetitions on a pool of ``N`` pages:

- ``alloc+free``: take a FREE page and give it back;
- ``prefix hit``: find a CACHED page by hash, take it (it leaves the eviction
  order), release it (it goes back to the young end). Hits go to a hot set of
  1,024 prefixes, as a server's hits go to its popular system prompts, while
  the other pages sit in the pool;
- ``eviction``: with no FREE page, allocation evicts the policy's victim;
  the page is then registered under a new hash and released (CACHED again).

It measures and asserts nothing (timings do not belong in tests); the
``max/min`` column is the check to read. An O(n) step anywhere (a
``list.remove``, a scan) would make the 1M column 1000x the 1K column.
Python's own costs grow with N too: an eviction touches the coldest entry
of million-entry dicts, which is a cache miss, not an O(n) step. The last
row times that floor alone: a bare ``OrderedDict`` taking its oldest entry
and inserting a new one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from paged_np import PagePool
from paged_np.cache import HashIndex


def _hash(i: int) -> bytes:
    return i.to_bytes(32, "little")


def _cached_pool(n: int, policy: str) -> PagePool:
    """A pool whose every page is CACHED, page i under hash i."""
    pool = PagePool(n, 16, HashIndex(16, policy))
    pages = pool.allocate_many(n)
    for i, p in enumerate(pages):
        pool.prefix_index.register(p, _hash(i), (i,))
    for p in pages:
        pool.free(p)
    return pool


def _time(fn, reps: int) -> float:
    """Best of 3 runs of ``fn(reps)``, in nanoseconds per repetition."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn(reps)
        best = min(best, time.perf_counter() - t0)
    return best / reps * 1e9


def bench(n: int, policy: str, reps: int = 20_000) -> dict:
    pool = PagePool(n, 16, HashIndex(16, policy))
    held = pool.allocate_many(n // 2)  # a half-full pool, not a fresh one

    def alloc_free(k):
        for _ in range(k):
            pool.free(pool.allocate())

    row = {"alloc+free": _time(alloc_free, reps)}
    for p in held:
        pool.free(p)

    pool = _cached_pool(n, policy)
    hot = min(n, 1024)

    def hits(k):
        for i in range(k):
            p = pool.prefix_index.lookup(_hash(i % hot))
            pool.touch(p)
            pool.free(p)

    row["prefix hit"] = _time(hits, reps)

    fresh = iter(range(n, 10**12))

    def evictions(k):
        for _ in range(k):
            p = pool.allocate()  # no page is FREE: evicts
            pool.prefix_index.register(p, _hash(next(fresh)), (0,))
            pool.free(p)

    row["eviction"] = _time(evictions, reps)
    return row


def bench_floor(n: int, reps: int = 20_000) -> float:
    """ns per (pop oldest + insert new) on a bare OrderedDict of n hash-keyed entries."""
    from collections import OrderedDict

    od = OrderedDict.fromkeys(_hash(i) for i in range(n))
    fresh = iter(range(n, 10**12))

    def churn(k):
        for _ in range(k):
            od.popitem(last=False)
            od[_hash(next(fresh))] = None

    return _time(churn, reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1K and 100K pages only")
    ap.add_argument("--out", default=str(Path(__file__).with_name("pool_ops.md")))
    args = ap.parse_args(argv)
    sizes = [1_000, 100_000] if args.quick else [1_000, 10_000, 100_000, 1_000_000]
    ops = ["alloc+free", "prefix hit", "eviction"]
    lines = ["| policy | operation | " + " | ".join(f"{n:,} pages" for n in sizes)
             + " | max/min |", "|---" * (len(sizes) + 3) + "|"]
    for policy in ("lru", "fifo", "lfu"):
        rows = []
        for n in sizes:
            print(f"{policy}: {n:>9,} pages ...", file=sys.stderr, flush=True)
            rows.append(bench(n, policy))
        for op in ops:
            costs = [r[op] for r in rows]
            lines.append(f"| {policy} | {op} | " + " | ".join(f"{c:,.0f} ns" for c in costs)
                         + f" | {max(costs) / min(costs):.2f}x |")
    floor = [bench_floor(n) for n in sizes]
    lines.append("| (floor) | bare OrderedDict: pop oldest + insert | "
                 + " | ".join(f"{c:,.0f} ns" for c in floor)
                 + f" | {max(floor) / min(floor):.2f}x |")
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        import platform

        Path(args.out).write_text(
            "# Page-pool cost per operation\n\n"
            f"`python benchmarks/pool_ops.py` on {platform.machine()} "
            f"({platform.python_implementation()} {platform.python_version()}), "
            "best of 3 x 20,000 repetitions.\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
