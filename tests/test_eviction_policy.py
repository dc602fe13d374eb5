"""A fourth eviction policy written from the abstract base alone runs the cache.

The policy below (most recently cached goes first, MRU) is one ``priority`` method
of :class:`paged_np.EvictionPolicy`. The tests check that the pool evicts exactly
the page MRU picks, that the cache keeps its invariants and its K/V under it, that
the base class refuses a policy without ``priority``, and that MRU, FIFO and LFU
rank the radix tree's leaves too, never evicting a locked one.
"""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import add_and_fill, extend, read_kv, small_cache, token_kv

import paged_np as pnp
from paged_np.cache import HashIndex


class MRUPolicy(pnp.EvictionPolicy):
    """Most recently used goes first: the newest stamp has the smallest key."""

    name = "mru"

    def priority(self, entry):
        return -entry.last_access_time


def test_base_class_refuses_a_policy_with_a_method_missing():
    class NoPriority(pnp.EvictionPolicy):
        name = "none"

    with pytest.raises(TypeError, match="priority"):
        NoPriority()


@pytest.mark.parametrize("given", ["class", "instance"])
def test_pool_evicts_the_page_the_custom_policy_picks(given):
    policy = MRUPolicy if given == "class" else MRUPolicy()
    pool = pnp.PagePool(4, 2, HashIndex(2, policy))
    assert pool.eviction_policy == "mru"
    pages = [pool.allocate() for _ in range(4)]
    for i, p in enumerate(pages):
        pool.prefix_index.register(p, f"h{i}".encode(), (i, i))
    for p in pages:  # all four become CACHED, pages[3] last
        pool.free(p)
    assert pool.eviction_order() == pages[::-1]
    victim = pool.allocate()
    assert victim == pages[3]
    assert pool.prefix_index.page_hash(victim) is None and pool.num_evictions == 1
    pool.check_invariants()


def test_cache_runs_under_a_custom_policy_class():
    cache = small_cache(num_pages=4, page_size=4, policy=MRUPolicy)
    assert cache.pool.eviction_policy == "mru"
    a = list(range(100, 108))   # two full pages
    b = list(range(200, 208))
    add_and_fill(cache, "a", a)
    cache.free("a")             # a's pages CACHED: a0 then a1
    add_and_fill(cache, "b", b)  # the two FREE pages take b
    cache.free("b")             # b's pages CACHED after a's: b1 is the youngest
    order = cache.pool.eviction_order()
    assert len(order) == 4
    # Two new pages: MRU evicts the two most recently cached (b's, youngest first).
    add_and_fill(cache, "c", list(range(300, 308)))
    assert cache.pool.num_evictions == 2
    assert cache.block_table("c").tolist() == order[:2]
    cache.check_invariants()
    # a's prefix survived, b's did not.
    assert cache.add_sequence("a2", a) == 4   # a hit stops short of the last token
    assert cache.add_sequence("b2", b) == 0
    for layer in range(cache.cfg.num_layers):
        k, v = read_kv(cache, "c", layer)
        want_k, want_v = token_kv(cache, list(range(300, 308)), np.arange(8), layer)
        np.testing.assert_array_equal(k, want_k)
        np.testing.assert_array_equal(v, want_v)
    cache.check_invariants()


@pytest.mark.parametrize("bad", ["mru", 3, object, pnp.PagedKVCache])
def test_cache_config_refuses_what_is_not_a_policy(bad):
    # A class is checked when the cache makes its policy (config imports no cache code).
    with pytest.raises(pnp.InvalidArgument, match="eviction_policy"):
        pnp.PagedKVCache(pnp.CacheConfig(num_pages=4, eviction_policy=bad))


def test_one_policy_object_serves_two_caches():
    """A policy holds no state: the index keeps the order, so an object can be shared."""
    shared = MRUPolicy()
    caches = [pnp.PagedKVCache(pnp.CacheConfig(num_pages=4, page_size=2, head_dim=4)) for _ in "ab"]
    for c in caches:
        c.pool = pnp.PagePool(4, 2, HashIndex(2, shared))
        assert c.pool.prefix_index.policy is shared


# ------------------------------------------------------------ the radix tree
def radix(policy, num_pages=6, page_size=2):
    return small_cache(num_pages=num_pages, page_size=page_size, policy=policy,
                       prefix_cache="radix")


def finish(cache, sid, prompt):
    """Run a prompt to the end; return the page holding its first (full) page."""
    add_and_fill(cache, sid, prompt)
    page = int(cache.block_table(sid)[0])
    cache.free(sid)
    return page


@pytest.mark.parametrize("policy, first", [
    ("lru", "b"),       # least recently released: b (a was hit and released since)
    ("fifo", "a"),      # first inserted: a, although it was hit since
    ("lfu", "b"),       # fewest hits: b (a was hit once)
    (MRUPolicy, "c"),   # most recently released: c
])
def test_radix_evicts_leaves_in_the_policy_order(policy, first):
    cache = radix(policy, num_pages=6)
    prompts = {"a": [1, 1, 1], "b": [2, 2, 2], "c": [3, 3, 3]}   # one full page each
    pages = {sid: finish(cache, sid, prompts[sid]) for sid in "ab"}
    assert cache.add_sequence("a2", prompts["a"]) == 2          # a hit on a's leaf
    cache.free("a2")
    pages["c"] = finish(cache, "c", prompts["c"])
    assert cache.pool.eviction_order()[0] == pages[first]
    # Fill the arena: the first eviction takes exactly that page.
    add_and_fill(cache, "d", [9] * 7)                           # 4 pages: 3 free + 1 evicted
    assert cache.stats()["evictions"] == 1
    assert cache.prefix_index.prefix_length(prompts[first][:2]) == 0
    cache.check_invariants()


@pytest.mark.parametrize("policy", ["fifo", "lfu", MRUPolicy])
def test_radix_never_evicts_a_locked_page_under_any_policy(policy):
    cache = radix(policy, num_pages=7)
    add_and_fill(cache, "live", [1, 1, 2, 2, 3])                 # 3 pages, path locked
    add_and_fill(cache, "other", [5, 5])                         # 1 page, path locked
    finish(cache, "old", [7, 7, 8, 8, 9])                       # 2 pages cached, 1 free
    live = {s: set(cache.block_table(s).tolist()) for s in ("live", "other")}
    assert not (live["live"] | live["other"]) & set(cache.pool.eviction_order())
    with pytest.raises(pnp.OutOfPages):
        cache.allocate_slots("live", 9)                         # needs 4 more, 3 available
    extend(cache, "live", [4] * 7)                              # 3 more: 1 free, 2 evicted
    assert cache.stats()["evictions"] == 2
    assert live["live"] <= set(cache.block_table("live").tolist())
    assert live["other"] == set(cache.block_table("other").tolist())
    cache.check_invariants()
