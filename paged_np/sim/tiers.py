"""How much a tier below the arena saves: hit rate and prefill tokens against its size.

Run it::

    python -m paged_np simulate --tiers                  # a few seconds
    python -m paged_np simulate --tiers --markdown out.md

The ``chat`` and ``system`` traces of :mod:`.prefix` (multi-turn conversations,
each turn resending the whole conversation; a few long system prompts shared by
many short questions) are served by the engine with its model taken out
(:func:`.prefix.serve`), in an arena of a tenth of the trace's distinct tokens,
with a host tier of 0, 1, 2, 4 and 8 times the arena's pages
(``host_cache_memory``). A page the arena evicts goes to the tier; a prompt that
misses the arena but finds its next pages there reads them back, so they count
as hits and are not prefilled. Reported per size: the prompt hit rate (arena and
tier), the prefill tokens and the share of them the tier saved, and the tokens
the tier served.

A disk tier of the same size behaves the same here (the simulation counts
tokens, not seconds); with both, a page the host tier evicts goes to disk, so
what is kept is about the two sizes together. What reading back costs against
recomputing is measured in ``benchmarks/kv_tiers.md`` and notebook 12.
"""

from __future__ import annotations

from .prefix import FRACTIONS, MAX_RUNNING, distinct_tokens, make_traces, serve

WORKLOADS = ("chat", "system")
#: Host tier sizes, in multiples of the arena's pages.
MULTIPLES = (0, 1, 2, 4, 8)
PAGE_SIZE = 16


def run(seed: int = 0, workloads=WORKLOADS, multiples=MULTIPLES,
        fraction: float = FRACTIONS[0]) -> dict:
    """One row per (workload, host tier size); the JSON's contents."""
    from ..engine.config import EngineConfig
    from .trace_engine import stand_in_model

    traces = make_traces(seed)
    model_cfg = stand_in_model().cfg
    rows = []
    for name in workloads:
        trace, parent = traces[name]
        biggest = max(r.total_len for r in trace)
        pages = max(int(fraction * distinct_tokens(trace, PAGE_SIZE)) // PAGE_SIZE,
                    2 * (-(-biggest // PAGE_SIZE)))
        per_page = EngineConfig(page_size=PAGE_SIZE).cache_config(model_cfg).bytes_per_page
        base = None
        for m in multiples:
            tier = {"host_cache_memory": m * pages * per_page} if m else {}
            res = serve(trace, parent, "hash", "fcfs", pages, PAGE_SIZE, MAX_RUNNING, **tier)
            base = res["prefill_tokens"] if base is None else base
            host = res["tiers"].get("host", {})
            rows.append({"workload": name, "arena_pages": pages, "host_multiple": m,
                         "host_pages": m * pages, "hit_rate": res["hit_rate"],
                         "prefill_tokens": res["prefill_tokens"],
                         "prefill_saved": 1 - res["prefill_tokens"] / base if base else 0.0,
                         "tier_tokens": host.get("loaded_tokens", 0),
                         "preemptions": res["preemptions"]})
    return {"seed": seed, "page_size": PAGE_SIZE, "arena_fraction": fraction, "rows": rows}


def report(res: dict) -> str:
    """The rows as a Markdown table."""
    lines = ["| workload | arena pages | host tier (x arena) | hit rate | prefill tokens | "
             "prefill saved | tokens from the tier |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['workload']} | {r['arena_pages']:,} | {r['host_pages']:,} "
                     f"({r['host_multiple']}x) | {r['hit_rate']:.1%} | "
                     f"{r['prefill_tokens']:,} | {r['prefill_saved']:.1%} | "
                     f"{r['tier_tokens']:,} |")
    return "\n".join(lines)
