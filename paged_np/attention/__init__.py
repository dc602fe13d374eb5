"""Paged attention: validate the inputs once, then hand them to a backend.

``paged_attention(...)`` is the one public entry. It checks every argument
(cheaply: nothing here reads the pages' contents), normalises them to the
internal contract, and calls ``forward(...)`` of one backend module:

=========  ==========================================  =========================
backend    module                                      what it is
=========  ==========================================  =========================
"numpy"    :mod:`paged_np.attention.numpy_paged`       the lesson, page by page
"numba"    :mod:`paged_np.attention.numba_cpu`         jitted, parallel CPU
"cuda"     :mod:`paged_np.attention.numba_cuda`        optional ``numba.cuda``
"auto"     cuda for device arrays, else numba if it imports, else numpy
=========  ==========================================  =========================

The table itself lives in :data:`paged_np.registry.ATTENTION_BACKENDS`, which the
engine, the command line and ``info`` read too: a new backend is one module
with a ``forward`` and one line there.

The jitted backends do not check bounds (a bad page id there is a segfault, not
an exception), which is why validation is complete and lives here, in one place:
:func:`validate_paged_attention_inputs` returns the normalised arguments, in the
order ``forward`` takes them, for any backend to reuse.

Also here: :func:`merge_attention_states` (from :mod:`.split_k`) and the dense
ground truth in :mod:`.reference`.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..checks import check_int, check_positive_int
from ..config import KV_DTYPES
from ..errors import (  # BackendUnavailable: defined in errors, still importable from here
    BackendUnavailable,
    DTypeError,
    InvalidArgument,
    InvalidBlockTable,
    PagedNPError,
    ShapeError,
)
from ..registry import ATTENTION_BACKENDS, backend_names, check_backend
from .split_k import merge_attention_states

#: Every name ``paged_attention(backend=...)`` takes (the registry's backends, then "auto").
BACKENDS = backend_names()
_INT32_MAX = np.iinfo(np.int32).max


class PagedAttentionArgs(NamedTuple):
    """Validated arguments, in the order of a backend's ``forward`` (bar ``return_lse``)."""

    q: object                  # float32 [T, num_heads, head_dim]
    k_pages: object            # float32|float16 [num_pages, num_kv_heads, page_size, head_dim]
    v_pages: object            # same as k_pages
    block_tables: np.ndarray   # int32 [B, max_pages]
    seq_lens: np.ndarray       # int32 [B]
    query_start_loc: np.ndarray  # int32 [B+1]
    scale: float
    sliding_window: int        # 0 = no window


@dataclass(frozen=True, eq=False)
class AttentionMetadata:
    """One step's batch layout, validated once and shared by every layer.

    A model calls :func:`paged_attention` once per layer, and every layer of a
    step reads the same block tables, sequence lengths and query offsets: only
    q and the layer's pages change. Checking that metadata again per layer, and
    planning the kernel's work again, cost more than the attention itself at
    batch 1 (``benchmarks/attention_dispatch.py``). So, as in vLLM (whose
    metadata builder runs once per step), the metadata is checked once, when
    it is made, and ``paged_attention(q, k_pages, v_pages, metadata=meta)``
    checks only what a layer brings: q and the pages.

    Make it with :meth:`build`. Constructing it directly validates the same
    way (``sliding_window`` is then an int, 0 for none). The arrays it keeps
    are read-only int32 copies, so nothing can change them after the check
    (the jitted kernels trust every page id in them).

    ``plans`` holds each backend's work plan, made by the first layer that
    needs it and reused by the rest (the numba backend's item list; see
    :mod:`paged_np.attention.numba_cpu`).
    """

    block_tables: np.ndarray     # int32 [B, max_pages]
    seq_lens: np.ndarray         # int32 [B]
    query_start_loc: np.ndarray  # int32 [B+1]
    sliding_window: int          # 0 = no window
    num_pages: int               # the page ids were checked against this many pages
    page_size: int
    plans: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        num_pages = check_int("num_pages", self.num_pages, low=0)
        page_size = check_positive_int("page_size", self.page_size)
        window = check_int("sliding_window", self.sliding_window, low=0)
        qsl = self.query_start_loc
        if qsl is None:  # one query per sequence
            T = int(np.shape(self.block_tables)[0]) if np.ndim(self.block_tables) else 0
        else:
            qsl = _int_array("query_start_loc", qsl, 1)
            T = int(qsl[-1]) if qsl.size else 0
        arrays = _check_metadata(self.block_tables, self.seq_lens, qsl, window or None, T,
                                 num_pages, page_size)[:3]
        for name, arr in zip(("block_tables", "seq_lens", "query_start_loc"), arrays):
            arr = arr.copy()  # our own, read-only: checked once, trusted by every layer
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "num_pages", num_pages)
        object.__setattr__(self, "page_size", page_size)
        object.__setattr__(self, "sliding_window", window)

    @property
    def num_tokens(self) -> int:
        """``T``: the query tokens of the step (``query_start_loc[-1]``)."""
        return int(self.query_start_loc[-1])

    @classmethod
    def build(cls, block_tables, seq_lens, query_start_loc=None, sliding_window=None, *,
              num_pages, page_size) -> "AttentionMetadata":
        """Check the step's metadata against an arena of ``num_pages`` pages of ``page_size``.

        The arguments and errors are :func:`paged_attention`'s
        (``query_start_loc=None``: one query per sequence; ``sliding_window``
        None or >= 1).
        """
        return cls(block_tables, seq_lens, query_start_loc, _sliding_window(sliding_window),
                   num_pages, page_size)


