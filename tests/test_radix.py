"""The radix tree on its own and behind PagedKVCache: splits, locks, eviction, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import add_and_fill, expected_kv, extend, read_kv
from engine_helpers import prompts, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

import paged_np as pnp
from paged_np.cache.radix import RadixIndex


def radix_cache(num_pages=16, page_size=2):
    return pnp.PagedKVCache(pnp.CacheConfig(num_pages=num_pages, page_size=page_size,
                                            num_layers=2, num_kv_heads=1, head_dim=4,
                                            prefix_cache="radix"))


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs, match", [
    (dict(prefix_cache="trie"), "prefix_cache"),
    (dict(prefix_cache=None), "prefix_cache"),
])
def test_bad_prefix_cache_is_refused_by_name(kwargs, match):
    with pytest.raises(pnp.InvalidArgument, match=match):
        pnp.CacheConfig(num_pages=4, **kwargs)


def test_engine_refuses_radix_with_a_sliding_window():
    model = tiny_model(sliding_window=8)
    with pytest.raises(pnp.InvalidArgument, match="prefix_cache"):
        pnp.Engine(model, num_pages=8, page_size=4, prefix_cache="radix", backend="numpy")


# ------------------------------------------------------------- the tree
def test_match_is_whole_pages_and_a_mid_edge_match_splits():
    tree = RadixIndex(page_size=2)
    node, added = tree.insert((1, 2, 3, 4, 5, 6), [10, 11, 12])
    tree.lock(node)
    assert added == [10, 11, 12] and tree.num_nodes == 1
    pages, end = tree.match_prefix([1, 2, 3, 9, 9])        # agrees on 3 tokens: 1 page
    assert pages == [10] and tree.tokens_to(end) == (1, 2)
    assert tree.num_nodes == 2 and tree.tokens_to(node) == (1, 2, 3, 4, 5, 6)
    assert node.lock_ref == 1 and end.lock_ref == 1        # the split keeps the lock
    tree.check_invariants()


def test_token_granular_with_page_size_1():
    tree = RadixIndex(page_size=1)
    tree.insert((5, 6, 7, 8), [0, 1, 2, 3])
    assert tree.match_prefix([5, 6, 7, 0])[0] == [0, 1, 2]
    assert tree.prefix_length([5, 6, 9]) == 2


def test_prefix_length_changes_nothing():
    tree = RadixIndex(page_size=1)
    tree.insert((5, 6, 7, 8), [0, 1, 2, 3])
    before = (tree.num_nodes, [n.last_access_time for n in tree.nodes()])
    assert tree.prefix_length([5, 6, 0]) == 2
    assert (tree.num_nodes, [n.last_access_time for n in tree.nodes()]) == before


def test_duplicate_run_is_not_taken_twice():
    tree = RadixIndex(page_size=1)
    tree.insert((1, 2, 3), [0, 1, 2])
    node, added = tree.insert((1, 2, 4), [5, 6, 7])
    assert added == [7]                                    # 1, 2 were there already
    assert tree.match_prefix([1, 2, 4, 0])[0] == [0, 1, 7]
    tree.check_invariants()


def test_evict_takes_lru_leaves_first_and_never_a_locked_node():
    tree = RadixIndex(page_size=1)
    a, _ = tree.insert((1, 2, 3, 4), [0, 1, 2, 3])
    b, _ = tree.insert((1, 2, 7, 8), [4, 5, 6, 7])          # splits a's edge after (1, 2)
    c, _ = tree.insert((9, 9), [8, 9])
    tree.lock(b)                                   # b's path (1, 2, 7, 8) is in use
    tree.match_prefix([9, 9])                              # c is the most recent
    assert tree.eviction_order() == [3, 2, 9, 8]           # a's tail, then c; never (1, 2)
    assert tree.evict(10) == [3, 2, 9, 8]
    assert tree.num_evictable == 0 and tree.evict(1) == []
    assert tree.match_prefix([1, 2, 7, 8])[0] == [0, 1, 6, 7]
    tree.check_invariants()
    tree.unlock(b)
    assert tree.evict(10) == [7, 6, 1, 0]                  # leaf first, then its parent
    assert tree.num_nodes == 0
    tree.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=8), st.booleans()),
                min_size=1, max_size=12), st.integers(1, 40))
def test_evict_never_touches_a_locked_path(runs, k):
    tree = RadixIndex(page_size=1)
    next_page = 0
    locked = []
    for key, lock in runs:
        value = list(range(next_page, next_page + len(key)))
        next_page += len(key)
        node, _ = tree.insert(tuple(key), value)
        if lock:
            tree.lock(node)
            locked.append(node)
    keep = {p for n in locked for m in tree.path(n) for p in m.value}
    assert tree.eviction_order()[:k] == tree.evict(k)[:k]   # the replay predicts eviction
    tree.check_invariants()
    assert keep <= set(tree._page_node), "a page on a locked path was evicted"


@pytest.mark.parametrize("corrupt, match", [
    (lambda t, n: setattr(n, "lock_ref", n.lock_ref + 5), "hole"),
    (lambda t, n: n.value.append(n.parent.value[0] if n.parent.value else 99), "tokens for"),
    (lambda t, n: n.key.reverse(), "first page"),
    (lambda t, n: setattr(n.parent, "lock_ref", 0), "hole"),
    (lambda t, n: t._page_node.__setitem__(1234, n), "page map"),
    (lambda t, n: setattr(t, "_num_evictable", t.num_evictable + 1), "num_evictable"),
])
def test_check_invariants_catches_corruption(corrupt, match):
    tree = RadixIndex(page_size=1)
    tree.insert((1, 2, 3), [0, 1, 2])
    node, _ = tree.insert((1, 2, 5, 6), [3, 4, 5, 6])       # (1, 2) | (3) and (5, 6)
    tree.lock(node)
    tree.check_invariants()
    corrupt(tree, node)
    with pytest.raises(AssertionError, match=match):
        tree.check_invariants()


def test_cache_check_invariants_catches_a_wrong_lock():
    cache = radix_cache()
    add_and_fill(cache, "a", [1, 2, 3, 4, 5])
    cache.check_invariants()
    cache.prefix_index.lock(cache.sequence("a").prefix_handle)   # a lock no sequence owns
    with pytest.raises(AssertionError, match="lock_ref"):
        cache.check_invariants()


# ------------------------------------------------- behind PagedKVCache
def test_edge_split_keeps_every_live_sequences_pages():
    cache = radix_cache(page_size=2)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bt_a = list(cache.block_table("a"))
    assert cache.add_sequence("b", [1, 2, 3, 4, 0, 0, 0]) == 4   # diverges mid-edge: split
    extend(cache, "b", [0, 0, 0])
    assert cache.stats()["radix_nodes"] == 3
    assert list(cache.block_table("a")) == bt_a
    assert list(cache.block_table("b"))[:2] == bt_a[:2]
    for sid in ("a", "b"):
        for layer in range(2):
            np.testing.assert_array_equal(read_kv(cache, sid, layer)[0],
                                          expected_kv(cache, sid, layer)[0])
    cache.check_invariants()


def test_free_caches_the_path_and_a_later_prompt_hits_it():
    cache = radix_cache(page_size=2)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5, 6])
    cache.free("a")
    s = cache.stats()
    assert s["num_cached"] == 3 and s["num_in_use"] == 0 and s["radix_locked_nodes"] == 0
    assert cache.num_cached_prefix_tokens([1, 2, 3, 4, 9]) == 4
    assert cache.add_sequence("b", [1, 2, 3, 4, 9]) == 4
    cache.check_invariants()


def test_num_cached_prefix_tokens_agrees_for_hash_and_radix():
    for pc in ("hash", "radix"):
        cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=16, page_size=2, head_dim=4,
                                                 prefix_cache=pc))
        add_and_fill(cache, "a", [1, 2, 3, 4, 5, 6, 7])
        assert cache.num_cached_prefix_tokens([1, 2, 3, 4, 5, 0]) == 4, pc
        assert cache.num_cached_prefix_tokens([1, 2, 3, 4, 5, 6, 7]) == 6, pc
        assert cache.num_cached_prefix_tokens([2]) == 0, pc


# ---------------------------------------------------------------- engine
@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_engine_greedy_equals_dense_with_radix_under_preemption(model, mode):
    ps = prompts(14, seed=3, system=list(range(40, 60)))
    params = pnp.SamplingParams(max_tokens=12, temperature=0.0)
    want = [model.dense_generate(p, params.max_tokens) for p in ps]
    engine = pnp.Engine(model, num_pages=18, page_size=4, max_num_seqs=6,
                        max_num_batched_tokens=40, preemption_mode=mode, backend="numpy",
                        prefix_cache="radix")
    outs = engine.generate(ps, params)
    assert [o.token_ids for o in outs] == want
    m = engine.metrics
    assert m["preemptions"] > 0                                 # the cache was too small
    if mode == "swap":
        assert m["swapped_out"] > 0 and m["swapped_in"] > 0
    assert m["prefix_hit_rate"] > 0                             # the system prompt was reused
    engine.cache.check_invariants()
    assert engine.cache.stats()["num_in_use"] == 0


def test_engine_n4_sampling_forks_with_radix(model):
    engine = pnp.Engine(model, num_pages=32, page_size=4, backend="numpy",
                        prefix_cache="radix")
    prompt = list(range(1, 11))
    outs = engine.generate([prompt], pnp.SamplingParams(max_tokens=6, temperature=0.0, n=4))
    want = model.dense_generate(prompt, 6)
    assert all(s.token_ids == want for s in outs[0].samples)
    engine.cache.check_invariants()


# ---------------------------------------------------------------- drawing
def test_radix_drawings_come_from_the_cache_state():
    from paged_np.viz.radix import draw_radix_tree, radix_story

    cache = radix_cache(page_size=2)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5])
    add_and_fill(cache, "b", [1, 2, 9, 9, 5])
    fig = draw_radix_tree(cache)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert sum("lock_ref" in t for t in labels) == cache.stats()["radix_nodes"] == 3
    assert len(radix_story().axes) == 5
    with pytest.raises(pnp.InvalidArgument, match="radix"):
        draw_radix_tree(pnp.PagedKVCache(pnp.CacheConfig(num_pages=4, head_dim=4)))
