"""``paged_attention(..., backend="cuda")`` against the NumPy backend, same inputs."""

import numpy as np
import pytest
from attention_cases import TOL, make_paged_case, rel_error

import paged_np as pnp

pytestmark = pytest.mark.cudasim

# seq_lens, queries (None = decode), H, Hkv, D, page_size, window, kv dtype
CASES = [
    ([3, 17, 9], None, 4, 2, 16, 16, None, np.float32),         # decode, GQA
    ([1, 12], None, 4, 1, 8, 1, 4, np.float16),                 # decode, MQA, window, page 1
    ([10, 6, 0], [10, 2, 0], 4, 2, 8, 1, None, np.float16),     # prefill + chunk + empty
    ([20, 13], [7, 13], 8, 1, 16, 16, 5, np.float32),           # chunked, MQA, window
]


@pytest.mark.parametrize("case_id", range(len(CASES)))
def test_cuda_matches_numpy_backend(case_id):
    lens, nqs, H, Hkv, D, ps, window, dtype = CASES[case_id]
    case = make_paged_case(lens, nqs, num_heads=H, num_kv_heads=Hkv, head_dim=D,
                           page_size=ps, kv_dtype=dtype, seed=case_id,
                           pad_value=2**30)            # pad entries are never read
    kw = dict(sliding_window=window, return_lse=True)
    out, lse = pnp.paged_attention(*case.args(), backend="cuda", **kw)
    np_out, np_lse = pnp.paged_attention(*case.args(), backend="numpy", **kw)
    ref_out, ref_lse = case.reference(sliding_window=window)
    assert rel_error(out, np_out) <= TOL and rel_error(lse, np_lse) <= TOL
    assert rel_error(out, ref_out) <= TOL and rel_error(lse, ref_lse) <= TOL


def test_paged_attention_over_a_device_cache():
    """The engine's path: a cuda cache, its device layer views, the public function."""
    cfg = pnp.CacheConfig(num_pages=4, page_size=4, num_kv_heads=1, head_dim=8)
    dev, host = pnp.PagedKVCache(cfg, device="cuda"), pnp.PagedKVCache(cfg)
    rng = np.random.default_rng(7)
    k = rng.standard_normal((2, 7, 1, 8)).astype(np.float32)
    for cache in (dev, host):
        cache.add_sequence("a", list(range(7)))
        cache.write_kv(0, cache.allocate_slots("a", 7), k[0], k[1])
        cache.append_tokens("a", list(range(7)))
    batch = dev.batch(["a"])
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    out = pnp.paged_attention(q, *dev.layer(0), batch.block_tables, batch.seq_lens,
                              backend="cuda")
    want = pnp.paged_attention(q, *host.layer(0), batch.block_tables, batch.seq_lens,
                               backend="numpy")
    out = out.copy_to_host() if hasattr(out, "copy_to_host") else out
    assert rel_error(out, want) <= TOL
