"""``python -m paged_np simulate``: the memory simulations, from the command line.

::

    python -m paged_np simulate --quick                  # the vLLM paper's figures, small
    python -m paged_np simulate --json out.json --plot out.png --seed 0
    python -m paged_np simulate --prefix-cache --json p.json --markdown p.md
    python -m paged_np simulate --quick --kv-cache-dtype int8  # 1.94x the tokens in 12 GiB

Without ``--prefix-cache`` it runs :func:`paged_np.sim.simulate.run` (where
KV memory goes: contiguous reservation vs pages, sharing, eviction policies)
and prints :func:`paged_np.sim.plot.report`; with it,
:func:`paged_np.sim.prefix.run` (hash chain vs radix tree, fcfs vs lpm,
served by the engine's own scheduler) and its table. This module only
parses and writes files: the simulations are the library's, in
:mod:`paged_np.sim`, which never imports this one.
"""

from __future__ import annotations

import argparse
import json
import time

from ..registry import KV_FORMATS


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m paged_np simulate",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--plot", metavar="PATH", help="draw the figures (PNG)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small traces: well under a minute")
    ap.add_argument("--prefix-cache", action="store_true",
                    help="instead: hash chain vs radix tree, fcfs vs lpm (see sim/prefix.py)")
    ap.add_argument("--tiers", action="store_true",
                    help="instead: hit rate and prefill saved against the size of a host "
                         "tier below the arena (see sim/tiers.py)")
    ap.add_argument("--markdown", metavar="PATH",
                    help="--prefix-cache or --tiers: write the table here")
    ap.add_argument("--kv-cache-dtype", default="float16", choices=KV_FORMATS,
                    help="the KV format of the memory breakdown's 12 GiB (default float16, "
                         "the paper's): it sets the bytes of a page and so the token slots")
    return ap.parse_args(argv)


def write_json(res: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def run_table(args, module) -> int:
    """Run one simulation module (``run(seed)``, ``report(res)``): print its table, and
    write the JSON (``--json``) and the table (``--markdown``) where asked."""
    t0 = time.perf_counter()
    res = module.run(args.seed)
    table = module.report(res)
    print(table)
    print(f"({time.perf_counter() - t0:.1f} s)")
    write_json(res, args.json)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0


def prefix_cache(args) -> int:
    """``--prefix-cache``: every workload, page size, cache size, index and schedule."""
    from ..sim import prefix

    return run_table(args, prefix)


def tiers(args) -> int:
    """``--tiers``: the chat and system-prompt traces against host tier sizes."""
    from ..sim import tiers as sim_tiers

    return run_table(args, sim_tiers)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.prefix_cache:
        return prefix_cache(args)
    if args.tiers:
        return tiers(args)
    from ..sim import simulate
    from ..sim.plot import plot_all, report

    t0 = time.perf_counter()
    for fmt in KV_FORMATS:                       # each format's page, and the slots it leaves
        print(f"{fmt:>9}: {simulate.page_bytes(fmt):>9,} bytes per 16-token page of OPT-13B,"
              f" {simulate.kv_slots(fmt):>6,} token slots in 12 GiB"
              + ("   <- this run" if fmt == args.kv_cache_dtype else ""))
    res = simulate.run(args.seed, args.quick, kv_cache_dtype=args.kv_cache_dtype)
    print(report(res))
    print(f"({time.perf_counter() - t0:.1f} s)")
    write_json(res, args.json)
    if args.plot:
        plot_all(res).savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0
