"""Behaviour of PagedKVCache that users rely on: slots, prefix hits, eviction, forks."""

import numpy as np
import pytest
from cache_helpers import (
    add_and_fill,
    assert_same_state,
    expected_kv,
    extend,
    read_kv,
    small_cache,
    snapshot,
)

import paged_np as pnp


# ------------------------------------------------------------------ arena & slots
def test_arena_shape_and_layer_views():
    cache = small_cache(num_pages=8, page_size=4, num_layers=3, num_kv_heads=2, head_dim=8)
    assert cache.arena.shape == (3, 2, 8, 2, 4, 8)
    assert cache.arena.flags["C_CONTIGUOUS"]
    k, v = cache.layer(1)
    assert k.shape == v.shape == (8, 2, 4, 8)
    assert np.shares_memory(k, cache.arena) and np.shares_memory(v, cache.arena)
    k[3, 1, 2, 5] = 7.0
    assert cache.arena[1, 0, 3, 1, 2, 5] == 7.0


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_slot_maps_to_page_and_offset(dtype):
    cache = small_cache(num_pages=6, page_size=4, dtype=dtype)
    cache.add_sequence("a", list(range(1, 11)))
    slots = cache.allocate_slots("a", 10)
    bt = cache.block_table("a")
    assert slots.dtype == np.int64
    pos = np.arange(10)
    np.testing.assert_array_equal(slots, bt[pos // 4] * 4 + pos % 4)
    k = np.random.default_rng(0).standard_normal((10, 2, 8)).astype(np.float32)
    cache.write_kv(1, slots, k, -k)
    for t in range(10):
        page, off = divmod(int(slots[t]), 4)
        np.testing.assert_array_equal(cache.arena[1, 0, page, :, off, :], k[t].astype(dtype))
        np.testing.assert_array_equal(cache.arena[1, 1, page, :, off, :], -k[t].astype(dtype))
    assert not cache.arena[0].any(), "layer 0 was not written"


def test_slots_are_int64_beyond_2_pow_31():
    # Metadata only: a pool this large has no arena behind it.
    pool = pnp.PagePool(num_pages=2**20, page_size=2**12)
    p = pool.allocate()
    assert pool.ref_count(p) == 1
    cfg = pnp.CacheConfig(num_pages=2**20, page_size=2**12, num_kv_heads=1, head_dim=1)
    assert cfg.num_slots == 2**32 > 2**31


def test_allocate_slots_retry_returns_same_slots_and_seq_lens():
    cache = small_cache()
    cache.add_sequence("a", [1, 2, 3])
    s1 = cache.allocate_slots("a", 3)
    s2 = cache.allocate_slots("a", 3)
    np.testing.assert_array_equal(s1, s2)
    assert cache.pool.num_in_use == 1
    assert cache.batch(["a"]).seq_lens.tolist() == [3]
    cache.append_tokens("a", [1, 2, 3])
    assert cache.batch(["a"]).seq_lens.tolist() == [3]
    # a smaller retry gives back the spare page
    cache.allocate_slots("a", 6)
    assert cache.pool.num_in_use == 3
    cache.allocate_slots("a", 1)
    assert cache.pool.num_in_use == 1
    cache.check_invariants()


# ------------------------------------------------------------------ prefix caching
def test_identical_prompt_hits_full_pages_below_cap():
    cache = small_cache(num_pages=16, page_size=4)
    prompt = list(range(1, 13))  # 12 tokens = 3 full pages
    assert add_and_fill(cache, "a", prompt) == 0
    cache.free("a")
    # cap len - 1 = 11 tokens -> 2 whole pages = 8 tokens
    assert cache.add_sequence("b", prompt) == 8
    assert cache.stats()["hits"] == 8 and cache.stats()["queries"] == 24
    cache.check_invariants()


def test_hit_on_in_use_page_shares_it():
    cache = small_cache(num_pages=16, page_size=4)
    add_and_fill(cache, "a", list(range(1, 10)))
    assert cache.add_sequence("b", list(range(1, 10))) == 8
    shared = cache.block_table("b")
    np.testing.assert_array_equal(shared, cache.block_table("a")[:2])
    assert [cache.pool.ref_count(p) for p in shared] == [2, 2]
    extend(cache, "b", list(range(9, 10)))
    for layer in range(2):
        k, v = read_kv(cache, "b", layer)
        ek, ev = expected_kv(cache, "b", layer)
        np.testing.assert_array_equal(k, ek)
        np.testing.assert_array_equal(v, ev)
    cache.check_invariants()


def test_diverging_prompt_hits_only_common_pages():
    cache = small_cache(num_pages=16, page_size=4)
    add_and_fill(cache, "a", list(range(1, 14)))
    cache.free("a")
    diverged = list(range(1, 6)) + [99] + list(range(7, 14))  # differs in page 1
    assert cache.add_sequence("b", diverged) == 4


def test_shorter_prompt_and_same_tokens_elsewhere_do_not_hit():
    cache = small_cache(num_pages=16, page_size=4)
    add_and_fill(cache, "a", list(range(1, 14)))
    cache.free("a")
    assert cache.add_sequence("b", list(range(1, 5))) == 0  # 4 tokens: cap 3
    assert cache.add_sequence("c", list(range(1, 6))) == 4
    # page 1's tokens at position 0 have another parent hash: no hit
    assert cache.add_sequence("d", list(range(5, 14))) == 0


def test_extra_key_separates_prefixes():
    cache = small_cache(num_pages=16, page_size=4)
    cache.add_sequence("a", list(range(1, 10)), extra_key="lora-1")
    extend(cache, "a", list(range(1, 10)))
    cache.free("a")
    assert cache.add_sequence("b", list(range(1, 10)), extra_key="lora-2") == 0
    assert cache.add_sequence("c", list(range(1, 10)), extra_key="lora-1") == 8


def test_duplicate_contents_stay_out_of_index_and_go_free():
    cache = small_cache(num_pages=16, page_size=4)
    cache.add_sequence("a", [1, 2, 3, 4, 5])
    cache.add_sequence("b", [1, 2, 3, 4, 5])  # nothing cached yet: both compute
    extend(cache, "a", [1, 2, 3, 4, 5])
    extend(cache, "b", [1, 2, 3, 4, 5])
    pa, pb = cache.block_table("a")[0], cache.block_table("b")[0]
    assert (cache.prefix_index.page_hash(pa) is not None
            and cache.prefix_index.page_hash(pb) is None)
    cache.free("b")
    assert cache.pool.state(pb) == "free"
    cache.free("a")
    assert cache.pool.state(pa) == "cached"
    cache.check_invariants()


# ------------------------------------------------------------------ eviction order
def test_lru_evicts_oldest_released_and_refreshes_on_hit():
    cache = small_cache(num_pages=4, page_size=4)
    full = {}
    for sid, base in (("x", 10), ("y", 20), ("z", 30)):
        add_and_fill(cache, sid, [base + i for i in range(5)])  # 1 full + 1 partial page
        full[sid] = int(cache.block_table(sid)[0])
        cache.free(sid)  # full page cached, partial page free
    px, py, pz = full["x"], full["y"], full["z"]
    assert cache.pool.eviction_order() == [px, py, pz]
    # a hit on x's page takes it out of the list; releasing it puts it at the young end
    assert cache.add_sequence("x2", [10 + i for i in range(5)]) == 4
    cache.free("x2")
    assert cache.pool.eviction_order() == [py, pz, px]
    # pages are exhausted: the next allocation evicts y's page (least recently used)
    cache.add_sequence("w", [1, 2])
    cache.allocate_slots("w", 2)  # takes the one free page
    cache.append_tokens("w", [1, 2])
    cache.allocate_slots("w", 4)  # needs a second page: eviction
    assert cache.stats()["evictions"] == 1
    assert cache.pool.eviction_order() == [pz, px]
    assert cache.add_sequence("y2", [20 + i for i in range(5)]) == 0  # y was evicted
    cache.check_invariants()


def test_mark_used_moves_cached_page_to_young_end():
    pool = pnp.PagePool(4, 4)
    pages = [pool.allocate() for _ in range(3)]
    for i, p in enumerate(pages):
        pool.prefix_index.register(p, bytes([i]) * 32, [i])
        pool.free(p)
    assert pool.eviction_order() == pages
    pool.prefix_index.mark_used(pages[0])
    assert pool.eviction_order() == [pages[1], pages[2], pages[0]]


def test_tail_first_release_evicts_later_pages_first():
    cache = small_cache(num_pages=4, page_size=2)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5, 6, 7])  # 3 full pages + 1 partial
    bt = cache.block_table("a").tolist()
    cache.free("a")
    assert cache.pool.eviction_order() == [bt[2], bt[1], bt[0]]
    # evicting the last page keeps the prefix reusable
    cache.add_sequence("b", [9, 9, 9])
    cache.allocate_slots("b", 3)  # the free partial page, then evicts bt[2]
    cache.append_tokens("b", [9, 9, 9])
    cache.free("b")
    assert cache.add_sequence("c", [1, 2, 3, 4, 5, 6, 7]) == 4
    cache.check_invariants()


