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
an exception), which is why validation is complete and lives in one place,
:mod:`.validate`: :func:`validate_paged_attention_inputs` returns the normalised
arguments, in the order ``forward`` takes them, for any backend to reuse.

Also here: :func:`merge_attention_states` (from :mod:`.split_k`, loaded when first
asked for) and the dense ground truth in :mod:`.reference`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

from ..checks import check_int, check_positive_int
from ..errors import (  # BackendUnavailable: defined in errors, still importable from here
    BackendUnavailable,
    DTypeError,
    InvalidArgument,
    PagedNPError,
    ShapeError,
)
from ..registry import ATTENTION_BACKENDS, ATTENTION_THREADS, backend_names, check_backend
from .validate import (
    PagedAttentionArgs,
    as_attention_sinks,
    as_sliding_window,
    check_arrays,
    check_metadata,
    check_q_sinks,
    check_scales,
    int_array,
    resolve_scale,
    validate_paged_attention_inputs,
)

#: Every name ``paged_attention(backend=...)`` takes (the registry's backends, then "auto").
BACKENDS = backend_names()


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

    ``threads`` says whose threads the numba backend runs its items on:
    ``"python"`` (the default: a pool of Python threads, woken only for large
    calls, idle ones asleep) or ``"numba"`` (Numba's OpenMP workers, about a
    microsecond to hand work to when the caller's own work keeps them awake, as
    the quantized model's weight products do; but slow to alternate with BLAS's
    threads, which the float32 model's products use). See
    :func:`paged_np.attention.numba_cpu._attend_items`.
    """

    block_tables: np.ndarray     # int32 [B, max_pages]
    seq_lens: np.ndarray         # int32 [B]
    query_start_loc: np.ndarray  # int32 [B+1]
    sliding_window: int          # 0 = no window
    num_pages: int               # the page ids were checked against this many pages
    page_size: int
    threads: str = "python"      # whose threads run the numba backend's items
    attention_sinks: int = 0     # first tokens every query sees (with a window)
    kv_layout: str = "hnd"       # how the pages lay out K (a name of KV_LAYOUTS)
    plans: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        num_pages = check_int("num_pages", self.num_pages, low=0)
        page_size = check_positive_int("page_size", self.page_size)
        window = check_int("sliding_window", self.sliding_window, low=0)
        ATTENTION_THREADS.check(self.threads, "threads")
        qsl = self.query_start_loc
        if qsl is None:  # one query per sequence
            T = int(np.shape(self.block_tables)[0]) if np.ndim(self.block_tables) else 0
        else:
            qsl = int_array("query_start_loc", qsl, 1)
            T = int(qsl[-1]) if qsl.size else 0
        sinks = as_attention_sinks(self.attention_sinks, window)
        arrays = check_metadata(self.block_tables, self.seq_lens, qsl, window or None, T,
                                 num_pages, page_size, sinks, self.kv_layout)[:3]
        for name, arr in zip(("block_tables", "seq_lens", "query_start_loc"), arrays):
            arr = arr.copy()  # our own, read-only: checked once, trusted by every layer
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "num_pages", num_pages)
        object.__setattr__(self, "page_size", page_size)
        object.__setattr__(self, "sliding_window", window)
        object.__setattr__(self, "attention_sinks", sinks)

    @property
    def num_tokens(self) -> int:
        """``T``: the query tokens of the step (``query_start_loc[-1]``)."""
        return int(self.query_start_loc[-1])

    @classmethod
    def build(cls, block_tables, seq_lens, query_start_loc=None, sliding_window=None, *,
              num_pages, page_size, threads="python", attention_sinks=0,
              kv_layout="hnd") -> "AttentionMetadata":
        """Check the step's metadata against an arena of ``num_pages`` pages of ``page_size``.

        The arguments and errors are :func:`paged_attention`'s
        (``query_start_loc=None``: one query per sequence; ``sliding_window``
        None or >= 1; ``attention_sinks`` >= 0); ``threads`` as in the class docstring.
        """
        return cls(block_tables, seq_lens, query_start_loc, as_sliding_window(sliding_window),
                   num_pages, page_size, threads, attention_sinks, kv_layout=kv_layout)


def paged_attention(q, k_pages, v_pages, block_tables=None, seq_lens=None,
                    query_start_loc=None, scale=None, sliding_window=None, backend="auto",
                    return_lse=False, *, metadata=None, k_scales=None, v_scales=None,
                    attention_sinks=None, q_sinks=None, kv_layout=None):
    """Attention of a batch of queries over a paged KV cache.

    Query ``i`` of sequence ``b`` (with ``n_q`` queries) sits at position
    ``seq_lens[b] - n_q + i`` and sees keys at positions ``<=`` its own (and
    ``> position - sliding_window``, or ``< attention_sinks``). Query head ``h``
    reads kv head ``h // (num_heads // num_kv_heads)``.

    Non-contiguous host arrays are copied to C order first (a full copy of the
    pages if they are strided: pass ``cache.layer(i)`` views, which are contiguous).

    Parameters
    ----------
    q : ndarray, float32 ``[T, num_heads, head_dim]``
        ``T`` = query tokens of the batch. float16/float64 are cast to float32 (a copy).
    k_pages, v_pages : ndarray ``[num_pages, num_kv_heads, page_size, head_dim]``
        Both float32, both float16, or both 8-bit codes: int8, or uint8 holding
        fp8 e4m3 bits (typically ``cache.layer(i)``); compute is float32.
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
    k_scales, v_scales : ndarray, float32 ``[num_pages, num_kv_heads, page_size]``
        Only with 8-bit pages, and then required: element ``d`` of token ``t``
        of a page is ``code * scale[page, head, t]`` (``cache.layer_scales(i)``;
        see :mod:`paged_np.cache.kv_quant`). The kernels widen each code as
        they read it and apply the scale once per score and per weight.
    attention_sinks : int, optional
        With a sliding window: the first ``attention_sinks`` keys stay visible
        to every query (StreamingLLM's attention sinks; at most the window).
        In the metadata when ``metadata`` is given.
    q_sinks : ndarray like ``q``, optional
        The queries that score the sink keys (``j < attention_sinks``); None:
        ``q``. A RoPE model passes ``q`` rotated to its cache-relative position
        (:meth:`paged_np.LlamaModel.forward`), so the distance to a sink never
        grows past ``attention_sinks + sliding_window``.
    kv_layout : {"hnd", "k_transposed"}, optional
        None: "hnd"; "k_transposed": k_pages are ``[.., head_dim, page_size]`` (in the metadata
        when ``metadata`` is given).

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
        layout = "hnd" if kv_layout is None else kv_layout      # checked with the pages
        args = validate_paged_attention_inputs(q, k_pages, v_pages, block_tables, seq_lens,
                                               query_start_loc, scale, sliding_window,
                                               allow_device=(name == "cuda"),
                                               attention_sinks=attention_sinks, kv_layout=layout)
        sinks = as_attention_sinks(attention_sinks, args.sliding_window)
    else:
        args = _with_metadata(q, k_pages, v_pages, metadata, scale, name == "cuda",
                              block_tables=block_tables, seq_lens=seq_lens,
                              query_start_loc=query_start_loc, sliding_window=sliding_window,
                              attention_sinks=attention_sinks, kv_layout=kv_layout)
        sinks, layout = metadata.attention_sinks, metadata.kv_layout
        if name == "numba":  # the one backend with a plan worth keeping across layers
            extra.update(plans=metadata.plans, threads=metadata.threads)
    k_scales, v_scales = check_scales(args.v_pages, k_scales, v_scales, name == "cuda")
    if k_scales is not None:
        extra.update(k_scales=k_scales, v_scales=v_scales)
    q_sinks = check_q_sinks(q_sinks, args.q, name == "cuda")
    if sinks:  # only then: a backend that knows no sinks still serves every other call
        extra.update(attention_sinks=sinks, q_sinks=q_sinks)
    if layout != "hnd":  # the same: a backend that knows only hnd serves every other call
        extra.update(kv_layout=layout)
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
    q, k_pages, v_pages, T, head_dim = check_arrays(q, k_pages, v_pages, allow_device,
                                                    metadata.kv_layout)
    num_pages, page_size = int(v_pages.shape[0]), int(v_pages.shape[2])
    if (num_pages, page_size) != (metadata.num_pages, metadata.page_size):
        raise ShapeError(f"k_pages has {num_pages} pages of {page_size} tokens but metadata "
                         f"was built for {metadata.num_pages} pages of {metadata.page_size}")
    if T != metadata.num_tokens:
        raise ShapeError(f"q has {T} query tokens but metadata's query_start_loc ends at "
                         f"{metadata.num_tokens}")
    return PagedAttentionArgs(q, k_pages, v_pages, metadata.block_tables, metadata.seq_lens,
                              metadata.query_start_loc, resolve_scale(scale, head_dim),
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
    module = ATTENTION_BACKENDS[name].target
    try:
        return ATTENTION_BACKENDS[name].load()
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


def __getattr__(name):
    """``merge_attention_states`` (from :mod:`.split_k`) and the submodules
    (``attention.reference``, ``attention.numba_cpu``, ...) are imported when first asked for."""
    if name == "merge_attention_states":
        from .split_k import merge_attention_states

        return merge_attention_states
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
