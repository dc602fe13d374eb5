"""Validation of every argument of :func:`paged_attention`, in one place.

The jitted backends do not check bounds (a bad page id there is a segfault,
not an exception), so everything they read is checked here first: shapes,
dtypes, page ids against the arena, lengths against the block tables.
:func:`validate_paged_attention_inputs` returns the normalised arguments, in
the order a backend's ``forward`` takes them. Cheap: O(B * max_pages) at
most, never a pass over the pages' contents.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..checks import check_int, check_positive_int
from ..errors import DTypeError, InvalidArgument, InvalidBlockTable, ShapeError
from ..registry import KV_FORMATS, KV_LAYOUTS

_INT32_MAX = np.iinfo(np.int32).max
#: What a page may hold: floats, or the 8-bit codes of kv_cache_dtype int8 / fp8_e4m3 (uint8).
PAGE_DTYPES = tuple(np.dtype(f.storage) for f in KV_FORMATS.values())


class PagedAttentionArgs(NamedTuple):
    """Validated arguments, in the order of a backend's ``forward`` (bar ``return_lse``)."""

    q: object                  # float32 [T, num_heads, head_dim]
    k_pages: object            # like v_pages ([num_pages, Hkv, D, page_size]: k_transposed)
    v_pages: object            # f32|f16|int8|uint8 (fp8) [num_pages, Hkv, page_size, D]
    block_tables: np.ndarray   # int32 [B, max_pages]
    seq_lens: np.ndarray       # int32 [B]
    query_start_loc: np.ndarray  # int32 [B+1]
    scale: float
    sliding_window: int        # 0 = no window


# ---------------------------------------------------------------------------
# Validation: O(B * max_pages) work at most, never a pass over page contents.
# ---------------------------------------------------------------------------
def validate_paged_attention_inputs(q, k_pages, v_pages, block_tables, seq_lens,
                                    query_start_loc=None, scale=None, sliding_window=None,
                                    allow_device=False, attention_sinks=None, kv_layout="hnd"
                                    ) -> PagedAttentionArgs:
    """Check every argument of :func:`paged_attention`; return them normalised.

    Normalised means: q float32 C-contiguous; pages C-contiguous; block_tables,
    seq_lens, query_start_loc int32 C-contiguous numpy arrays (query_start_loc
    built as ``0..B`` when None); scale a float; sliding_window an int (0 = none).

    With ``allow_device=True`` (the cuda backend), q and the pages may be device
    arrays (``__cuda_array_interface__``): their shape, dtype and contiguity are
    checked and they pass through untouched; integer metadata given on the
    device is copied to the host (small). ``attention_sinks`` is checked (the
    caller reads it back with :func:`as_attention_sinks`); ``kv_layout`` says how to
    read the pages' shapes. Raises an error naming the argument.
    """
    q, k_pages, v_pages, T, head_dim = check_arrays(q, k_pages, v_pages, allow_device,
                                                    kv_layout)
    block_tables, seq_lens, query_start_loc, window = check_metadata(
        block_tables, seq_lens, query_start_loc, sliding_window, T, int(v_pages.shape[0]),
        int(v_pages.shape[2]), attention_sinks)
    return PagedAttentionArgs(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc,
                              resolve_scale(scale, head_dim), window)