def test_fifo_ignores_hits_and_keeps_first_cached_time():
    cache = small_cache(num_pages=8, page_size=2, policy="fifo")
    for sid, base in (("x", 10), ("y", 20)):
        add_and_fill(cache, sid, [base, base + 1, base + 2])
        cache.free(sid)
    order = cache.pool.eviction_order()
    assert cache.add_sequence("x2", [10, 11, 12]) == 2
    cache.free("x2")
    assert cache.pool.eviction_order() == order  # x's page is still first in line
    cache.mark_used(order[0])
    assert cache.pool.eviction_order() == order


def test_lfu_evicts_fewest_hits_ties_by_recency():
    cache = small_cache(num_pages=8, page_size=2, policy="lfu")
    for sid, base in (("x", 10), ("y", 20), ("z", 30)):
        add_and_fill(cache, sid, [base, base + 1, base + 2])
        cache.free(sid)
    px, py, pz = cache.pool.eviction_order()  # no hits yet: by recency
    for _ in range(2):
        cache.add_sequence("x2", [10, 11, 12])
        cache.free("x2")
    cache.add_sequence("z2", [30, 31, 32])
    cache.free("z2")
    assert cache.pool.eviction_order() == [py, pz, px]


# ------------------------------------------------------------------ OutOfPages
def test_out_of_pages_changes_nothing():
    cache = small_cache(num_pages=4, page_size=4)
    add_and_fill(cache, "a", list(range(1, 11)))  # 3 pages
    add_and_fill(cache, "b", [7])
    before = snapshot(cache)
    with pytest.raises(pnp.OutOfPages):
        cache.allocate_slots("b", 8)  # needs 2 more pages, 0 available
    assert_same_state(before, snapshot(cache))
    cache.check_invariants()


