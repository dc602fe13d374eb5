"""PagedKVCache.release_pages_before: the sliding-window page release."""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import extend, small_cache

import paged_np as pnp


def test_release_frees_whole_pages_before_the_position():
    cache = small_cache(num_pages=8, page_size=4)
    cache.add_sequence("a", list(range(1, 11)))
    extend(cache, "a", list(range(1, 11)))              # 10 tokens: pages 0, 1, 2 (half)
    pages = cache.block_table("a").tolist()
    assert cache.release_pages_before("a", 7) == 1      # only page 0 lies wholly below 7
    assert cache.block_table("a").tolist() == [-1] + pages[1:]
    assert cache.pool.state(pages[0]) == "cached"       # full and hashed: still findable
    assert cache.release_pages_before("a", 7) == 0      # idempotent
    assert cache.release_pages_before("a", 100) == 1    # capped at full, written pages
    assert cache.block_table("a").tolist() == [-1, -1, pages[2]]
    cache.check_invariants()


def test_released_sequence_keeps_growing_forks_and_frees():
    cache = small_cache(num_pages=4, page_size=4)
    cache.add_sequence("a", [1, 2, 3, 4, 5])
    extend(cache, "a", [1, 2, 3, 4, 5, 6, 7, 8])
    cache.release_pages_before("a", 8)                  # both pages released
    for start in range(9, 30, 4):                       # 29 tokens > 4 pages * 4 slots
        extend(cache, "a", list(range(start, min(start + 4, 30))))
        cache.release_pages_before("a", cache.num_computed_tokens("a") - 4)
    assert cache.num_computed_tokens("a") == 29
    assert cache.stats()["num_in_use"] == 2
    cache.fork("a", "b")                                # shares only held pages
    cache.check_invariants()
    extend(cache, "b", [99])                            # copy-on-write of the last page
    cache.free("a")
    cache.free("b")
    cache.check_invariants()
    assert cache.stats()["num_in_use"] == 0


def test_prefix_hit_after_release():
    cache = small_cache(num_pages=8, page_size=4)
    prompt = list(range(1, 13))
    cache.add_sequence("a", prompt)
    extend(cache, "a", prompt)
    cache.release_pages_before("a", 8)
    assert cache.add_sequence("b", prompt) == 8         # released pages were CACHED
    cache.check_invariants()


def test_bad_arguments():
    cache = small_cache()
    with pytest.raises(pnp.UnknownSequence):
        cache.release_pages_before("nope", 4)
    cache.add_sequence("a", [1, 2])
    with pytest.raises(pnp.DTypeError, match="num_tokens"):
        cache.release_pages_before("a", 1.5)
    assert cache.release_pages_before("a", np.int64(-3)) == 0


def test_num_released_pages_counts_the_minus_one_prefix():
    """The cache's count of released pages is what the scheduler sizes requests with."""
    cache = small_cache(num_pages=8, page_size=4)
    cache.add_sequence("s", list(range(1, 14)))
    extend(cache, "s", list(range(1, 14)))              # 13 tokens: 4 pages
    assert cache.num_released_pages("s") == 0
    assert cache.release_pages_before("s", 9) == 2
    assert cache.num_released_pages("s") == 2
    assert cache.block_table("s").tolist()[:2] == [-1, -1]
    with pytest.raises(pnp.UnknownSequence):
        cache.num_released_pages("nope")