def paged_attention(q, k_pages, v_pages, block_tables=None, seq_lens=None,
                    query_start_loc=None, scale=None, sliding_window=None, backend="auto",
                    return_lse=False, *, metadata=None):
    """Attention of a batch of queries over a paged KV cache.

    Query ``i`` of sequence ``b`` (with ``n_q`` queries) sits at position
    ``seq_lens[b] - n_q + i`` and sees keys at positions ``<=`` its own (and
    ``> position - sliding_window``). Query head ``h`` reads kv head
    ``h // (num_heads // num_kv_heads)``.

    Non-contiguous host arrays are copied to C order first (a full copy of the
    pages if they are strided: pass ``cache.layer(i)`` views, which are contiguous).

    Parameters
    ----------
    q : ndarray, float32 ``[T, num_heads, head_dim]``
        ``T`` = query tokens of the batch. float16/float64 are cast to float32 (a copy).
    k_pages, v_pages : ndarray ``[num_pages, num_kv_heads, page_size, head_dim]``
        Both float32 or both float16 (typically ``cache.layer(i)``); compute is float32.
    block_tables : int array ``[B, max_pages]``
        For sequence ``b`` the first ``ceil(seq_lens[b] / page_size)`` entries are
        page ids, the rest ignored. With a sliding window, entries of pages that
        lie wholly before every query's window are never read and may be -1.
    seq_lens : int array ``[B]``
        Tokens of each sequence in the cache (this step's included).
    query_start_loc : int array ``[B+1]``, optional
        Cumulative query counts (``0``, ..., ``T``); None means one query per
        sequence (decode, ``T == B``).
    scale : float, optional
        ``> 0``, default ``1 / sqrt(head_dim)``.
    sliding_window : int, optional
        ``>= 1`` or None: a query sees its last ``sliding_window`` keys.
    backend : {"auto", "numpy", "numba", "cuda"}
        "auto" picks cuda for device arrays, else numba if it imports, else numpy.
    return_lse : bool
        Also return the log-sum-exp of each row's scaled scores.
    metadata : AttentionMetadata, optional
        In place of ``block_tables``, ``seq_lens``, ``query_start_loc`` and
        ``sliding_window`` (leave those None): the step's metadata, checked once
        by :meth:`AttentionMetadata.build` and passed to every layer.

    Returns
    -------
    out : ndarray, float32 ``[T, num_heads, head_dim]``
    lse : ndarray, float32 ``[T, num_heads]``
        Natural log; only when ``return_lse`` is True (then ``(out, lse)`` is returned).

    Example
    -------
    >>> import numpy as np, paged_np as pnp
    >>> rng = np.random.default_rng(0)
    >>> k_pages = rng.standard_normal((4, 1, 2, 8), dtype=np.float32)  # 4 pages of 2 tokens
    >>> v_pages = rng.standard_normal((4, 1, 2, 8), dtype=np.float32)
    >>> q = rng.standard_normal((1, 2, 8), dtype=np.float32)      # one decode query, 2 heads
    >>> out = pnp.paged_attention(q, k_pages, v_pages, np.array([[3, 0]]), np.array([3]),
    ...                           backend="numpy")
    >>> out.shape
    (1, 2, 8)
    """
    check_backend(backend)
    if not isinstance(return_lse, (bool, np.bool_)):
        raise DTypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    name = _resolve_backend(backend, q)
    extra = {}
    if metadata is None:
        args = validate_paged_attention_inputs(q, k_pages, v_pages, block_tables, seq_lens,
                                               query_start_loc, scale, sliding_window,
                                               allow_device=(name == "cuda"))
    else:
        args = _with_metadata(q, k_pages, v_pages, metadata, scale, name == "cuda",
                              block_tables=block_tables, seq_lens=seq_lens,
                              query_start_loc=query_start_loc, sliding_window=sliding_window)
        if name == "numba":  # the one backend with a plan worth keeping across layers
            extra["plans"] = metadata.plans
    out, lse = load_backend(name).forward(*args, bool(return_lse), **extra)
    return (out, lse) if return_lse else out


