"""Bad input: a named error whose message names the argument, and no state change."""

import numpy as np
import pytest
from cache_helpers import add_and_fill, assert_same_state, small_cache, snapshot

import paged_np as pnp
from paged_np.cache import HashIndex


@pytest.mark.parametrize("kwargs, err, name", [
    (dict(num_pages=0), pnp.InvalidArgument, "num_pages"),
    (dict(num_pages=4, page_size=-1), pnp.InvalidArgument, "page_size"),
    (dict(num_pages=4, num_layers=1.5), pnp.DTypeError, "num_layers"),
    (dict(num_pages=4, num_kv_heads=True), pnp.DTypeError, "num_kv_heads"),
    (dict(num_pages=4, head_dim=0), pnp.InvalidArgument, "head_dim"),
    (dict(num_pages=4, dtype=np.int32), pnp.DTypeError, "dtype"),
    (dict(num_pages=4, dtype="not-a-dtype"), pnp.DTypeError, "dtype"),
    (dict(num_pages=4, eviction_policy="random"), pnp.InvalidArgument, "eviction_policy"),
])
def test_bad_cache_config(kwargs, err, name):
    with pytest.raises(err, match=name):
        pnp.CacheConfig(**kwargs)


def test_bad_pool_arguments():
    with pytest.raises(pnp.InvalidArgument, match="num_pages"):
        pnp.PagePool(0, 16)
    with pytest.raises(pnp.InvalidArgument, match="eviction_policy"):
        pnp.PagePool(4, 16, HashIndex(16, "mru"))
    with pytest.raises(pnp.DTypeError, match="prefix_index"):
        pnp.PagePool(4, 16, "lru")


def test_cache_needs_config():
    with pytest.raises(pnp.DTypeError, match="cfg"):
        pnp.PagedKVCache({"num_pages": 4})


@pytest.fixture
def cache():
    c = small_cache(num_pages=6, page_size=4)
    add_and_fill(c, "a", [1, 2, 3, 4, 5])
    c.add_sequence("p", [1, 2])
    c.allocate_slots("p", 2)  # pending
    return c


