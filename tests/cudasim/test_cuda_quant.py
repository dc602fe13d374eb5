"""The cuda backend on 8-bit pages (int8, fp8 e4m3), on the simulator or a GPU.

The kernel widens each code as it stages K/V (int8 converted, fp8 looked up
in the 256-entry table) and multiplies by the token's scale: it must equal
dense attention on the dequantized K/V within 1e-5, like the CPU backends.
A device cache keeps the scales beside its pages, writes them, and copies
them on copy-on-write.
"""

import numpy as np
import pytest
from attention_cases import TOL, make_paged_case, quantize_case, rel_error
from dense_ref import write_fork_and_copy_on_write

import paged_np as pnp
from paged_np.cache.kv_quant import dequantize

pytestmark = pytest.mark.cudasim


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("lens, n_q, heads, ps", [
    ([5, 20], None, (4, 2), 4),          # decode, GQA
    ([9, 17], [9, 3], (4, 1), 8),        # prefill and a chunk, MQA
])
def test_quantized_pages_match_dequantized_reference(fmt, lens, n_q, heads, ps):
    case = make_paged_case(lens, n_q, num_heads=heads[0], num_kv_heads=heads[1], head_dim=8,
                           page_size=ps, seed=len(lens) + ps)
    qcase = quantize_case(case, fmt)
    out, lse = pnp.paged_attention(*qcase.case.args(), backend="cuda", return_lse=True,
                                   **qcase.kwargs())
    ref_out, ref_lse = qcase.case.reference()
    assert np.isfinite(out).all()
    assert rel_error(out, ref_out) <= TOL and rel_error(lse, ref_lse) <= TOL


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_device_cache_writes_and_copies_scales(fmt):
    cfg = pnp.CacheConfig(num_pages=6, page_size=4, num_layers=1, num_kv_heads=1, head_dim=8,
                          dtype=fmt)
    host, dev = pnp.PagedKVCache(cfg), pnp.PagedKVCache(cfg, device="cuda")
    rng = np.random.default_rng(3)
    kv = rng.standard_normal((2, 6, 1, 8)).astype(np.float32)
    for cache in (host, dev):
        write_fork_and_copy_on_write(cache, kv)
    assert dev.stats()["cow_copies"] == 1
    np.testing.assert_array_equal(dev.arena.copy_to_host(), host.arena)
    np.testing.assert_array_equal(dev.kv_scales.copy_to_host(), host.kv_scales)
    kp, _ = host.layer(0)
    ks, _ = host.layer_scales(0)
    page_b = host.block_table("b")[1]
    np.testing.assert_array_equal(dequantize(kp[page_b, 0, :2], ks[page_b, 0, :2]),
                                  dequantize(*[x[host.block_table("a")[1], 0, :2]
                                               for x in (kp, ks)]))