def check_arrays(q, k_pages, v_pages, allow_device, kv_layout="hnd"):
    """q and the pages: dims, dtypes, shapes that agree. Returns them with ``T, head_dim``."""
    KV_LAYOUTS.check(kv_layout, "kv_layout")
    q = _float_array("q", q, 3, allow_device, cast_to_float32=True)
    k_pages = _float_array("k_pages", k_pages, 4, allow_device, codes=True)
    v_pages = _float_array("v_pages", v_pages, 4, allow_device, codes=True)
    kdt, vdt = np.dtype(k_pages.dtype), np.dtype(v_pages.dtype)
    if kdt not in PAGE_DTYPES:
        raise DTypeError(f"k_pages must be float32, float16, int8 or uint8 (fp8 e4m3 bits), "
                         f"got {kdt}")
    if vdt != kdt:
        raise DTypeError(f"v_pages dtype {vdt} differs from k_pages dtype {kdt}")
    k_shape = tuple(int(n) for n in k_pages.shape)   # the caller's layout, never guessed:
    if kv_layout != "hnd":                           # 16x16 pages fit both
        k_shape = (*k_shape[:2], k_shape[3], k_shape[2])
    if tuple(v_pages.shape) != k_shape:
        raise ShapeError(f"v_pages shape {tuple(v_pages.shape)} differs from k_pages shape "
                         f"{tuple(k_pages.shape)} read as kv_layout={kv_layout!r} (k_transposed:"
                         f" k_pages [num_pages, num_kv_heads, head_dim, page_size])")
    num_pages, num_kv_heads, page_size, head_dim = (int(n) for n in v_pages.shape)
    if min(num_kv_heads, page_size, head_dim) < 1:
        raise ShapeError(f"k_pages, v_pages need nonzero heads, page_size and head_dim, got "
                         f"v_pages [num_pages, num_kv_heads, page_size, head_dim] {v_pages.shape}")
    T, num_heads, q_head_dim = (int(n) for n in q.shape)
    if q_head_dim != head_dim:
        raise ShapeError(f"q head_dim {q_head_dim} differs from k_pages head_dim {head_dim}")
    if num_heads < 1 or num_heads % num_kv_heads:
        raise ShapeError(f"q num_heads ({num_heads}) must be a positive multiple of k_pages "
                         f"num_kv_heads ({num_kv_heads}) (GQA groups)")
    return q, k_pages, v_pages, T, head_dim


def check_scales(k_pages, k_scales, v_scales, allow_device=False):
    """The scales 8-bit pages need (float32 ``[num_pages, num_kv_heads, page_size]``
    each), or None for float pages. Returns them C-contiguous."""
    quantized = np.dtype(k_pages.dtype).itemsize == 1
    if not quantized:
        if k_scales is not None or v_scales is not None:
            raise InvalidArgument(f"k_scales/v_scales are for int8 or fp8 pages; k_pages are "
                                  f"{np.dtype(k_pages.dtype)}: pass None")
        return None, None
    want = tuple(int(n) for n in k_pages.shape[:3])
    out = []
    for name, x in (("k_scales", k_scales), ("v_scales", v_scales)):
        if x is None:
            raise InvalidArgument(f"{name} is required with {np.dtype(k_pages.dtype)} pages "
                                  f"(one float32 scale per token and kv head, "
                                  f"cache.layer_scales(layer))")
        if allow_device and hasattr(x, "__cuda_array_interface__"):
            shape, dt = tuple(x.shape), np.dtype(x.dtype)
        elif isinstance(x, np.ndarray):
            shape, dt = x.shape, x.dtype
        else:
            raise DTypeError(f"{name} must be a numpy array, got {type(x).__name__}")
        if dt != np.float32:
            raise DTypeError(f"{name} must be float32, got {dt}")
        if shape != want:
            raise ShapeError(f"{name} must have shape (num_pages, num_kv_heads, page_size) = "
                             f"{want}, got {shape}")
        out.append(x if not isinstance(x, np.ndarray) else np.ascontiguousarray(x))
    return tuple(out)


