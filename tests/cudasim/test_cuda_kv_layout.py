"""``kv_layout="k_transposed"`` on the cuda backend, on the simulator or a GPU.

The device arena stores the same bytes as the host arena of the same layout (its
write kernel puts a token's key in column ``offset`` of the K tile), copies pages on
copy-on-write and takes token rows back; the attention kernel reading K tiles
``[head_dim, page_size]`` gives hnd's out and lse (within 1e-5; the same arithmetic,
so bit-equal here) over GQA, prefill, windows with sinks, float16 and 8-bit pages and
a 16x16 page, and hnd gives the dense reference.
"""

import numpy as np
import pytest
from attention_cases import TOL, make_paged_case, rel_error
from dense_ref import write_fork_and_copy_on_write

import paged_np as pnp
from paged_np.attention import numba_cuda as nc
from paged_np.cache.kv_layouts import token_rows

pytestmark = pytest.mark.cudasim

LAYOUTS = tuple(pnp.registry.KV_LAYOUTS)


def _caches(fmt, layout, **shape):
    cfg = pnp.CacheConfig(num_pages=6, page_size=4, num_layers=1, num_kv_heads=2, head_dim=8,
                          dtype=fmt, kv_layout=layout, **shape)
    return pnp.PagedKVCache(cfg), pnp.PagedKVCache(cfg, device="cuda")


@pytest.mark.parametrize("fmt", ["float32", "float16", "int8", "fp8_e4m3"])
def test_the_device_arena_stores_what_the_host_arena_stores(fmt):
    host, dev = _caches(fmt, "k_transposed")
    rng = np.random.default_rng(3)
    kv = rng.standard_normal((2, 6, 2, 8)).astype(np.float32)
    for cache in (host, dev):
        write_fork_and_copy_on_write(cache, kv)
    assert dev.stats()["cow_copies"] == 1
    k, v = dev.layer(0)
    assert tuple(k.shape) == (6, 2, 8, 4) and tuple(v.shape) == (6, 2, 4, 8)
    np.testing.assert_array_equal(dev.arena.copy_to_host(), host.arena)
    if host.kv_scales is not None:
        np.testing.assert_array_equal(dev.kv_scales.copy_to_host(), host.kv_scales)
    # Token rows back in (swap-in, the tiers' loads) through the device arena.
    slots = np.array([1, 2, 9, 12, 13, 14, 15])
    rows = rng.standard_normal((7, 1, 2, 2, 8)).astype(host.cfg.dtype)
    scales = rng.random((7, 1, 2, 2)).astype(np.float32) if host.cfg.quantized else None
    dev.write_slots(slots, rows, scales)
    data, _ = dev.read_pages(range(6))
    np.testing.assert_array_equal(token_rows(data, slots // 4, slots % 4, "k_transposed"),
                                  rows)


def _layout_pages(case, fmt):
    """The case's K/V written through a device cache of each layout."""
    num_pages, heads, ps, dim = case.k_pages.shape
    out = {}
    for layout in LAYOUTS:
        cfg = pnp.CacheConfig(num_pages=num_pages, page_size=ps, num_layers=1,
                              num_kv_heads=heads, head_dim=dim, dtype=fmt, kv_layout=layout)
        arena = nc.DeviceArena(cfg)
        for b, n in enumerate(case.seq_lens):
            pos = np.arange(int(n))
            slots = case.block_tables[b, pos // ps].astype(np.int64) * ps + pos % ps
            arena.write(0, slots, case.k_dense[b].astype(np.float32),
                        case.v_dense[b].astype(np.float32))
        out[layout] = (*arena.layer(0), *arena.layer_scales(0))
    return out


@pytest.mark.parametrize("fmt, lens, n_q, heads, ps, dim, window, sinks", [
    ("float32", [5, 20], None, (4, 2), 4, 8, None, 0),        # decode, GQA
    ("float32", [9, 17], [9, 3], (4, 1), 8, 8, 6, 2),         # prefill, MQA, window, sinks
    ("float32", [20], [3], (2, 1), 16, 16, None, 0),          # head_dim == page_size
    ("float16", [9, 12], None, (2, 2), 4, 8, None, 0),
    ("int8", [9, 12], [2, 1], (4, 2), 4, 8, 5, 1),
    ("fp8_e4m3", [7, 12], None, (2, 1), 4, 8, None, 0),
])
def test_k_transposed_attention_equals_hnd(fmt, lens, n_q, heads, ps, dim, window, sinks):
    case = make_paged_case(lens, n_q, num_heads=heads[0], num_kv_heads=heads[1], head_dim=dim,
                           page_size=ps, seed=len(lens) + ps,
                           kv_dtype=np.float16 if fmt == "float16" else np.float32)
    pages = _layout_pages(case, fmt)
    res = {}
    for layout in LAYOUTS:
        k, v, ks, vs = pages[layout]
        quant = {} if ks is None else dict(k_scales=ks, v_scales=vs)
        res[layout] = pnp.paged_attention(
            case.q, k, v, case.block_tables, case.seq_lens, case.query_start_loc,
            sliding_window=window, backend="cuda", return_lse=True,
            attention_sinks=sinks or None, kv_layout=layout, **quant)
    (out_h, lse_h), (out_k, lse_k) = res["hnd"], res["k_transposed"]
    assert np.isfinite(out_k).all()
    assert rel_error(out_k, out_h) <= TOL and rel_error(lse_k, lse_h) <= TOL
    np.testing.assert_array_equal(out_k, out_h)     # the kernel's arithmetic is the same
    if fmt in ("float32", "float16") and not sinks:
        ref, ref_lse = case.reference(sliding_window=window)
        assert rel_error(out_h, ref) <= TOL and rel_error(lse_h, ref_lse) <= TOL