def test_out_of_pages_with_cow_changes_nothing():
    cache = small_cache(num_pages=3, page_size=4)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5, 6])  # 2 pages, the second partial
    cache.fork("a", "b")
    add_and_fill(cache, "c", [9])  # the last page
    before = snapshot(cache)
    with pytest.raises(pnp.OutOfPages):
        cache.allocate_slots("b", 1)  # copy-on-write needs a page
    assert_same_state(before, snapshot(cache))


def test_live_pages_are_never_evicted():
    cache = small_cache(num_pages=4, page_size=2)
    add_and_fill(cache, "live", [1, 2, 3, 4])
    live_pages = set(cache.block_table("live").tolist())
    for i in range(20):  # churn: other sequences come and go
        sid = f"s{i}"
        try:
            add_and_fill(cache, sid, [100 + i, 101 + i, 102 + i])
        except pnp.OutOfPages:
            pass
        cache.free(sid)
        assert live_pages == set(cache.block_table("live").tolist())
        for layer in range(2):
            np.testing.assert_array_equal(read_kv(cache, "live", layer)[0],
                                          expected_kv(cache, "live", layer)[0])
    cache.check_invariants()


# ------------------------------------------------------------------ fork / CoW
def test_fork_shares_then_copy_on_write_isolates_all_layers():
    cache = small_cache(num_pages=8, page_size=4, num_layers=3)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5, 6])
    cache.fork("a", "b")
    np.testing.assert_array_equal(cache.block_table("a"), cache.block_table("b"))
    assert all(cache.pool.ref_count(p) == 2 for p in cache.block_table("a"))
    extend(cache, "b", [70])
    extend(cache, "a", [80, 81])
    bt_a, bt_b = cache.block_table("a"), cache.block_table("b")
    assert bt_a[0] == bt_b[0] and bt_a[1] != bt_b[1]
    assert cache.stats()["cow_copies"] == 1
    for layer in range(3):
        for sid in ("a", "b"):
            k, v = read_kv(cache, sid, layer)
            ek, ev = expected_kv(cache, sid, layer)
            np.testing.assert_array_equal(k, ek)
            np.testing.assert_array_equal(v, ev)
    cache.free("a")
    for layer in range(3):
        np.testing.assert_array_equal(read_kv(cache, "b", layer)[0],
                                      expected_kv(cache, "b", layer)[0])
    cache.check_invariants()