def _with_metadata(q, k_pages, v_pages, metadata, scale, allow_device, **unused):
    """The arguments of a call with ``metadata``: only q and the pages are new."""
    if not isinstance(metadata, AttentionMetadata):
        raise DTypeError(f"metadata must be an AttentionMetadata (AttentionMetadata.build), "
                         f"got {type(metadata).__name__}")
    for name, value in unused.items():
        if value is not None:
            raise InvalidArgument(f"{name} must be None when metadata is given (the metadata "
                                  f"holds it)")
    q, k_pages, v_pages, T, head_dim = _check_arrays(q, k_pages, v_pages, allow_device)
    num_pages, page_size = int(k_pages.shape[0]), int(k_pages.shape[2])
    if (num_pages, page_size) != (metadata.num_pages, metadata.page_size):
        raise ShapeError(f"k_pages has {num_pages} pages of {page_size} tokens but metadata "
                         f"was built for {metadata.num_pages} pages of {metadata.page_size}")
    if T != metadata.num_tokens:
        raise ShapeError(f"q has {T} query tokens but metadata's query_start_loc ends at "
                         f"{metadata.num_tokens}")
    return PagedAttentionArgs(q, k_pages, v_pages, metadata.block_tables, metadata.seq_lens,
                              metadata.query_start_loc, _scale(scale, head_dim),
                              metadata.sliding_window)


# ---------------------------------------------------------------------------
# Backend choice.
# ---------------------------------------------------------------------------
_load_errors: dict = {}


def load_backend(name: str):
    """The backend module for ``name`` ("numpy", "numba" or "cuda").

    Raises :class:`BackendUnavailable` (an ``ImportError``) with the import's own
    message (for cuda it names the ``cuda`` install extra) when it cannot load.
    """
    module = ATTENTION_BACKENDS[name].module
    try:
        return importlib.import_module(module)
    except PagedNPError as e:          # the module's own clear refusal: let it through
        _load_errors[name] = e
        raise
    except Exception as e:  # ImportError, numba/cuda driver errors, ...
        _load_errors[name] = e
        raise BackendUnavailable(
            f"backend={name!r} is unavailable: {module} failed to "
            f"import ({type(e).__name__}: {e})") from e


def _resolve_backend(backend: str, q) -> str:
    """"auto" -> "cuda" for a device q, else "numba" if it imports, else "numpy"."""
    if backend != "auto":
        return backend
    if hasattr(q, "__cuda_array_interface__"):           # no eager numba.cuda import
        return "cuda"
    if "numba" not in _load_errors:
        try:
            load_backend("numba")
            return "numba"
        except PagedNPError:                             # includes BackendUnavailable
            pass
    return "numpy"


# ---------------------------------------------------------------------------
# Validation: O(B * max_pages) work at most, never a pass over page contents.
# ---------------------------------------------------------------------------
def validate_paged_attention_inputs(q, k_pages, v_pages, block_tables, seq_lens,
                                    query_start_loc=None, scale=None, sliding_window=None,
                                    allow_device=False) -> PagedAttentionArgs:
    """Check every argument of :func:`paged_attention`; return them normalised.

    Normalised means: q float32 C-contiguous; pages C-contiguous; block_tables,
    seq_lens, query_start_loc int32 C-contiguous numpy arrays (query_start_loc
    built as ``0..B`` when None); scale a float; sliding_window an int (0 = none).

    With ``allow_device=True`` (the cuda backend), q and the pages may be device
    arrays (``__cuda_array_interface__``): their shape, dtype and contiguity are
    checked and they pass through untouched; integer metadata given on the
    device is copied to the host (small). Raises an error naming the argument.
    """
    q, k_pages, v_pages, T, head_dim = _check_arrays(q, k_pages, v_pages, allow_device)
    block_tables, seq_lens, query_start_loc, window = _check_metadata(
        block_tables, seq_lens, query_start_loc, sliding_window, T, int(k_pages.shape[0]),
        int(k_pages.shape[2]))
    return PagedAttentionArgs(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc,
                              _scale(scale, head_dim), window)


