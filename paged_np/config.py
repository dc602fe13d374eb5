"""Configuration: the cache's and the model's shapes, and the JIT flags.

`CacheConfig` fixes everything the arena needs at construction (after that no
step allocates memory that grows with context). `ModelConfig` describes the
small Llama-style model. The Numba options live here, in one place, so every
kernel is compiled the same way. The engine's options are
:class:`paged_np.engine.config.EngineConfig`; the names each option may take
live in :mod:`paged_np.registry`.

Environment switches (read once, at import):

- ``PAGED_NP_BOUNDSCHECK=1`` compiles the Numba kernels with bounds checking:
  a bad index then raises ``IndexError`` instead of reading garbage. Slow; for
  debugging and for the one CI test that exercises it.
- ``NUMBA_DISABLE_JIT=1`` (Numba's own) runs the kernels as plain Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .checks import check_positive_int
from .errors import DTypeError, InvalidArgument

# ---------------------------------------------------------------------------
# JIT flags, one place for every kernel.
# ---------------------------------------------------------------------------
BOUNDSCHECK = os.environ.get("PAGED_NP_BOUNDSCHECK", "0") not in ("", "0")

#: Options for every jitted kernel.
#: ``fastmath`` lets LLVM reorder float sums (vectorise them); it also assumes
#: no infinities, so kernels never start a running max at ``-inf``. ``nogil``
#: lets Python threads (the server's, a user's) call kernels side by side.
#: ``cache``: compiled code is kept in ``__pycache__`` (``*.nbi``, ``*.nbc``), checked
#: against the kernel's own file only, so a kernel keeps its cached code when only a
#: helper it calls from another module changed: after editing such a helper (say
#: ``attention/numba_kernels.py``), delete those files before timing anything. A fresh
#: clone has none.
JIT_OPTIONS = dict(cache=not BOUNDSCHECK, fastmath=True, nogil=True, boundscheck=BOUNDSCHECK)



def check_choice(name: str, value, choices) -> None:
    """Raise InvalidArgument naming ``name`` unless ``value`` is one of ``choices``
    (a :class:`~paged_np.registry.Registry` or any collection of names)."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgument(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_eviction_policy(name: str, policy) -> None:
    """A registered policy name, an EvictionPolicy class, or an object with a
    ``priority(entry)`` method (an EvictionPolicy instance)."""
    from .registry import EVICTION_POLICIES

    if isinstance(policy, str) and policy in EVICTION_POLICIES:
        return
    if isinstance(policy, type) or callable(getattr(policy, "priority", None)):
        return
    raise InvalidArgument(f"{name} must be one of {EVICTION_POLICIES.names()}, an "
                          f"EvictionPolicy subclass or instance, got {policy!r}")


def kv_format(dtype) -> str:
    """The KV format's name (a key of :data:`~paged_np.registry.KV_FORMATS`) of a name
    or a storage dtype: "auto" and float32 -> "float32", uint8 -> "fp8_e4m3" (its bits)."""
    from .registry import KV_FORMATS

    if isinstance(dtype, str):
        if dtype == "auto":
            return "float32"
        if dtype not in KV_FORMATS:
            raise DTypeError(f"kv_cache_dtype must be one of {('auto', *KV_FORMATS)}, "
                             f"got {dtype!r}")
        return dtype
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(f"CacheConfig.dtype: not a dtype: {dtype!r}") from e
    for name, entry in KV_FORMATS.items():
        if np.dtype(entry.storage) == dt:
            return name
    raise DTypeError(f"CacheConfig.dtype must be a KV format name {('auto', *KV_FORMATS)} "
                     f"or the dtype one stores, got {dt}")


def storage_dtype(fmt: str) -> np.dtype:
    """The NumPy dtype one element of a page of format ``fmt`` is stored as."""
    from .registry import KV_FORMATS

    return np.dtype(KV_FORMATS[kv_format(fmt)].storage)


def qmax(fmt: str) -> float | None:
    """The largest code of an 8-bit format (its values are code * scale), else None."""
    from .registry import KV_FORMATS

    return KV_FORMATS[kv_format(fmt)].qmax


