"""The arena: one preallocated array that holds every page of every layer.

::

    arena.shape == (num_layers, 2, num_pages, num_kv_heads, page_size, head_dim)
                                ^K/V

``arena[layer, 0]`` are the K pages of a layer and ``arena[layer, 1]`` the V
pages, each ``[num_pages, num_kv_heads, page_size, head_dim]``. For one head a
page is a contiguous ``[page_size, head_dim]`` tile (FlashInfer's "HND"
layout): decode streams whole tiles, which on this project's 2-core machines
reads 1.6-1.9x faster than the token-major "NHD" layout at long context.

A *slot* names one token position in the arena, ``page_id * page_size +
offset``, always ``int64`` (``num_pages * page_size`` can exceed 2**31). The
write path scatters a step's new K/V into their slots with one vectorised
assignment per layer, the NumPy twin of vLLM's ``reshape_and_cache`` kernel.
Nothing here allocates memory that grows with context: the arena is made once.

With an 8-bit ``kv_cache_dtype`` (``"int8"``, ``"fp8_e4m3"``, see
:mod:`paged_np.cache.kv_quant`) the pages hold codes and a second array,
``scales`` ``[num_layers, 2, num_pages, num_kv_heads, page_size]`` float32,
holds one scale per (token, kv head) beside them: the same page id indexes
both, so whatever moves a page (copy-on-write here, swap in
:mod:`paged_np.engine.swap`) moves its scales, and a prefix hit, which reuses
the page id, reuses them. The write path quantizes each token's row.
``CacheConfig.kv_layout="k_transposed"`` stores K tiles ``[head_dim, page_size]``:
``Arena(cfg)`` then builds that layout's class (:mod:`paged_np.cache.kv_layouts`).
"""

from __future__ import annotations

import numpy as np

from ..checks import check_int
from ..config import CacheConfig
from ..errors import DTypeError, IndexOutOfRange, ShapeError
from ..registry import KV_LAYOUTS


