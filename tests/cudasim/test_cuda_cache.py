"""PagedKVCache(cfg, device="cuda"): the same cache, its arena on the device."""

import numpy as np
import pytest
from dense_ref import dense_attention

import paged_np as pnp
from paged_np.attention import numba_cuda as nc

pytestmark = pytest.mark.cudasim


def _drive(cache, rng_seed=5):
    """Prompt, fork, then both sequences write one token: the child copies on write."""
    rng = np.random.default_rng(rng_seed)
    cfg = cache.cfg
    cache.add_sequence("a", list(range(1, 7)))                 # 6 tokens: page 1 half full
    slots = cache.allocate_slots("a", 6)
    for layer in range(cfg.num_layers):
        kv = rng.standard_normal((2, 6, cfg.num_kv_heads, cfg.head_dim)).astype(np.float32)
        cache.write_kv(layer, slots, kv[0], kv[1])
    cache.append_tokens("a", list(range(1, 7)))
    cache.fork("a", "b")
    for sid in ("a", "b"):
        slots = cache.allocate_slots(sid, 1)                   # "b": copy-on-write of page 1
        for layer in range(cfg.num_layers):
            kv = rng.standard_normal((2, 1, cfg.num_kv_heads, cfg.head_dim)).astype(np.float32)
            cache.write_kv(layer, slots, kv[0], kv[1])
        cache.append_tokens(sid, [7])
    cache.check_invariants()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_device_cache_matches_host_cache(dtype):
    cfg = pnp.CacheConfig(num_pages=6, page_size=4, num_layers=2, num_kv_heads=1,
                          head_dim=8, dtype=dtype)
    host, dev = pnp.PagedKVCache(cfg), pnp.PagedKVCache(cfg, device="cuda")
    _drive(host)
    _drive(dev)
    assert nc.is_device_array(dev.arena)
    assert dev.stats()["cow_copies"] == 1 == host.stats()["cow_copies"]
    np.testing.assert_array_equal(dev.arena.copy_to_host(), host.arena)
    # Attention over the device views equals the dense truth over the host arena.
    batch = dev.batch(["a", "b"])
    q = np.random.default_rng(6).standard_normal((2, 2, 8)).astype(np.float32)
    qsl = np.array([0, 1, 2], np.int32)
    k_pages, v_pages = dev.layer(1)
    out, lse = nc.forward(q, k_pages, v_pages, batch.block_tables, batch.seq_lens, qsl,
                          0.35, 0, True)
    hk, hv = host.layer(1)
    ref, ref_lse = dense_attention(q, hk, hv, batch.block_tables, batch.seq_lens, qsl, 0.35)
    np.testing.assert_allclose(out, ref, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5)


def test_device_cache_refuses_bad_slots_and_layers():
    cfg = pnp.CacheConfig(num_pages=2, page_size=4, num_kv_heads=1, head_dim=8)
    cache = pnp.PagedKVCache(cfg, device="cuda")
    k = np.zeros((1, 1, 8), np.float32)
    with pytest.raises(pnp.IndexOutOfRange):
        cache.write_kv(0, np.array([8]), k, k)
    with pytest.raises(pnp.IndexOutOfRange):
        cache.layer(1)
