"""The cache's public ways to be watched: ``add_listener`` (every event, nothing kept) and
``Sequence.num_released_pages``."""

from __future__ import annotations

import numpy as np
import pytest

import paged_np as pnp
from paged_np.cache.events import KINDS


def fill(cache, sid, prompt):
    n_hit = cache.add_sequence(sid, prompt)
    n = len(prompt) - n_hit
    slots = cache.allocate_slots(sid, n)
    kv = np.ones((n, 1, 8), np.float32)
    cache.write_kv(0, slots, kv, kv)
    cache.append_tokens(sid, prompt[n_hit:])


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_a_listener_sees_every_event_and_the_log_stays_empty(prefix_cache):
    cfg = pnp.CacheConfig(num_pages=4, page_size=4, num_layers=1, num_kv_heads=1, head_dim=8,
                          prefix_cache=prefix_cache)
    logged = pnp.PagedKVCache(cfg, record_events=True)     # the same run, logged
    cache = pnp.PagedKVCache(cfg, record_events=False)
    seen = []
    cache.add_listener(seen.append)
    for c in (logged, cache):
        fill(c, "a", list(range(1, 10)))                   # 3 pages, 2 full
        c.tick()
        c.free("a")
        fill(c, "b", list(range(1, 6)) + list(range(50, 60)))   # a hit, then an eviction
    assert cache.events == []                              # nothing kept
    assert seen == logged.events
    assert {e.kind for e in seen} >= {"allocate", "hit", "cache", "free", "evict"}
    assert {e.kind for e in seen} <= set(KINDS)
    cache.remove_listener(seen.append)
    assert cache.listeners == ()
    n = len(seen)
    cache.free("b")
    assert len(seen) == n                                  # removed: told nothing more


def test_no_listener_and_no_log_build_no_event():
    cfg = pnp.CacheConfig(num_pages=4, page_size=4, num_layers=1, num_kv_heads=1, head_dim=8)
    cache = pnp.PagedKVCache(cfg, record_events=False)
    fill(cache, "a", [1, 2, 3, 4, 5])
    assert cache.events == [] and cache.listeners == ()


def test_num_released_pages_counts_leading_minus_ones():
    cfg = pnp.CacheConfig(num_pages=8, page_size=2, num_layers=1, num_kv_heads=1, head_dim=8)
    cache = pnp.PagedKVCache(cfg)
    fill(cache, "a", list(range(1, 10)))                   # 5 pages
    assert cache.sequence("a").num_released_pages == 0
    assert cache.release_pages_before("a", 6) == 3
    assert cache.sequence("a").num_released_pages == cache.num_released_pages("a") == 3
    cache.check_invariants()