def check_metadata(block_tables, seq_lens, query_start_loc, sliding_window, T, num_pages,
                    page_size, attention_sinks=None, kv_layout="hnd"):
    """The integer metadata of ``T`` query tokens over ``num_pages`` pages of ``page_size``.

    Returns ``block_tables, seq_lens, query_start_loc`` as int32 C-contiguous
    arrays and the window as an int (0 = none). ``attention_sinks`` is checked
    against the window (:func:`as_attention_sinks`) and its pages counted as used.
    """
    KV_LAYOUTS.check(kv_layout, "kv_layout")
    block_tables = int_array("block_tables", block_tables, 2)
    seq_lens = int_array("seq_lens", seq_lens, 1)
    B, max_pages = block_tables.shape
    if seq_lens.shape[0] != B:
        raise ShapeError(f"seq_lens has {seq_lens.shape[0]} entries but block_tables has "
                         f"{B} rows")
    if B and seq_lens.min() < 0:
        raise InvalidArgument(f"seq_lens must be >= 0, got {int(seq_lens.min())} at index "
                              f"{int(seq_lens.argmin())}")
    if B and seq_lens.max() > _INT32_MAX:
        raise InvalidArgument(f"seq_lens must fit in int32, got {int(seq_lens.max())}")
    n_pages = -(-seq_lens // page_size)                          # [B] pages each sequence uses
    if B and n_pages.max() > max_pages:
        b = int(np.argmax(n_pages > max_pages))
        raise InvalidBlockTable(
            f"block_tables has {max_pages} columns but sequence {b} (seq_lens={int(seq_lens[b])}"
            f", page_size={page_size}) needs {int(n_pages[b])} pages")

    if query_start_loc is None:
        if T != B:
            raise ShapeError(f"q has {T} query tokens but query_start_loc=None means one "
                             f"query per sequence (B={B}); pass query_start_loc")
        query_start_loc = np.arange(B + 1, dtype=np.int64)
    else:
        query_start_loc = int_array("query_start_loc", query_start_loc, 1)
        if query_start_loc.shape[0] != B + 1:
            raise ShapeError(f"query_start_loc must have B+1 = {B + 1} entries, got "
                             f"{query_start_loc.shape[0]}")
        if query_start_loc[0] != 0:
            raise InvalidArgument(f"query_start_loc[0] must be 0, got {int(query_start_loc[0])}")
        if query_start_loc[-1] != T:
            raise InvalidArgument(f"query_start_loc[-1] must equal q's token count {T}, got "
                                  f"{int(query_start_loc[-1])}")
    n_q = np.diff(query_start_loc)                               # [B] queries per sequence
    if B and n_q.min() < 0:
        raise InvalidArgument(f"query_start_loc must be nondecreasing (decreases after index "
                              f"{int(n_q.argmin())})")
    too_many = n_q > seq_lens                                    # [B]
    if too_many.any():
        b = int(np.argmax(too_many))
        what = ("a query on a sequence with seq_lens == 0" if seq_lens[b] == 0
                else f"{int(n_q[b])} queries but seq_lens={int(seq_lens[b])}")
        raise InvalidArgument(f"query_start_loc/seq_lens: sequence {b} has {what}; a sequence "
                              f"cannot have more queries than tokens in the cache")
    window = as_sliding_window(sliding_window)
    sinks = as_attention_sinks(attention_sinks, window)
    # Pages wholly before every query's window are never read: they may be -1
    # (the engine gives them back, see PagedKVCache.release_pages_before), except
    # the pages of the sink tokens, which every query reads.
    first_live = np.maximum((seq_lens - n_q - window + 1) // page_size, 0) if window else None
    _check_page_ids(block_tables, n_pages, num_pages, first_live, -(-sinks // page_size))

    return (np.ascontiguousarray(block_tables, dtype=np.int32),
            np.ascontiguousarray(seq_lens, dtype=np.int32),
            np.ascontiguousarray(query_start_loc, dtype=np.int32), window)


def _check_page_ids(block_tables, n_pages, num_pages, first_live=None, sink_pages=0):
    """Every page id a sequence uses is in ``[0, num_pages)``: O(B * max_pages).

    ``first_live`` [B] (sliding window): entries before it are not used, bar
    the first ``sink_pages`` (the attention sinks' pages).
    """
    cols = np.arange(block_tables.shape[1])[None, :]                     # [1, max_pages]
    used = cols < n_pages[:, None]                                       # [B, max_pages]
    if first_live is not None:
        used &= (cols >= first_live[:, None]) | (cols < sink_pages)      # [B, max_pages]
    bad = used & ((block_tables < 0) | (block_tables >= num_pages))      # [B, max_pages]
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        page = int(block_tables[b, i])
        why = "-1 (a hole: no page)" if page == -1 else f"{page}, outside [0, {num_pages})"
        raise InvalidBlockTable(f"block_tables[{b}, {i}] is {why}, but sequence {b} uses its "
                                f"first {int(n_pages[b])} entries")


def _float_array(name, x, ndim, allow_device, cast_to_float32=False, codes=False):
    """A float array of ``ndim`` dims, C-contiguous (copied if needed); ``codes``:
    int8/uint8 (8-bit pages) too."""
    kinds = "fiu" if codes else "f"
    if allow_device and hasattr(x, "__cuda_array_interface__"):
        cai = x.__cuda_array_interface__
        if len(cai["shape"]) != ndim:
            raise ShapeError(f"{name} must be {ndim}-D, got shape {tuple(cai['shape'])}")
        if np.dtype(cai["typestr"]).kind not in kinds:
            raise DTypeError(f"{name} must have a float dtype, got {np.dtype(cai['typestr'])}")
        if cast_to_float32 and np.dtype(cai["typestr"]) != np.float32:
            raise DTypeError(f"{name} on the device must be float32, got "
                             f"{np.dtype(cai['typestr'])}")
        if cai.get("strides") is not None and not _c_strides(cai, ndim):
            raise InvalidArgument(f"{name} on the device must be C-contiguous")
        return x
    if not isinstance(x, np.ndarray):
        raise DTypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ShapeError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if x.dtype.kind not in kinds:
        raise DTypeError(f"{name} must have a float dtype, got {x.dtype}")
    if cast_to_float32:
        return np.ascontiguousarray(x, dtype=np.float32)
    return np.ascontiguousarray(x)


def _c_strides(cai, ndim):
    shape, itemsize = cai["shape"], np.dtype(cai["typestr"]).itemsize
    want, step = [], itemsize
    for n in reversed(shape):
        want.append(step)
        step *= n
    return tuple(cai["strides"]) == tuple(reversed(want))


def int_array(name, x, ndim):
    """An integer (not bool) array of ``ndim`` dims from an array-like."""
    if hasattr(x, "copy_to_host") and not isinstance(x, np.ndarray):
        x = x.copy_to_host()                     # small metadata from the device
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError) as e:
        raise DTypeError(f"{name} must be an integer array: {e}") from e
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"{name} must have an integer dtype (not bool/float), got {arr.dtype}")
    if arr.ndim != ndim:
        raise ShapeError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    return arr.astype(np.int64, copy=False)       # int64 while checking: no overflow


def resolve_scale(scale, head_dim) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    real = (int, float, np.integer, np.floating)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, real):
        raise DTypeError(f"scale must be a real number, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise InvalidArgument(f"scale must be finite and > 0, got {scale!r}")
    return float(scale)


def as_sliding_window(window) -> int:
    if window is None:
        return 0
    window = check_positive_int("sliding_window", window)  # None (no window) is above
    return min(window, int(_INT32_MAX))   # a window past any seq_len = no window


def as_attention_sinks(sinks, window: int) -> int:
    """The first tokens every query sees (StreamingLLM's attention sinks): an int >= 0,
    at most the window (0 without a window: every key is seen anyway)."""
    sinks = check_int("attention_sinks", 0 if sinks is None else sinks, low=0)
    if window and sinks > window:
        raise InvalidArgument(f"attention_sinks={sinks} is larger than sliding_window="
                              f"{window}: sinks are a few first tokens kept beside a longer window "
                              f"(StreamingLLM keeps 4 beside ~1,000); use at most {window}")
    return sinks if window else 0


def check_q_sinks(q_sinks, q, allow_device=False):
    """The sinks' queries: like ``q`` (same shape), float32 C-contiguous; None stays None."""
    if q_sinks is None:
        return None
    q_sinks = _float_array("q_sinks", q_sinks, 3, allow_device, cast_to_float32=True)
    if tuple(q_sinks.shape) != tuple(q.shape):
        raise ShapeError(f"q_sinks must have q's shape {tuple(q.shape)}, got "
                         f"{tuple(q_sinks.shape)}")
    return q_sinks
