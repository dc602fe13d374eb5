"""A prefix hit compares the page's tokens as well as its hash: a collision shares nothing."""

from __future__ import annotations

import numpy as np
from cache_helpers import add_and_fill, expected_kv, read_kv, small_cache

from paged_np.cache import hash_index


def test_colliding_hashes_never_share_kv(monkeypatch):
    """Every page hashes to the same value: only identical tokens may hit."""
    monkeypatch.setattr(hash_index, "hash_page", lambda parent, tokens, key=None: b"\x00" * 32)
    cache = small_cache(num_pages=8, page_size=4)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    add_and_fill(cache, "a", a)
    cache.free("a")                                   # its two full pages stay CACHED
    assert cache.stats()["num_cached"] >= 1

    b = [11, 12, 13, 14, 15, 16, 17, 18, 19]          # other tokens, the same "hash"
    assert add_and_fill(cache, "b", b) == 0           # no hit: the tokens differ
    cached_a = set(cache.prefix_index.pages())
    assert not cached_a & set(cache.block_table("b").tolist())
    for layer in range(cache.cfg.num_layers):         # b reads its own K/V, not a's
        k, v = read_kv(cache, "b", layer)
        want_k, want_v = expected_kv(cache, "b", layer)
        np.testing.assert_array_equal(k, want_k)
        np.testing.assert_array_equal(v, want_v)

    # The control: the same tokens as a do hit, through the same colliding hash.
    assert add_and_fill(cache, "c", a) == 4
    cache.check_invariants()
