"""Decode bandwidth of the cuda kernel, against the GPU's own copy bandwidth.

Decode attention reads every K and V byte of every sequence once and does
little arithmetic per byte, so its speed limit is memory bandwidth. This bench
measures two numbers on the same GPU:

- the device-to-device copy bandwidth of a large array (read + write bytes per
  second): what this GPU's memory can actually deliver;
- the decode kernel's bandwidth: K/V bytes it must read per call / kernel time.

and reports the second as a percent of the first. ``paged_np/bench.py`` calls
:func:`run` for ``python -m paged_np bench --backend cuda``.

Default setting: B=32 sequences, 32 query heads, 8 kv heads, head_dim 128, page
size 16, context 8192, float16 pages (K+V = 1 GiB read per call). Only a real
GPU gives meaningful figures; on the simulator :func:`run` runs a tiny smoke
size, checks it finishes, and reports no bandwidth.
"""

from __future__ import annotations

import numpy as np

from ..config import CacheConfig

DEFAULTS = dict(batch=32, num_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
                context=8192, iters=20)
SMOKE = dict(batch=2, num_heads=4, num_kv_heads=2, head_dim=16, page_size=16, context=40,
             iters=1)


def _timed(fn, iters: int, cuda) -> float:
    """Seconds per call of ``fn``, from CUDA events around ``iters`` calls (after a warm-up)."""
    fn()
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return cuda.event_elapsed_time(start, stop) / 1e3 / iters


def copy_bandwidth(cuda, n_bytes: int = 1 << 30, iters: int = 10) -> float:
    """Device-to-device copy of ``n_bytes``: (read + written) bytes per second."""
    src = cuda.device_array(n_bytes // 4, np.float32)
    dst = cuda.device_array(n_bytes // 4, np.float32)
    seconds = _timed(lambda: dst.copy_to_device(src), iters, cuda)
    return 2 * n_bytes / seconds


def _device_name(cuda) -> str:
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def run(args=None) -> dict:
    """Run the decode bench; ``args`` may override any key of ``DEFAULTS`` (attributes)."""
    from ..attention import numba_cuda as nc  # raises CudaUnavailable without a GPU/simulator

    cuda = nc.cuda
    cfg = dict(SMOKE if nc.SIMULATOR else DEFAULTS)
    if not nc.SIMULATOR:
        for key in cfg:
            value = getattr(args, key, None)
            if value is not None:
                cfg[key] = int(value)
    B, H, Hkv, D = cfg["batch"], cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    ps, ctx = cfg["page_size"], cfg["context"]
    pages_per_seq = -(-ctx // ps)
    num_pages = B * pages_per_seq

    rng = np.random.default_rng(0)
    # Pages in a shuffled order, as a long-running server's would be.
    block_tables = rng.permutation(num_pages).astype(np.int32).reshape(B, pages_per_seq)
    seq_lens = np.full(B, ctx, np.int32)
    qsl = np.arange(B + 1, dtype=np.int32)                     # one query per sequence
    cfg_cache = CacheConfig(num_pages=num_pages, page_size=ps, num_kv_heads=Hkv, head_dim=D,
                            dtype=np.float16)
    arena = nc.DeviceArena(cfg_cache)                          # zeros: the values do not matter
    k_pages, v_pages = arena.layer(0)
    q = cuda.to_device(rng.standard_normal((B, H, D)).astype(np.float32))
    out = cuda.device_array((B, H, D), np.float32)
    lse = cuda.device_array((B, H), np.float32)
    d_bt, d_sl, d_qsl = cuda.to_device(block_tables), cuda.to_device(seq_lens), cuda.to_device(qsl)
    plan = nc.plan(seq_lens, qsl, H, Hkv)                      # host work, outside the timing

    def step():
        nc.launch(plan, q, k_pages, v_pages, d_bt, d_sl, d_qsl, D ** -0.5, 0, out, lse)

    result = dict(backend="cuda", simulator=nc.SIMULATOR, **cfg, dtype="float16",
                  num_splits=plan.num_splits)
    kv_bytes = 2 * B * ctx * Hkv * D * 2                       # K and V, float16
    if nc.SIMULATOR:
        step()
        result.update(kv_bytes=kv_bytes, seconds=None, gb_s=None, copy_gb_s=None,
                      pct_of_copy=None,
                      note="CUDA simulator: smoke size only, no bandwidth (needs a real GPU)")
        return result
    seconds = _timed(step, cfg["iters"], cuda)
    moved = kv_bytes + 2 * q.size * 4 + block_tables.nbytes    # K/V, q in and out, tables
    gb_s = moved / seconds / 1e9
    copy_gb_s = copy_bandwidth(cuda) / 1e9
    result.update(kv_bytes=kv_bytes, seconds=seconds, gb_s=gb_s, copy_gb_s=copy_gb_s,
                  pct_of_copy=100 * gb_s / copy_gb_s,
                  device=_device_name(cuda))
    return result


if __name__ == "__main__":
    print(run())
