"""A narrated tour of the paged KV cache: ``python -m paged_np walkthrough``.

Eight steps on a 16-page cache (page_size 4). Requests share a system prompt,
one forks for parallel sampling, requests finish and leave their pages
CACHED, and a long prompt then forces LRU eviction. Each step prints what
happened and the state of every page; the arena is drawn after each step into
``paged_np_out/walkthrough.png`` (or ``--out PATH``).

Nothing here is special-cased: the tour only calls the public cache API, and
``check_invariants()`` runs after every step.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ..cache.kv_cache import PagedKVCache
from ..config import CacheConfig
from . import DEFAULT_OUT, make_parent

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]  # an 8-token system prompt: two full pages


def _fill(cache: PagedKVCache, sid, token_ids) -> None:
    """Compute tokens: slots, (fake) K/V written in every layer, then append."""
    slots = cache.allocate_slots(sid, len(token_ids))
    cfg = cache.cfg
    kv = np.full((len(token_ids), cfg.num_kv_heads, cfg.head_dim), 1.0, dtype=np.float32)
    for layer in range(cfg.num_layers):
        cache.write_kv(layer, slots, kv, kv)
    cache.append_tokens(sid, token_ids)


def _row(cache: PagedKVCache) -> str:
    s = cache.stats()
    return (f"free {s['num_free']:>2}  cached {s['num_cached']:>2}  in use {s['num_in_use']:>2}"
            f"  | hits {s['hits']:>2}/{s['queries']:<3} evictions {s['evictions']}"
            f"  cow {s['cow_copies']}")


def _tables(cache: PagedKVCache) -> str:
    return "\n".join(f"      {sid!s:>3}: block table {cache.block_table(sid).tolist()}"
                     f"  ({cache.num_computed_tokens(sid)} tokens)" for sid in cache.seq_ids)


def run(out: str | None = DEFAULT_OUT["walkthrough"], quiet: bool = False) -> PagedKVCache:
    """Play the tour; return the final cache. ``out=None`` draws nothing."""
    cache = PagedKVCache(CacheConfig(num_pages=16, page_size=4, num_layers=1, num_kv_heads=1,
                                     head_dim=4))
    say = (lambda *a: None) if quiet else print
    steps = []  # (title, action)

    def step(title):
        def deco(fn):
            steps.append((title, fn))
            return fn
        return deco

    @step("A arrives: system prompt + question (11 tokens -> 3 pages)")
    def _():
        n_hit = cache.add_sequence("A", SYSTEM + [21, 22, 23])
        _fill(cache, "A", (SYSTEM + [21, 22, 23])[n_hit:])
        return f"A reused {n_hit} tokens; its two full pages are hashed and findable"

    @step("B arrives with the same system prompt: prefix hit")
    def _():
        n_hit = cache.add_sequence("B", SYSTEM + [31, 32])
        _fill(cache, "B", (SYSTEM + [31, 32])[n_hit:])
        return f"B reused {n_hit} tokens: A's first two pages now have ref_count 2"

    @step("A forks A2 (parallel sampling); each writes one token")
    def _():
        cache.fork("A", "A2")
        _fill(cache, "A", [41])
        _fill(cache, "A2", [42])
        return "A's last page was shared and partly full: writing copied it (copy-on-write)"

    @step("A and A2 finish")
    def _():
        cache.tick()
        cache.free("A")
        cache.free("A2")
        return ("their own last pages are full and hashed, so CACHED; the system-prompt "
                "pages stay in use: B holds them")

    @step("B generates 7 more tokens, then finishes")
    def _():
        _fill(cache, "B", [33, 34, 35, 36, 37, 38, 39])
        cache.tick()
        cache.free("B")
        return "B's full pages become CACHED, tail first: its last page will be evicted first"

    @step("C: a long prompt (44 tokens -> 11 pages) squeezes the cache")
    def _():
        prompt = list(range(100, 144))
        n_hit = cache.add_sequence("C", prompt)
        _fill(cache, "C", prompt[n_hit:])
        return "no FREE page left for all of C: the LRU list gave up its oldest cached pages"

    @step("D arrives with the system prompt again")
    def _():
        n_hit = cache.add_sequence("D", SYSTEM + [51, 52])
        _fill(cache, "D", (SYSTEM + [51, 52])[n_hit:])
        return f"D reused {n_hit} tokens: the prefix pages were released last, so they survived"

    @step("C and D finish: everything they computed is cached for the next request")
    def _():
        cache.tick()
        cache.free("C")
        cache.free("D")
        return "LRU order (next victim first): " + str(cache.pool.eviction_order())

    fig = axes = None
    if out:
        from ..viz import arena as viz

        plt = viz.pyplot()
        fig, axes = plt.subplots(len(steps), 1, figsize=(11, 1.15 * len(steps) + 0.6))
    for i, (title, action) in enumerate(steps, 1):
        note = action()
        cache.check_invariants()
        say(f"\n[{i}] {title}\n    -> {note}\n    {_row(cache)}")
        if cache.seq_ids:
            say(_tables(cache))
        if out:
            viz.draw_arena(cache, ax=axes[i - 1], title=f"[{i}] {title}")
    if out:
        viz.add_state_legend(fig)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(make_parent(out), dpi=110)
        plt.close(fig)
        say(f"\nwrote {out}")
    return cache


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paged_np walkthrough",
                                 description="A narrated tour of the paged KV cache.")
    ap.add_argument("--out", default=DEFAULT_OUT["walkthrough"],
                    help=f"where to draw the arena (default {DEFAULT_OUT['walkthrough']})")
    args = ap.parse_args(argv)
    run(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