def test_fork_refuses_pending_parent():
    cache = small_cache()
    cache.add_sequence("a", [1, 2, 3])
    cache.allocate_slots("a", 3)
    before = snapshot(cache)
    with pytest.raises(pnp.InvalidArgument, match="parent_id"):
        cache.fork("a", "b")
    assert_same_state(before, snapshot(cache))


# ------------------------------------------------------------------ batch / CSR
def test_batch_pads_block_tables_and_counts_pending():
    cache = small_cache(num_pages=16, page_size=4)
    add_and_fill(cache, "a", list(range(1, 11)))  # 3 pages
    add_and_fill(cache, "b", [5])  # 1 page
    cache.allocate_slots("b", 1)  # pending: seq_len 2
    batch = cache.batch(["a", "b"])
    assert batch.block_tables.dtype == np.int32 and batch.seq_lens.dtype == np.int32
    assert batch.block_tables.shape == (2, 3)
    np.testing.assert_array_equal(batch.block_tables[0], cache.block_table("a"))
    assert batch.block_tables[1, 0] == cache.block_table("b")[0]
    assert (batch.block_tables[1, 1:] == -1).all()
    assert batch.seq_lens.tolist() == [10, 2]


def test_csr_export_matches_block_tables():
    cache = small_cache(num_pages=16, page_size=4)
    for sid, n in (("a", 10), ("b", 4), ("c", 1)):
        add_and_fill(cache, sid, list(range(1, n + 1)))
    batch = cache.batch(["a", "b", "c"])
    indptr, indices, last = batch.to_csr()
    assert indptr.tolist() == [0, 3, 4, 5]
    assert last.tolist() == [2, 4, 1]
    for b, sid in enumerate(["a", "b", "c"]):
        np.testing.assert_array_equal(indices[indptr[b]:indptr[b + 1]], cache.block_table(sid))
    assert indptr.dtype == indices.dtype == last.dtype == np.int32


def test_stats_and_events_track_lifecycle():
    cache = small_cache(num_pages=8, page_size=4)
    add_and_fill(cache, "a", list(range(1, 10)))
    cache.tick()
    cache.free("a")
    s = cache.stats()
    assert (s["num_free"], s["num_cached"], s["num_in_use"]) == (6, 2, 0)
    assert s["usage"] == 0.0
    kinds = [(e.step, e.kind) for e in cache.events]
    assert kinds.count((0, "allocate")) == 3
    assert kinds.count((1, "cache")) == 2 and kinds.count((1, "free")) == 1
    assert all(e.seq_id == "a" for e in cache.events)


# ------------------------------------------------------------ ask before allocating
@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_num_pages_needed_is_what_allocate_slots_takes(prefix_cache):
    cache = small_cache(num_pages=8, page_size=4, prefix_cache=prefix_cache)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5, 6])             # 2 pages, the last half full
    cache.fork("a", "b")                                     # b shares both pages
    assert cache.num_available_pages == 6
    assert cache.num_pages_needed("a", 1) == 1               # copy-on-write of the shared page
    assert cache.num_pages_needed("a", 3) == 2               # the copy and one new page
    assert cache.can_allocate("a", 3)
    assert not cache.can_allocate("a", 26)                   # 7 pages: it fits, not now
    before = snapshot(cache)
    with pytest.raises(pnp.OutOfPages):
        cache.allocate_slots("a", 26)
    assert_same_state(before, snapshot(cache))               # asking and refusing change nothing
    free_before = cache.num_available_pages
    cache.allocate_slots("a", 3)
    assert free_before - cache.num_available_pages == 2
    with pytest.raises(pnp.SequenceTooLong):
        cache.num_pages_needed("a", 100)
    cache.check_invariants()


def test_prefix_query_memo_keeps_the_page_hashes():
    cache = small_cache(num_pages=8, page_size=2)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5])
    memo = {}
    assert cache.num_cached_prefix_tokens([1, 2, 3, 4, 9], memo=memo) == 4
    assert len(memo["page_hashes"]) == 2
    assert cache.num_cached_prefix_tokens([1, 2, 3, 4, 9, 9, 9], memo=memo) == 4
    assert len(memo["page_hashes"]) == 3                     # extended, not recomputed
