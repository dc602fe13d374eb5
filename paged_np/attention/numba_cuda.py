"""``backend="cuda"``: paged attention on a GPU with ``numba.cuda``.

The kernels live in :mod:`paged_np.attention.cuda_kernels`; this module is the
part a caller meets:

- an availability check: importing this module raises
  :class:`~paged_np.errors.CudaUnavailable` unless ``numba.cuda`` has a GPU or
  runs on Numba's CUDA simulator;
- :func:`plan` + :func:`launch` (FlashInfer's plan/run split): the plan reads
  ``seq_lens`` and ``query_start_loc`` on the host once per batch and lists the
  row tiles; the launch is pure GPU work, reusable for every layer;
- :func:`forward`, the backend entry point that ``paged_attention`` calls;
- :func:`reshape_and_cache`, the write path (slots -> pages) on the device;
- :class:`DeviceArena`, the cache's arena kept as one device array.

Run without a GPU (slow: one Python thread per GPU thread, tiny shapes only)::

    NUMBA_ENABLE_CUDASIM=1 python -c "import paged_np.attention.numba_cuda"

Numba's simulator has no warp shuffles and its device arrays carry no
``__cuda_array_interface__``; on the simulator this module adds both (a
``shfl_xor_sync`` that exchanges values through a barrier per warp, and the
interface's shape/dtype/strides), so the kernels and callers run unchanged.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from ..cache.arena import Arena
from ..checks import check_positive_int
from ..config import CacheConfig
from ..errors import CudaUnavailable, DTypeError, IndexOutOfRange, ShapeError

INSTALL_HINT = (
    "backend='cuda' needs numba.cuda with a GPU: pip install \"paged-np[cuda]\" "
    "(numba-cuda; on a real GPU choose \"numba-cuda[cu12]\" or \"numba-cuda[cu13]\" to "
    "match your CUDA driver). Without a GPU, use Numba's CUDA simulator (slow, for "
    "tests): set NUMBA_ENABLE_CUDASIM=1 in the environment before numba is imported."
)


def _load_cuda():
    """``numba.cuda`` if it can run kernels (a GPU or the simulator), else raise."""
    try:
        from numba import cuda
        from numba.core import config
    except ImportError as e:  # a numba without its CUDA target
        raise CudaUnavailable(f"numba.cuda cannot be imported ({e}). {INSTALL_HINT}") from e
    if not cuda.is_available():
        raise CudaUnavailable(f"numba.cuda found no usable GPU. {INSTALL_HINT}")
    return cuda, bool(config.ENABLE_CUDASIM)


cuda, SIMULATOR = _load_cuda()


def _install_simulator_shuffle():
    """Give the simulator the one warp intrinsic the kernels use.

    Each simulated GPU thread is a Python thread; the 32 lanes of a warp meet
    at a barrier, publish their value, meet again once all have read.
    """
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    if hasattr(FakeCUDAModule, "shfl_xor_sync"):
        return
    lock = threading.Lock()

    def shfl_xor_sync(self, mask, value, lane_mask):
        me = threading.current_thread()
        manager = me._manager                     # one per simulated block
        warp, lane = divmod(me.thread_id, 32)
        with lock:
            warps = manager.__dict__.setdefault("_paged_np_warps", {})
            if warp not in warps:
                n_threads = int(np.prod(manager._block_dim))
                warps[warp] = (threading.Barrier(min(32, n_threads - 32 * warp)), {})
        barrier, values = warps[warp]
        values[lane] = value
        barrier.wait(timeout=120)
        other = values[lane ^ lane_mask]
        barrier.wait(timeout=120)
        return other

    FakeCUDAModule.shfl_xor_sync = shfl_xor_sync


def _install_simulator_array_interface():
    """Let simulated device arrays say they are device arrays, as real ones do.

    ``paged_attention`` recognises a device array by ``__cuda_array_interface__``
    (shape, dtype, strides; it never touches the pointer). Real numba device
    arrays have it; the simulator's stand-ins do not, so they would be refused.
    """
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    if hasattr(FakeCUDAArray, "__cuda_array_interface__"):
        return

    def interface(self):
        a = self._ary                                   # the host array it simulates
        return {"shape": a.shape, "typestr": a.dtype.str, "version": 3,
                "strides": None if a.flags.c_contiguous else a.strides,
                "data": (a.ctypes.data, False)}

    FakeCUDAArray.__cuda_array_interface__ = property(interface)


if SIMULATOR:
    _install_simulator_shuffle()
    _install_simulator_array_interface()

from . import cuda_kernels as K  # noqa: E402  (needs numba.cuda checked first)

MAX_HEAD_DIM = K.MAX_HEAD_DIM


# ---------------------------------------------------------------------------
# Host <-> device
# ---------------------------------------------------------------------------
def is_device_array(x) -> bool:
    """True for numba device arrays (real or simulated) and ``__cuda_array_interface__``."""
    return not isinstance(x, np.ndarray) and (
        hasattr(x, "copy_to_host") or hasattr(x, "__cuda_array_interface__"))


def _to_device(x):
    if isinstance(x, np.ndarray):
        return cuda.to_device(np.ascontiguousarray(x))      # a host -> device transfer
    if not hasattr(x, "copy_to_host"):
        return cuda.as_cuda_array(x)                         # e.g. a CuPy or torch array
    return x


def _to_host(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else _to_device(x).copy_to_host()


def _sm_count() -> int:
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except AttributeError:           # the simulator has no device attributes
        return 1


# ---------------------------------------------------------------------------
# Plan: which row tiles exist, how many key splits (host work, once per batch)
# ---------------------------------------------------------------------------
class Plan(NamedTuple):
    work_seq: object      # device int32 [num_work]: sequence of each row tile
    work_row0: object     # device int32 [num_work]: first row of each tile
    num_work: int
    num_splits: int
    group: int            # num_heads // num_kv_heads


def plan(seq_lens, query_start_loc, num_heads: int, num_kv_heads: int,
         num_splits: int | None = None) -> Plan:
    """List the row tiles of a batch: ``ceil(n_q(b) * group / ROWS)`` per sequence.

    ``num_splits`` (keys cut into that many ranges, merged after) defaults to
    enough blocks to fill the GPU, without splits shorter than 256 keys.
    """
    seq_lens = _to_host(seq_lens).astype(np.int64)             # [B]
    qsl = _to_host(query_start_loc).astype(np.int64)           # [B+1]
    group = num_heads // num_kv_heads
    tiles = (np.diff(qsl) * group + K.ROWS - 1) // K.ROWS       # [B] row tiles per sequence
    num_work = int(tiles.sum())
    work_seq = np.repeat(np.arange(len(seq_lens), dtype=np.int32), tiles)   # [num_work]
    first_tile = np.cumsum(tiles) - tiles                                   # [B]
    work_row0 = ((np.arange(num_work) - first_tile[work_seq]) * K.ROWS).astype(np.int32)
    if num_splits is None:
        blocks = max(1, num_work * num_kv_heads)
        want = -(-4 * _sm_count() // blocks)                  # ~4 blocks per SM
        longest = int(seq_lens.max(initial=0))
        num_splits = int(max(1, min(want, longest // 256, 64)))
    num_splits = check_positive_int("num_splits", num_splits)
    return Plan(cuda.to_device(work_seq), cuda.to_device(work_row0), num_work,
                int(num_splits), group)


_LUT: dict = {}


def _scale_args(k_pages, k_scales, v_scales):
    """``(k_scales, v_scales, lut, codes)`` for the kernel: device arrays and the format code."""
    if "lut" not in _LUT:                      # made once: the fp8 table, a 1-element dummy
        from ..cache.kv_quant import FP8_E4M3

        _LUT["lut"] = cuda.to_device(np.ascontiguousarray(FP8_E4M3))
        _LUT["none"] = cuda.to_device(np.ones((1, 1, 1), np.float32))
    dt = np.dtype(k_pages.dtype)
    codes = 2 if dt == np.uint8 else 1 if dt == np.int8 else 0
    if codes == 0:
        return _LUT["none"], _LUT["none"], _LUT["lut"], 0
    return _to_device(k_scales), _to_device(v_scales), _LUT["lut"], codes


def launch(p: Plan, q, k_pages, v_pages, block_tables, seq_lens, query_start_loc,
           scale: float, sliding_window: int, out, lse, k_scales=None, v_scales=None,
           attention_sinks=0, q_sinks=None, kv_layout="hnd"):
    """Run the kernels of a plan on device arrays; fills ``out`` [T, H, D] and ``lse`` [T, H].

    8-bit pages (int8, or uint8 fp8 e4m3 codes) need their ``k_scales, v_scales``;
    ``q_sinks`` (device, like q; None: q) scores the ``attention_sinks`` first keys;
    ``kv_layout="k_transposed"``: k_pages are ``[num_pages, Hkv, D, page_size]``.
    """
    T, H, D = q.shape
    if p.num_work == 0:
        return
    args = (q, k_pages, v_pages, block_tables, seq_lens, query_start_loc,
            p.work_seq, p.work_row0, np.float32(scale), int(sliding_window), p.group)
    quant = (*_scale_args(k_pages, k_scales, v_scales), q if q_sinks is None else q_sinks,
             int(attention_sinks) if sliding_window else 0, int(kv_layout != "hnd"))
    grid = (p.num_work, k_pages.shape[1], p.num_splits)
    if p.num_splits == 1:        # one split: write the final arrays directly
        K.paged_attention_kernel[grid, K.THREADS](
            *args, out.reshape(1, T, H, D), lse.reshape(1, T, H), *quant)
        return
    out_part = cuda.device_array((p.num_splits, T, H, D), np.float32)
    lse_part = cuda.device_array((p.num_splits, T, H), np.float32)
    K.paged_attention_kernel[grid, K.THREADS](*args, out_part, lse_part, *quant)
    K.merge_splits_kernel[(T, H), K.THREADS](out_part, lse_part, out, lse)


# ---------------------------------------------------------------------------
# The backend entry point
# ---------------------------------------------------------------------------
def forward(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, scale,
            sliding_window, return_lse, *, num_splits=None, k_scales=None, v_scales=None,
            attention_sinks=0, q_sinks=None, kv_layout="hnd"):
    """Paged attention on the GPU (the internal backend contract, see docs/design.md).

    q [T, H, D] float32; k_pages, v_pages [num_pages, Hkv, page_size, D]
    float32|float16, or 8-bit codes (int8, uint8 fp8 e4m3) with ``k_scales,
    v_scales`` float32 [num_pages, Hkv, page_size]; block_tables int32 [B,
    max_pages]; seq_lens int32 [B]; query_start_loc int32 [B+1]; ``kv_layout``
    "k_transposed": k_pages [num_pages, Hkv, D, page_size]. Returns
    ``(out [T, H, D], lse [T, H] or None)``.

    The arguments are the ones :func:`paged_np.attention.paged_attention` has
    already validated (shapes, dtypes, every page id a query reads): this
    function does not check them again. With a sliding window, block-table
    entries of pages wholly before every query's window may be -1 (the kernel
    starts each row tile at its window, so it never reads them). The one check
    left is this backend's own limit, ``head_dim <= MAX_HEAD_DIM``.

    Arrays may be numba device arrays or host NumPy arrays. Host arrays are
    copied to the device first: that costs a host -> device transfer of the
    pages on every call, so keep the arena on the device (``DeviceArena``) for
    real use. The results come back as host arrays when ``q`` is a host array,
    and stay device arrays when ``q`` is a device array. ``seq_lens`` and
    ``query_start_loc`` are read on the host (small) to plan the launch.
    """
    T, H, D = q.shape
    Hkv = k_pages.shape[1]
    if D > MAX_HEAD_DIM:
        raise ShapeError(f"q: head_dim {D} > {MAX_HEAD_DIM}, the largest the cuda kernel "
                         "compiles for (its shared-memory tiles have constant shapes)")
    # Metadata on the host (small): plan the launch from it.
    bt = np.ascontiguousarray(_to_host(block_tables), dtype=np.int32)   # [B, max_pages]
    sl = np.ascontiguousarray(_to_host(seq_lens), dtype=np.int32)       # [B]
    qsl = np.ascontiguousarray(_to_host(query_start_loc), dtype=np.int32)
    p = plan(sl, qsl, H, Hkv, num_splits)
    on_device = is_device_array(q)
    out = cuda.device_array((T, H, D), np.float32)
    lse = cuda.device_array((T, H), np.float32)
    launch(p, _to_device(q), _to_device(k_pages), _to_device(v_pages), cuda.to_device(bt),
           cuda.to_device(sl), cuda.to_device(qsl), float(scale), int(sliding_window or 0),
           out, lse, k_scales, v_scales, attention_sinks,
           None if q_sinks is None else _to_device(q_sinks), kv_layout)
    if not on_device:
        out, lse = out.copy_to_host(), lse.copy_to_host()
    return out, (lse if return_lse else None)


def reshape_and_cache(k_pages, v_pages, slots, k, v, kv_layout="hnd"):
    """Write ``k, v [n, Hkv, D]`` into device pages at ``slots`` (int64 [n]; -1 skips).

    ``kv_layout="k_transposed"``: k_pages are ``[num_pages, Hkv, D, page_size]``.

    ``k_pages``/``v_pages`` must be device arrays (a host array would be written
    on a copy); ``slots``, ``k``, ``v`` may be host arrays (copied over). The slots
    are checked on the host before the kernel runs.
    """
    if not (is_device_array(k_pages) and is_device_array(v_pages)):
        raise DTypeError("k_pages, v_pages: reshape_and_cache writes device arrays; got host "
                         "arrays (use numpy assignment for those)")
    n_pages, Hkv, page_size, D = v_pages.shape
    slots_h = _to_host(slots).astype(np.int64).reshape(-1)             # [n]
    n = slots_h.shape[0]
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != (n, Hkv, D):
            raise ShapeError(f"{name}: expected shape {(n, Hkv, D)}, got {tuple(x.shape)}")
    if np.any((slots_h < -1) | (slots_h >= n_pages * page_size)):
        raise IndexOutOfRange(f"slots: every slot must be -1 or in [0, {n_pages * page_size})")
    if n == 0:
        return
    blocks = min(1024, -(-n * Hkv * D // K.THREADS))
    K.reshape_and_cache_kernel[blocks, K.THREADS](
        k_pages, v_pages, cuda.to_device(slots_h), _to_device(k), _to_device(v),
        int(kv_layout != "hnd"))


class DeviceArena(Arena):
    """The arena ``[num_layers, 2, num_pages, num_kv_heads, page_size, head_dim]`` on the GPU.

    ``PagedKVCache(cfg, device="cuda")`` holds one instead of the host
    :class:`~paged_np.cache.arena.Arena`: same layout, same methods, same checks (the
    layer and slot checks are inherited), but ``data`` is a device array, writes
    and copy-on-write copies run as kernels, and ``layer(i)`` gives the
    ``k_pages, v_pages`` device views that :func:`forward` reads without a copy
    (K ``[num_pages, Hkv, D, page_size]`` with ``cfg.kv_layout="k_transposed"``).
    """

    def __init__(self, cfg: CacheConfig):
        self.cfg = cfg
        self.kv_format = cfg.kv_format
        self.data = cuda.device_array(cfg.arena_shape, cfg.dtype)    # uninitialised...
        flat = self.data.reshape(self.data.size)
        blocks = max(1, min(1024, -(-flat.size // K.THREADS)))
        K.fill_zero_kernel[blocks, K.THREADS](flat)                   # ...so zero it
        #: 8-bit pages' scales [num_layers, 2, num_pages, Hkv, page_size] on the device.
        self.scales = (cuda.to_device(np.ones(cfg.scales_shape, np.float32))
                       if cfg.quantized else None)

    def layer_scales(self, layer: int) -> tuple:
        """``(k_scales, v_scales)`` device views of one layer, or ``(None, None)``."""
        i = self.check_layer(layer)
        if self.scales is None:
            return None, None
        return self.scales[i, 0], self.scales[i, 1]

    def layer(self, layer: int):
        """``(k_pages, v_pages)`` of one layer: device views, no copy."""
        i = self.check_layer(layer)
        k = self.data[i, 0]                                 # contiguous: a reshape is a view
        if self.cfg.kv_layout != "hnd":
            P, H, ps, D = k.shape
            k = k.reshape((P, H, D, ps))
        return k, self.data[i, 1]

    def write(self, layer: int, slots, k, v) -> None:
        """``k, v [n, num_kv_heads, head_dim]`` (host or device) -> their slots, on the device."""
        k_pages, v_pages = self.layer(layer)
        slots = self.check_slots(slots)
        if self.scales is None:
            reshape_and_cache(k_pages, v_pages, slots, k, v, self.cfg.kv_layout)
            return
        from ..cache.kv_quant import quantize  # 8-bit: quantized on the host

        (kq, ks), (vq, vs) = quantize(_to_host(k), self.kv_format), quantize(_to_host(v),
                                                                            self.kv_format)
        reshape_and_cache(k_pages, v_pages, slots, kq, vq, self.cfg.kv_layout)
        k_sc, v_sc = self.layer_scales(layer)       # [P, Hkv, ps]: pages of head_dim 1
        shape = (*k_sc.shape, 1)
        reshape_and_cache(k_sc.reshape(shape), v_sc.reshape(shape), slots, ks[..., None],
                          vs[..., None])

    def copy_page(self, src: int, dst: int) -> None:
        """Copy-on-write on the device: page ``src`` -> ``dst``, all layers, K and V."""
        self.copy_pages([src], [dst])

    def copy_pages(self, src, dst) -> None:
        """Copy pages ``src[i] -> dst[i]`` (int lists) in one kernel launch."""
        src = np.asarray(src, dtype=np.int64).reshape(-1)
        dst = np.asarray(dst, dtype=np.int64).reshape(-1)
        n_pages = self.cfg.num_pages
        if src.shape != dst.shape or np.any((src < 0) | (src >= n_pages) | (dst < 0)
                                            | (dst >= n_pages)):
            raise IndexOutOfRange(f"src, dst: page ids must pair up and lie in [0, {n_pages})")
        if src.size:
            grid = (src.size, 2 * self.cfg.num_layers)
            src_d, dst_d = cuda.to_device(src.astype(np.int32)), cuda.to_device(dst.astype(
                np.int32))
            K.copy_pages_kernel[grid, K.THREADS](self.data, src_d, dst_d)
            if self.scales is not None:              # the scales, as pages of head_dim 1
                K.copy_pages_kernel[grid, K.THREADS](self.scales.reshape(
                    (*self.scales.shape, 1)), src_d, dst_d)

    def read_pages(self, page_ids):
        """Host copies of whole pages and their scales (the arena crosses to the host:
        simple, not fast; swap is a host-arena feature)."""
        pages = self.check_pages(page_ids)
        scales = None if self.scales is None else self.scales.copy_to_host()[:, :, pages]
        return self.to_host()[:, :, pages], scales

    def write_slots(self, slots, rows, scales=None) -> None:
        """Store token rows as given (``Arena.write_slots``), through a host copy."""
        host = Arena(self.cfg)                       # the host class of cfg.kv_layout
        host.data, host.scales = self.to_host(), (None if self.scales is None
                                                  else self.scales.copy_to_host())
        host.write_slots(slots, rows, scales)
        self.data.copy_to_device(host.data)
        if self.scales is not None:
            self.scales.copy_to_device(host.scales)

    def to_host(self) -> np.ndarray:
        """A host copy of the whole arena (a device -> host transfer)."""
        return self.data.copy_to_host()


__all__ = ["forward", "plan", "launch", "reshape_and_cache", "DeviceArena", "is_device_array",
           "MAX_HEAD_DIM", "SIMULATOR", "INSTALL_HINT"]