@dataclass(frozen=True)
class CacheConfig:
    """Shape of the paged KV cache.

    The arena is ``[num_layers, 2, num_pages, num_kv_heads, page_size, head_dim]``
    (``2`` = K and V), allocated once. ``dtype`` names the KV format (a key of
    :data:`~paged_np.registry.KV_FORMATS`, or ``"auto"``) or gives the dtype
    one stores; :attr:`kv_format` keeps the name and ``dtype`` becomes the
    storage dtype (fp8 as uint8). The 8-bit formats add a float32 scale per
    (token, kv head), ``scales_shape``. ``eviction_policy`` is a name of
    :data:`~paged_np.registry.EVICTION_POLICIES`, a subclass of
    :class:`~paged_np.EvictionPolicy` (each cache makes its own object of
    it) or a policy object.

    Example
    -------
    >>> cfg = CacheConfig(num_pages=64, page_size=16, num_layers=2,
    ...                   num_kv_heads=2, head_dim=64)
    >>> cfg.arena_shape
    (2, 2, 64, 2, 16, 64)
    """

    num_pages: int
    page_size: int = 16
    num_layers: int = 1
    num_kv_heads: int = 1
    head_dim: int = 64
    dtype: object = np.float32
    eviction_policy: object = "lru"
    #: How cached prefixes are found: a name of :data:`~paged_np.registry.PREFIX_INDEXES`,
    #: "hash" (vLLM's page-hash chain) or "radix" (SGLang's radix tree).
    prefix_cache: str = "hash"
    #: How a page lays out K: a name of :data:`~paged_np.registry.KV_LAYOUTS`.
    kv_layout: str = "hnd"
    #: The format's name (set from ``dtype``): a key of :data:`~paged_np.registry.KV_FORMATS`.
    kv_format: str = field(init=False, default="float32")

    def __post_init__(self):
        for name in ("num_pages", "page_size", "num_layers", "num_kv_heads", "head_dim"):
            object.__setattr__(self, name, check_positive_int(f"CacheConfig.{name}",
                                                              getattr(self, name)))
        from .registry import KV_LAYOUTS, PREFIX_INDEXES

        name = kv_format(self.dtype)
        object.__setattr__(self, "kv_format", name)
        object.__setattr__(self, "dtype", storage_dtype(name))
        check_eviction_policy("CacheConfig.eviction_policy", self.eviction_policy)
        check_choice("CacheConfig.prefix_cache", self.prefix_cache, PREFIX_INDEXES)
        check_choice("CacheConfig.kv_layout", self.kv_layout, KV_LAYOUTS)

    @property
    def arena_shape(self) -> tuple:
        return (self.num_layers, 2, self.num_pages, self.num_kv_heads, self.page_size,
                self.head_dim)

    @property
    def kv_cache_dtype(self) -> str:
        """vLLM's name for :attr:`kv_format`."""
        return self.kv_format

    @property
    def quantized(self) -> bool:
        """Whether pages hold 8-bit codes with a scale per (token, kv head)."""
        return qmax(self.kv_format) is not None

    @property
    def scales_shape(self) -> tuple:
        """``[num_layers, 2, num_pages, num_kv_heads, page_size]``: a scale per token-head."""
        return self.arena_shape[:-1]

    @property
    def num_slots(self) -> int:
        """Token slots in the arena: ``num_pages * page_size`` (may exceed 2**31)."""
        return self.num_pages * self.page_size

    @property
    def bytes_per_page(self) -> int:
        """Bytes one page takes across all layers, K and V (its scales included)."""
        per_row = self.head_dim * self.dtype.itemsize + (4 if self.quantized else 0)
        return self.num_layers * 2 * self.num_kv_heads * self.page_size * per_row


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder (see :mod:`paged_np.models.llama`).

    The defaults are the small random test model. A real checkpoint's loader
    fills every field from the file (:func:`paged_np.load_model`); SmolLM2-135M
    is ``vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, intermediate_size=1536, rope_theta=100000,
    tie_word_embeddings=True, max_position_embeddings=8192``.

    ``tie_word_embeddings``: the LM head is the embedding matrix transposed
    (no separate ``lm_head`` weight). ``max_position_embeddings``: the context
    the checkpoint was trained for (informational: RoPE itself has no limit).
    """

    vocab_size: int = 256
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    #: The model family (a key of :data:`paged_np.registry.ARCHITECTURES`): which class runs it.
    architecture: str = "llama"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "max_position_embeddings"):
            object.__setattr__(self, name, check_positive_int(f"ModelConfig.{name}",
                                                              getattr(self, name)))
        if self.num_heads % self.num_kv_heads:
            raise InvalidArgument(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise InvalidArgument(
                f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise InvalidArgument(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}")
        if not (isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0):
            raise InvalidArgument(
                f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.sliding_window is not None:
            object.__setattr__(self, "sliding_window", check_positive_int(
                "ModelConfig.sliding_window", self.sliding_window))
        if not isinstance(self.tie_word_embeddings, (bool, np.bool_)):
            raise DTypeError("ModelConfig.tie_word_embeddings must be a bool, got "
                             f"{type(self.tie_word_embeddings).__name__}")
        object.__setattr__(self, "tie_word_embeddings", bool(self.tie_word_embeddings))
        from .registry import ARCHITECTURES

        check_choice("ModelConfig.architecture", self.architecture, ARCHITECTURES)
