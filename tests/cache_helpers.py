"""Helpers shared by the cache tests: fill a sequence, snapshot every bit of state."""

from __future__ import annotations

import numpy as np

import paged_np as pnp


def small_cache(num_pages=8, page_size=4, num_layers=2, num_kv_heads=2, head_dim=8,
                policy="lru", dtype=np.float32, prefix_cache="hash") -> pnp.PagedKVCache:
    cfg = pnp.CacheConfig(num_pages=num_pages, page_size=page_size, num_layers=num_layers,
                          num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                          eviction_policy=policy, prefix_cache=prefix_cache)
    return pnp.PagedKVCache(cfg)


def token_kv(cache, token_ids, positions, layer):
    """Deterministic K/V for tokens: a function of (token, position, layer), [n, Hkv, D]."""
    cfg = cache.cfg
    t = np.asarray(token_ids, dtype=np.float32)[:, None, None]
    p = np.asarray(positions, dtype=np.float32)[:, None, None]
    h = np.arange(cfg.num_kv_heads, dtype=np.float32)[None, :, None]
    d = np.arange(cfg.head_dim, dtype=np.float32)[None, None, :]
    k = t * 1000 + p + h * 0.25 + d * 0.001 + layer * 0.5
    return k.astype(cfg.dtype), (-k).astype(cfg.dtype)


def extend(cache, seq_id, token_ids):
    """allocate_slots + write_kv (every layer) + append_tokens for new tokens."""
    token_ids = list(token_ids)
    start = cache.num_computed_tokens(seq_id)
    slots = cache.allocate_slots(seq_id, len(token_ids))
    pos = np.arange(start, start + len(token_ids))
    for layer in range(cache.cfg.num_layers):
        k, v = token_kv(cache, token_ids, pos, layer)
        cache.write_kv(layer, slots, k, v)
    cache.append_tokens(seq_id, token_ids)
    return slots


def add_and_fill(cache, seq_id, prompt):
    """add_sequence, then compute the rest of the prompt. Returns n_hit."""
    n_hit = cache.add_sequence(seq_id, prompt)
    rest = list(prompt)[n_hit:]
    if rest:
        extend(cache, seq_id, rest)
    return n_hit


def read_kv(cache, seq_id, layer):
    """Gather a sequence's written K/V from the arena: [num_tokens, Hkv, D] each."""
    k_pages, v_pages = cache.layer(layer)
    bt = cache.block_table(seq_id)
    n = cache.num_computed_tokens(seq_id)
    pos = np.arange(n)
    pages, off = bt[pos // cache.page_size], pos % cache.page_size
    return k_pages[pages, :, off, :], v_pages[pages, :, off, :]


def expected_kv(cache, seq_id, layer):
    s = cache.sequence(seq_id)
    return token_kv(cache, s.token_ids, np.arange(s.num_computed_tokens), layer)


def snapshot(cache) -> dict:
    """Every piece of observable state, for 'a refused call changes nothing'."""
    pool = cache.pool
    return {
        "stats": cache.stats(),
        "seqs": {sid: (list(s.token_ids), list(s.block_table), s.prefix_handle,
                       s.num_indexed_pages, s.num_pending) for sid, s in cache._seqs.items()},
        "ref": [pool.ref_count(p) for p in range(pool.num_pages)],
        "free": list(pool._free),
        "order": pool.eviction_order(),
        "index": cache.prefix_index.pages(),
        "events": len(cache.events),
        "arena": cache.arena.copy(),
    }


def assert_same_state(before: dict, after: dict) -> None:
    for key in before:
        if key == "arena":
            np.testing.assert_array_equal(before[key], after[key], err_msg="arena changed")
        else:
            assert before[key] == after[key], f"{key} changed"
