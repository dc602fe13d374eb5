"""A fourth eviction policy written from the abstract base alone runs the cache.

The policy below (most recently cached goes first, MRU) uses nothing but
:class:`paged_np.EvictionPolicy`. The tests check that the pool evicts exactly the
page MRU picks, that the cache keeps its invariants and its K/V under it, and that
the base class refuses a policy with a method missing.
"""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import add_and_fill, read_kv, small_cache, token_kv

import paged_np as pnp


class MRUPolicy(pnp.EvictionPolicy):
    """Most recently used goes first: a stack of the CACHED pages."""

    name = "mru"

    def __init__(self):
        self._stack: list[int] = []  # next victim last

    def add(self, page):
        self._stack.append(page)

    def remove(self, page):
        self._stack.remove(page)

    def touch(self, page):
        self._stack.remove(page)
        self._stack.append(page)

    def pop_victim(self):
        return self._stack.pop()

    def __len__(self):
        return len(self._stack)

    def __contains__(self, page):
        return page in self._stack

    def order(self):
        return self._stack[::-1]


def test_base_class_refuses_a_policy_with_a_method_missing():
    class NoVictim(pnp.EvictionPolicy):
        def add(self, page): ...
        def remove(self, page): ...
        def touch(self, page): ...
        def __len__(self): return 0
        def __contains__(self, page): return False
        def order(self): return []

    with pytest.raises(TypeError, match="pop_victim"):
        NoVictim()


@pytest.mark.parametrize("given", ["class", "instance"])
def test_pool_evicts_the_page_the_custom_policy_picks(given):
    policy = MRUPolicy if given == "class" else MRUPolicy()
    pool = pnp.PagePool(4, 2, policy)
    assert pool.eviction_policy == "mru"
    pages = [pool.allocate() for _ in range(4)]
    for i, p in enumerate(pages):
        pool.register(p, f"h{i}".encode(), (i, i))
    for p in pages:  # all four become CACHED, pages[3] last
        pool.free(p)
    assert pool.eviction_order() == pages[::-1]
    victim = pool.allocate()
    assert victim == pages[3]
    assert pool.page_hash(victim) is None and pool.num_evictions == 1
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
    with pytest.raises(pnp.InvalidArgument, match="eviction_policy"):
        pnp.CacheConfig(num_pages=4, eviction_policy=bad)


def test_pool_refuses_a_policy_object_that_already_holds_pages():
    used = MRUPolicy()
    used.add(0)
    with pytest.raises(pnp.InvalidArgument, match="eviction_policy.*empty"):
        pnp.PagePool(4, 2, used)