BAD_CALLS = [
    # (call, error, word the message must contain)
    (lambda c: c.add_sequence("a", [1]), pnp.DuplicateSequence, "seq_id"),
    (lambda c: c.add_sequence(3.5, [1]), pnp.DTypeError, "seq_id"),
    (lambda c: c.add_sequence("n", []), pnp.InvalidArgument, "prompt"),
    (lambda c: c.add_sequence("n", [1, -2]), pnp.InvalidArgument, "prompt"),
    (lambda c: c.add_sequence("n", [1.5, 2.0]), pnp.DTypeError, "prompt"),
    (lambda c: c.add_sequence("n", [[1, 2]]), pnp.ShapeError, "prompt"),
    (lambda c: c.add_sequence("n", [1], extra_key=[1]), pnp.DTypeError, "extra_key"),
    (lambda c: c.allocate_slots("zz", 1), pnp.UnknownSequence, "seq_id"),
    (lambda c: c.allocate_slots("a", 0), pnp.InvalidArgument, "n"),
    (lambda c: c.allocate_slots("a", 2.0), pnp.DTypeError, "n"),
    (lambda c: c.allocate_slots("a", 10_000), pnp.SequenceTooLong, "never fit"),
    (lambda c: c.allocate_slots("a", 16), pnp.OutOfPages, "pages"),
    (lambda c: c.append_tokens("a", [1]), pnp.InvalidArgument, "token_ids"),
    (lambda c: c.append_tokens("p", [1, 2, 3]), pnp.InvalidArgument, "token_ids"),
    (lambda c: c.append_tokens("p", [1, -1]), pnp.InvalidArgument, "token_ids"),
    (lambda c: c.append_tokens("zz", [1]), pnp.UnknownSequence, "seq_id"),
    # Token ids past int64 (the prefix hash packs int64): refused before anything changes.
    (lambda c: c.append_tokens("p", [1, 2**63]), pnp.InvalidArgument, "token_ids"),
    (lambda c: c.append_tokens("p", (1, 2**63)), pnp.InvalidArgument, "token_ids"),
    (lambda c: c.append_tokens("p", np.array([1, 2**63], np.uint64)), pnp.InvalidArgument,
     "token_ids"),
    (lambda c: c.add_sequence("n", [1, 2, 3, 4, 5, 2**63]), pnp.InvalidArgument, "prompt"),
    (lambda c: c.add_sequence("n", [2**64, 1]), pnp.InvalidArgument, "prompt"),
    (lambda c: c.write_kv(2, np.array([0]), *kv(1)), pnp.IndexOutOfRange, "layer"),
    (lambda c: c.write_kv(-1, np.array([0]), *kv(1)), pnp.IndexOutOfRange, "layer"),
    (lambda c: c.write_kv("0", np.array([0]), *kv(1)), pnp.DTypeError, "layer"),
    (lambda c: c.write_kv(0, np.array([24]), *kv(1)), pnp.IndexOutOfRange, "slot"),
    (lambda c: c.write_kv(0, np.array([-1]), *kv(1)), pnp.IndexOutOfRange, "slot"),
    (lambda c: c.write_kv(0, np.array([0.0]), *kv(1)), pnp.DTypeError, "slots"),
    (lambda c: c.write_kv(0, np.array([[0]]), *kv(1)), pnp.ShapeError, "slots"),
    (lambda c: c.write_kv(0, np.array([0, 1]), *kv(1)), pnp.ShapeError, "k"),
    (lambda c: c.write_kv(0, np.array([0]), kv(1)[0], np.zeros((1, 2, 7), np.float32)),
     pnp.ShapeError, "v"),
    (lambda c: c.write_kv(0, np.array([0]), np.zeros((1, 2, 8), np.int32), kv(1)[1]),
     pnp.DTypeError, "k"),
    (lambda c: c.write_kv(0, np.array([0]), [[0.0]], kv(1)[1]), pnp.DTypeError, "k"),
    (lambda c: c.fork("zz", "b"), pnp.UnknownSequence, "seq_id"),
    (lambda c: c.fork("a", "a"), pnp.DuplicateSequence, "child_id"),
    (lambda c: c.fork("p", "q"), pnp.InvalidArgument, "parent_id"),
    (lambda c: c.free("zz"), pnp.UnknownSequence, "seq_id"),
    (lambda c: c.batch(["a", "zz"]), pnp.UnknownSequence, "seq_id"),
    (lambda c: c.block_table("zz"), pnp.UnknownSequence, "seq_id"),
    (lambda c: c.layer(5), pnp.IndexOutOfRange, "layer"),
    (lambda c: c.mark_used(0), pnp.StalePage, "page_id"),
    (lambda c: c.pool.free(5), pnp.StalePage, "page_id"),
    (lambda c: c.pool.free(6), pnp.IndexOutOfRange, "page_id"),
    (lambda c: c.pool.free(-1), pnp.IndexOutOfRange, "page_id"),
    (lambda c: c.pool.ref_count("3"), pnp.DTypeError, "page_id"),
    (lambda c: c.pool.share(5), pnp.StalePage, "page_id"),
    (lambda c: c.pool.touch(1), pnp.StalePage, "page_id"),
    (lambda c: c.prefix_index.register(0, "h", [1]), pnp.DTypeError, "page_hash"),
]


def kv(n):
    return np.zeros((n, 2, 8), np.float32), np.zeros((n, 2, 8), np.float32)


@pytest.mark.parametrize("call, err, word", BAD_CALLS)
def test_bad_call_raises_named_error_and_changes_nothing(cache, call, err, word):
    before = snapshot(cache)
    with pytest.raises(err, match=word) as info:
        call(cache)
    assert isinstance(info.value, pnp.PagedNPError)
    assert not isinstance(info.value, (IndexError, KeyError))
    assert_same_state(before, snapshot(cache))
    cache.check_invariants()


def test_double_free_of_a_page_is_stale():
    pool = pnp.PagePool(2, 4)
    p = pool.allocate()
    pool.free(p)
    with pytest.raises(pnp.StalePage, match="page_id"):
        pool.free(p)


def test_pool_out_of_pages_all_or_nothing():
    pool = pnp.PagePool(3, 4)
    pool.allocate()
    with pytest.raises(pnp.OutOfPages):
        pool.allocate_many(3)
    assert pool.num_free == 2
    pool.allocate_many(2)
    with pytest.raises(pnp.OutOfPages):
        pool.allocate()


def test_a_sequence_larger_than_the_arena_is_out_of_pages_for_good(cache):
    """"Never fits" is an OutOfPages (caught by the documented contract), told apart by class."""
    with pytest.raises(pnp.OutOfPages) as never:
        cache.allocate_slots("a", 6 * 4)                # 5 + 24 tokens > 6 pages of 4
    assert type(never.value) is pnp.SequenceTooLong and "num_pages=6" in str(never.value)
    with pytest.raises(pnp.OutOfPages) as not_now:
        cache.allocate_slots("a", 16)                   # fits the arena, not the free pages
    assert not isinstance(not_now.value, pnp.SequenceTooLong)
    cache.check_invariants()
