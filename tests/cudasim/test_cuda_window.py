"""Sliding window on the cuda backend: holes (-1) before the window, a device cache."""

import numpy as np
import pytest
import test_engine_window

import paged_np as pnp

pytestmark = pytest.mark.cudasim


def test_engine_window_holes_on_cuda():
    """The check tests/test_engine_window.py runs on every host backend."""
    test_engine_window.check_holes_outside_the_window("cuda")


def test_device_cache_with_released_pages_under_a_window():
    """PagedKVCache(device="cuda") + release_pages_before: the table has -1 holes."""
    cfg = pnp.CacheConfig(num_pages=8, page_size=2, num_kv_heads=1, head_dim=8)
    dev, host = pnp.PagedKVCache(cfg, device="cuda"), pnp.PagedKVCache(cfg)
    rng = np.random.default_rng(3)
    k, v = rng.standard_normal((2, 11, 1, 8)).astype(np.float32)
    window = 3
    for cache in (dev, host):
        cache.add_sequence("a", list(range(11)))
        cache.write_kv(0, cache.allocate_slots("a", 11), k, v)
        cache.append_tokens("a", list(range(11)))
        # The query at position 10 reads keys 8..10: pages 0..3 (keys 0..7) go back.
        assert cache.release_pages_before("a", 10 - window + 1) == 4
    batch = dev.batch(["a"])
    assert list(batch.block_tables[0, :4]) == [-1] * 4
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    out = pnp.paged_attention(q, *dev.layer(0), batch.block_tables, batch.seq_lens,
                              sliding_window=window, backend="cuda")
    out = out.copy_to_host() if hasattr(out, "copy_to_host") else out
    hb = host.batch(["a"])
    want = pnp.paged_attention(q, *host.layer(0), hb.block_tables, hb.seq_lens,
                               sliding_window=window, backend="numpy")
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