def _check_arrays(q, k_pages, v_pages, allow_device):
    """q and the pages: dims, dtypes, shapes that agree. Returns them with ``T, head_dim``."""
    q = _float_array("q", q, 3, allow_device, cast_to_float32=True)
    k_pages = _float_array("k_pages", k_pages, 4, allow_device)
    v_pages = _float_array("v_pages", v_pages, 4, allow_device)
    kdt, vdt = np.dtype(k_pages.dtype), np.dtype(v_pages.dtype)
    if kdt not in KV_DTYPES:
        raise DTypeError(f"k_pages must be float32 or float16, got {kdt}")
    if vdt != kdt:
        raise DTypeError(f"v_pages dtype {vdt} differs from k_pages dtype {kdt}")
    if tuple(v_pages.shape) != tuple(k_pages.shape):
        raise ShapeError(f"v_pages shape {tuple(v_pages.shape)} differs from k_pages "
                         f"shape {tuple(k_pages.shape)}")
    num_pages, num_kv_heads, page_size, head_dim = (int(n) for n in k_pages.shape)
    if min(num_kv_heads, page_size, head_dim) < 1:
        raise ShapeError(f"k_pages [num_pages, num_kv_heads, page_size, head_dim] needs "
                         f"nonzero heads, page_size and head_dim, got {tuple(k_pages.shape)}")
    T, num_heads, q_head_dim = (int(n) for n in q.shape)
    if q_head_dim != head_dim:
        raise ShapeError(f"q head_dim {q_head_dim} differs from k_pages head_dim {head_dim}")
    if num_heads < 1 or num_heads % num_kv_heads:
        raise ShapeError(f"q num_heads ({num_heads}) must be a positive multiple of k_pages "
                         f"num_kv_heads ({num_kv_heads}) (GQA groups)")
    return q, k_pages, v_pages, T, head_dim


def _check_metadata(block_tables, seq_lens, query_start_loc, sliding_window, T, num_pages,
                    page_size):
    """The integer metadata of ``T`` query tokens over ``num_pages`` pages of ``page_size``.

    Returns ``block_tables, seq_lens, query_start_loc`` as int32 C-contiguous
    arrays and the window as an int (0 = none).
    """
    block_tables = _int_array("block_tables", block_tables, 2)
    seq_lens = _int_array("seq_lens", seq_lens, 1)
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
        query_start_loc = _int_array("query_start_loc", query_start_loc, 1)
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
    window = _sliding_window(sliding_window)
    # Pages wholly before every query's window are never read: they may be -1
    # (the engine gives them back, see PagedKVCache.release_pages_before).
    first_live = np.maximum((seq_lens - n_q - window + 1) // page_size, 0) if window else None
    _check_page_ids(block_tables, n_pages, num_pages, first_live)

    return (np.ascontiguousarray(block_tables, dtype=np.int32),
            np.ascontiguousarray(seq_lens, dtype=np.int32),
            np.ascontiguousarray(query_start_loc, dtype=np.int32), window)


def _check_page_ids(block_tables, n_pages, num_pages, first_live=None):
    """Every page id a sequence uses is in ``[0, num_pages)``: O(B * max_pages).

    ``first_live`` [B] (sliding window): entries before it are not used.
    """
    cols = np.arange(block_tables.shape[1])[None, :]                     # [1, max_pages]
    used = cols < n_pages[:, None]                                       # [B, max_pages]
    if first_live is not None:
        used &= cols >= first_live[:, None]                              # [B, max_pages]
    bad = used & ((block_tables < 0) | (block_tables >= num_pages))      # [B, max_pages]
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        page = int(block_tables[b, i])
        why = "-1 (a hole: no page)" if page == -1 else f"{page}, outside [0, {num_pages})"
        raise InvalidBlockTable(f"block_tables[{b}, {i}] is {why}, but sequence {b} uses its "
                                f"first {int(n_pages[b])} entries")


def _float_array(name, x, ndim, allow_device, cast_to_float32=False):
    """A float array of ``ndim`` dims, C-contiguous (copied if needed)."""
    if allow_device and hasattr(x, "__cuda_array_interface__"):
        cai = x.__cuda_array_interface__
        if len(cai["shape"]) != ndim:
            raise ShapeError(f"{name} must be {ndim}-D, got shape {tuple(cai['shape'])}")
        if np.dtype(cai["typestr"]).kind != "f":
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
    if x.dtype.kind != "f":
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


def _int_array(name, x, ndim):
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


def _scale(scale, head_dim) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    real = (int, float, np.integer, np.floating)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, real):
        raise DTypeError(f"scale must be a real number, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise InvalidArgument(f"scale must be finite and > 0, got {scale!r}")
    return float(scale)


def _sliding_window(window) -> int:
    if window is None:
        return 0
    window = check_positive_int("sliding_window", window)  # None (no window) is above
    return min(window, int(_INT32_MAX))   # a window past any seq_len = no window


__all__ = [
    "BACKENDS",
    "AttentionMetadata",
    "BackendUnavailable",
    "PagedAttentionArgs",
    "load_backend",
    "merge_attention_states",
    "paged_attention",
    "validate_paged_attention_inputs",
]
