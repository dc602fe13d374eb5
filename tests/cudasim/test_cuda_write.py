"""The write path (reshape_and_cache) and the device arena on the cuda backend."""

import numpy as np
import pytest
from dense_ref import dense_attention

from paged_np import CacheConfig
from paged_np.attention import numba_cuda as nc
from paged_np.errors import DTypeError, IndexOutOfRange, ShapeError

pytestmark = pytest.mark.cudasim


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reshape_and_cache_matches_numpy_scatter(dtype):
    from numba import cuda

    rng = np.random.default_rng(3)
    num_pages, Hkv, ps, D = 5, 2, 4, 8
    slots = np.array([9, 0, 17, -1, 3], dtype=np.int64)        # -1: padding, skipped
    k = rng.standard_normal((5, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((5, Hkv, D)).astype(np.float32)
    start = rng.standard_normal((num_pages, Hkv, ps, D)).astype(dtype)
    d_k, d_v = cuda.to_device(start), cuda.to_device(start)
    nc.reshape_and_cache(d_k, d_v, slots, k, v)
    want_k, want_v = start.copy(), start.copy()
    for i, s in enumerate(slots):
        if s >= 0:
            want_k[s // ps, :, s % ps] = k[i]                  # float32 -> page dtype
            want_v[s // ps, :, s % ps] = v[i]
    np.testing.assert_array_equal(d_k.copy_to_host(), want_k)
    np.testing.assert_array_equal(d_v.copy_to_host(), want_v)


def test_reshape_and_cache_refuses_bad_input():
    from numba import cuda

    pages = cuda.to_device(np.zeros((2, 1, 4, 8), np.float32))
    k = np.zeros((1, 1, 8), np.float32)
    with pytest.raises(IndexOutOfRange, match="slots"):
        nc.reshape_and_cache(pages, pages, np.array([8]), k, k)
    with pytest.raises(ShapeError, match="k:"):
        nc.reshape_and_cache(pages, pages, np.array([0, 1]), k, k)
    with pytest.raises(DTypeError, match="device"):
        nc.reshape_and_cache(np.zeros((2, 1, 4, 8)), pages, np.array([0]), k, k)


def test_device_arena_write_read_and_copy_on_write():
    rng = np.random.default_rng(4)
    L, P, Hkv, ps, D = 2, 4, 1, 4, 8
    arena = nc.DeviceArena(CacheConfig(num_pages=P, page_size=ps, num_layers=L,
                                       num_kv_heads=Hkv, head_dim=D, dtype=np.float16))
    assert not np.any(arena.to_host()), "a new arena starts zeroed"
    k = rng.standard_normal((6, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((6, Hkv, D)).astype(np.float32)
    slots = np.array([8, 9, 10, 11, 4, 5])      # page 2 full, then page 1 half
    arena.write(1, slots, k, v)
    host = arena.to_host()
    np.testing.assert_array_equal(host[1, 0, 2, :, :], k[:4].transpose(1, 0, 2).astype(np.float16))
    assert not np.any(host[0]), "layer 0 untouched"
    # Attention straight from the device views equals the dense truth.
    k_pages, v_pages = arena.layer(1)
    q = rng.standard_normal((1, 2, D)).astype(np.float32)
    bt = np.array([[2, 1]], np.int32)
    sl, qsl = np.array([6], np.int32), np.array([0, 1], np.int32)
    out, _ = nc.forward(q, k_pages, v_pages, bt, sl, qsl, 0.4, 0, False)
    ref, _ = dense_attention(q, host[1, 0], host[1, 1], bt, sl, qsl, 0.4)
    np.testing.assert_allclose(out, ref, atol=2e-5)
    # Copy-on-write: page 2 -> page 3 in every layer, K and V, on the device.
    arena.copy_page(2, 3)
    after = arena.to_host()
    np.testing.assert_array_equal(after[:, :, 3], host[:, :, 2])
    np.testing.assert_array_equal(after[:, :, :3], host[:, :, :3])
    with pytest.raises(IndexOutOfRange):
        arena.copy_pages([0], [P])