class Arena:
    """The preallocated KV array and its write path."""

    def __new__(cls, cfg: CacheConfig | None = None):     # the class of cfg's kv_layout
        return super().__new__(KV_LAYOUTS.load(cfg.kv_layout) if cls is Arena and cfg else cls)

    def __init__(self, cfg: CacheConfig):
        self.cfg = cfg
        # np.zeros asks the OS for zeroed pages lazily: untouched pages cost no RAM.
        self.data = np.zeros(cfg.arena_shape, dtype=cfg.dtype)
        #: float32 [num_layers, 2, num_pages, Hkv, page_size] for 8-bit pages, else None.
        self.scales = np.ones(cfg.scales_shape, np.float32) if cfg.quantized else None
        self.kv_format = cfg.kv_format

    def layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """``(k_pages, v_pages)`` of one layer: views, each [num_pages, Hkv, page_size, D]."""
        i = self.check_layer(layer)
        return self.data[i, 0], self.data[i, 1]

    def layer_scales(self, layer: int) -> tuple:
        """``(k_scales, v_scales)`` of one layer, each [num_pages, Hkv, page_size]; or Nones."""
        i = self.check_layer(layer)
        if self.scales is None:
            return None, None
        return self.scales[i, 0], self.scales[i, 1]

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Scatter ``k, v`` ([n, Hkv, D]) into ``slots`` (int64 [n]) of one layer."""
        i = self.check_layer(layer)
        slots = self.check_slots(slots)
        n = slots.shape[0]
        for name, x in (("k", k), ("v", v)):
            self._check_kv(name, x, n)
        page = slots // self.cfg.page_size  # [n] page ids
        offset = slots % self.cfg.page_size  # [n] positions within the page
        # Advanced indices on axes 0 and 2 with a slice between them put the
        # indexed axis first: data[i, 0][page, :, offset, :] is [n, Hkv, D], like k.
        if self.scales is not None:  # 8-bit: each token's row gets its own scale
            from .kv_quant import quantize  # the 8-bit formats' plug-in, loaded when used

            for kv, x in ((0, k), (1, v)):
                codes, scale = quantize(x, self.kv_format)  # [n, Hkv, D], [n, Hkv]
                self.data[i, kv][page, :, offset, :] = codes
                self.scales[i, kv][page, :, offset] = scale
            return
        self.data[i, 0][page, :, offset, :] = k
        self.data[i, 1][page, :, offset, :] = v

    def copy_page(self, src: int, dst: int) -> None:
        """Copy one page, every layer, K and V, with its scales (copy-on-write)."""
        self.data[:, :, dst] = self.data[:, :, src]
        if self.scales is not None:
            self.scales[:, :, dst] = self.scales[:, :, src]

    def read_pages(self, page_ids) -> tuple[np.ndarray, np.ndarray | None]:
        """Copies of whole pages as stored: ``[L, 2, n, Hkv, page_size, D]`` and, for 8-bit
        pages, their scales ``[L, 2, n, Hkv, page_size]`` (else None). Swap reads these."""
        pages = self.check_pages(page_ids)
        return self.data[:, :, pages], None if self.scales is None else self.scales[:, :, pages]

    def write_slots(self, slots, rows: np.ndarray, scales: np.ndarray | None = None) -> None:
        """Store token rows exactly as given, every layer, K and V (nothing re-quantized):
        ``rows`` [n, L, 2, Hkv, D] in the arena's dtype, ``scales`` [n, L, 2, Hkv]."""
        slots = self.check_slots(slots)
        ps = self.cfg.page_size
        if self._whole_pages(slots):        # whole pages (the tiers' loads): page by page
            k = len(slots) // ps            # rows as [k, ps, L, 2, Hkv, D] -> [L, 2, k, Hkv, ps, D]
            pages = slots[::ps] // ps
            self.data[:, :, pages] = rows.reshape(k, ps, *rows.shape[1:]).transpose(
                2, 3, 0, 4, 1, 5)           # contiguous runs of D: 5x the scatter's speed
            if self.scales is not None:
                self.scales[:, :, pages] = scales.reshape(k, ps, *scales.shape[1:]).transpose(
                    2, 3, 0, 4, 1)
            return
        page, offset = slots // ps, slots % ps                      # [n] each
        # Advanced indices on axes 2 and 4 with a slice between them put the indexed
        # axis first: data[:, :, page, :, offset] is [n, L, 2, Hkv, D], like rows.
        self.data[:, :, page, :, offset] = rows
        if self.scales is not None:
            self.scales[:, :, page, :, offset] = scales

    def _whole_pages(self, slots: np.ndarray) -> bool:
        """Whether ``slots`` fill whole pages, each page's slots in order."""
        ps = self.cfg.page_size
        if not len(slots) or len(slots) % ps or slots[0] % ps:
            return False
        runs = slots.reshape(-1, ps)                                # [k, ps]
        return bool((runs == runs[:, :1] + np.arange(ps)).all() and (runs[:, 0] % ps == 0).all())

    # ------------------------------------------------------------- validation
    def check_pages(self, page_ids) -> np.ndarray:
        pages = np.asarray(page_ids, dtype=np.int64).reshape(-1)
        if pages.size and (pages.min() < 0 or pages.max() >= self.cfg.num_pages):
            raise IndexOutOfRange(f"page_ids must lie in [0, {self.cfg.num_pages}), "
                                  f"got {pages.tolist()}")
        return pages

    def check_layer(self, layer) -> int:
        return check_int("layer", layer, 0, self.cfg.num_layers)

    def check_slots(self, slots) -> np.ndarray:
        slots = np.asarray(slots)
        if slots.dtype.kind not in "iu":
            raise DTypeError(f"slots must be an integer array (int64), got dtype {slots.dtype}")
        if slots.ndim != 1:
            raise ShapeError(f"slots must be 1-D [n], got shape {slots.shape}")
        slots = slots.astype(np.int64, copy=False)
        if slots.size and (slots.min() < 0 or slots.max() >= self.cfg.num_slots):
            bad = slots[(slots < 0) | (slots >= self.cfg.num_slots)][0]
            raise IndexOutOfRange(f"slots: slot {bad} is outside [0, {self.cfg.num_slots})")
        return slots

    def _check_kv(self, name: str, x, n: int) -> None:
        cfg = self.cfg
        if not isinstance(x, np.ndarray):
            raise DTypeError(f"{name} must be a numpy array, got {type(x).__name__}")
        if x.dtype.kind != "f":
            raise DTypeError(f"{name} must be a float array, got dtype {x.dtype}")
        if x.shape != (n, cfg.num_kv_heads, cfg.head_dim):
            raise ShapeError(
                f"{name} must have shape (len(slots), num_kv_heads, head_dim) = "
                f"{(n, cfg.num_kv_heads, cfg.head_dim)}, got {x.shape}"
            )
