"""Configuration: the cache's and the model's shapes, and the JIT flags.

`CacheConfig` fixes everything the arena needs at construction (after that no
step allocates memory that grows with context). `ModelConfig` describes the
small Llama-style model. The Numba options live here, in one place, so every
kernel is compiled the same way.

Environment switches (read once, at import):

- ``PAGED_NP_BOUNDSCHECK=1`` compiles the Numba kernels with bounds checking:
  a bad index then raises ``IndexError`` instead of reading garbage. Slow; for
  debugging and for the one CI test that exercises it.
- ``NUMBA_DISABLE_JIT=1`` (Numba's own) runs the kernels as plain Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
#: lets the CPU backend run its item loops on several Python threads at once
#: (see :mod:`paged_np.attention.numba_cpu`).
JIT_OPTIONS = dict(cache=not BOUNDSCHECK, fastmath=True, nogil=True, boundscheck=BOUNDSCHECK)

EVICTION_POLICIES = ("lru", "fifo", "lfu")
PREFIX_CACHES = ("hash", "radix")
KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def _check_prefix_cache(prefix_cache, eviction_policy, owner: str) -> None:
    if not isinstance(prefix_cache, str) or prefix_cache not in PREFIX_CACHES:
        raise InvalidArgument(
            f"{owner}.prefix_cache must be one of {PREFIX_CACHES}, got {prefix_cache!r}")
    if prefix_cache == "radix" and eviction_policy != "lru":
        raise InvalidArgument(
            f"{owner}.eviction_policy={eviction_policy!r} is for the hash chain: "
            "prefix_cache='radix' always evicts least recently used leaves (use 'lru')")


@dataclass(frozen=True)
class CacheConfig:
    """Shape of the paged KV cache.

    The arena is ``[num_layers, 2, num_pages, num_kv_heads, page_size, head_dim]``
    (``2`` = K and V), allocated once. ``eviction_policy`` is ``"lru"``,
    ``"fifo"``, ``"lfu"`` or a subclass of :class:`~paged_np.EvictionPolicy`
    (each cache makes its own object of it).

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
    #: How cached prefixes are found: "hash" (vLLM's page-hash chain) or
    #: "radix" (SGLang's radix tree, see :mod:`paged_np.cache.radix`).
    prefix_cache: str = "hash"

    def __post_init__(self):
        for name in ("num_pages", "page_size", "num_layers", "num_kv_heads", "head_dim"):
            object.__setattr__(self, name, check_positive_int(f"CacheConfig.{name}",
                                                              getattr(self, name)))
        try:
            dt = np.dtype(self.dtype)
        except TypeError as e:
            raise DTypeError(f"CacheConfig.dtype: not a dtype: {self.dtype!r}") from e
        if dt not in KV_DTYPES:
            raise DTypeError(f"CacheConfig.dtype must be float32 or float16, got {dt}")
        object.__setattr__(self, "dtype", dt)
        from .cache.eviction import EvictionPolicy

        policy = self.eviction_policy
        is_class = isinstance(policy, type) and issubclass(policy, EvictionPolicy)
        if not is_class and not (isinstance(policy, str) and policy in EVICTION_POLICIES):
            raise InvalidArgument(
                f"CacheConfig.eviction_policy must be one of {EVICTION_POLICIES} or an "
                f"EvictionPolicy subclass, got {policy!r}"
            )
        _check_prefix_cache(self.prefix_cache, self.eviction_policy, "CacheConfig")

    @property
    def arena_shape(self) -> tuple:
        return (self.num_layers, 2, self.num_pages, self.num_kv_heads, self.page_size,
                self.head_dim)

    @property
    def num_slots(self) -> int:
        """Token slots in the arena: ``num_pages * page_size`` (may exceed 2**31)."""
        return self.num_pages * self.page_size

    @property
    def bytes_per_page(self) -> int:
        """Bytes one page takes across all layers, K and V."""
        return (self.num_layers * 2 * self.num_kv_heads * self.page_size * self.head_dim
                * self.dtype.itemsize)


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
