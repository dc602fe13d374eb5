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
from dataclasses import dataclass, field

import numpy as np

from .checks import check_int, check_positive_int
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

EVICTION_POLICIES = ("lru", "fifo", "lfu")
#: Whose threads run the numba attention backend's items (``AttentionMetadata.threads``).
ATTENTION_THREADS = ("python", "numba")
PREFIX_CACHES = ("hash", "radix")
KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
#: kv_cache_dtype (vLLM's name) -> the NumPy dtype one K/V element is stored as
#: (see :mod:`paged_np.cache.kv_quant`; "auto" is float32, fp8 is kept as its bits).
KV_CACHE_DTYPES = {"auto": np.dtype(np.float32), "float32": np.dtype(np.float32),
                   "float16": np.dtype(np.float16), "int8": np.dtype(np.int8),
                   "fp8_e4m3": np.dtype(np.uint8)}
#: The 8-bit formats, which keep a float32 scale per (token, kv head), and their largest code.
QMAX = {"int8": 127.0, "fp8_e4m3": 448.0}
PREEMPTION_MODES = ("recompute", "swap")
#: The order waiting requests are admitted in (see :mod:`paged_np.engine.schedule_policy`).
SCHEDULES = ("fcfs", "lpm")
#: How draft tokens are proposed (see :mod:`paged_np.engine.spec_decode`).
SPEC_METHODS = ("ngram",)


def check_choice(name: str, value, choices) -> None:
    """Raise InvalidArgument naming ``name`` unless ``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgument(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_eviction_policy(name: str, policy) -> None:
    """A policy name, or a class (checked to be an EvictionPolicy when the cache makes it)."""
    if not isinstance(policy, type) and not (isinstance(policy, str)
                                             and policy in EVICTION_POLICIES):
        raise InvalidArgument(
            f"{name} must be one of {EVICTION_POLICIES} or an EvictionPolicy subclass, "
            f"got {policy!r}")


def kv_format(dtype) -> str:
    """The canonical kv_cache_dtype of a name or a dtype: "auto" and float32 -> "float32"."""
    if isinstance(dtype, str):
        if dtype not in KV_CACHE_DTYPES:
            raise DTypeError(f"kv_cache_dtype must be one of {tuple(KV_CACHE_DTYPES)}, "
                             f"got {dtype!r}")
        return "float32" if dtype == "auto" else dtype
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(f"CacheConfig.dtype: not a dtype: {dtype!r}") from e
    names = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
             np.dtype(np.int8): "int8"}
    if dt not in names:
        raise DTypeError(f"CacheConfig.dtype must be float32, float16 or int8 (or a name of "
                         f"{tuple(KV_CACHE_DTYPES)}), got {dt}")
    return names[dt]


@dataclass(frozen=True)
class CacheConfig:
    """Shape of the paged KV cache.

    The arena is ``[num_layers, 2, num_pages, num_kv_heads, page_size, head_dim]``
    (``2`` = K and V), allocated once. ``dtype`` is a kv_cache_dtype name
    (``"auto"``, ``"float32"``, ``"float16"``, ``"int8"``, ``"fp8_e4m3"``) or
    the NumPy dtype float32/float16/int8; it is kept as the storage dtype
    (fp8 as uint8) and :attr:`kv_cache_dtype` gives the name back. The 8-bit
    formats add a float32 scale per (token, kv head), ``scales_shape``.
    ``eviction_policy`` is ``"lru"``,
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
        if isinstance(self.dtype, np.dtype) and self.dtype == np.uint8:
            name = "fp8_e4m3"                        # the storage dtype of fp8, given back
        else:
            name = kv_format(self.dtype)
        object.__setattr__(self, "dtype", KV_CACHE_DTYPES[name])
        check_eviction_policy("CacheConfig.eviction_policy", self.eviction_policy)
        check_choice("CacheConfig.prefix_cache", self.prefix_cache, PREFIX_CACHES)

    @property
    def arena_shape(self) -> tuple:
        return (self.num_layers, 2, self.num_pages, self.num_kv_heads, self.page_size,
                self.head_dim)

    @property
    def kv_cache_dtype(self) -> str:
        """The format's name: "float32", "float16", "int8" or "fp8_e4m3"."""
        return "fp8_e4m3" if self.dtype == np.uint8 else kv_format(self.dtype)

    @property
    def quantized(self) -> bool:
        """Whether pages hold 8-bit codes with a scale per (token, kv head)."""
        return self.dtype.itemsize == 1

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

        check_choice("ModelConfig.architecture", self.architecture, tuple(ARCHITECTURES))


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding with n-gram (prompt-lookup) drafts, vLLM's keys.

    A decoding request looks for the latest earlier occurrence of its last
    ``n`` tokens (``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``)
    in its prompt and output, proposes up to ``num_speculative_tokens`` tokens
    that followed it, and the engine verifies them all in one forward pass
    (:mod:`paged_np.engine.spec_decode`, :mod:`paged_np.engine.rejection`).

    Example
    -------
    >>> spec = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4})
    >>> spec.num_speculative_tokens, spec.prompt_lookup_max, spec.prompt_lookup_min
    (4, 4, 3)
    """

    method: str = "ngram"
    # Defaults measured on SmolLM2 at batch 1 (benchmarks/spec_decode_sweep.md): k = 8
    # with n-grams of 3-4 tokens was the best of the sweep on input-grounded chats
    # (a longer n proposes fewer, surer drafts; a wider step costs about the same).
    num_speculative_tokens: int = 8     #: k: drafts verified per step at most
    prompt_lookup_max: int = 4          #: the longest n-gram looked up
    prompt_lookup_min: int = 3          #: the shortest n-gram looked up

    def __post_init__(self):
        check_choice("speculative_config.method", self.method, SPEC_METHODS)
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            object.__setattr__(self, name, check_positive_int(f"speculative_config.{name}",
                                                              getattr(self, name)))
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise InvalidArgument(
                f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})")

    @classmethod
    def from_dict(cls, d: dict) -> SpeculativeConfig:
        """From vLLM's dict (``{"method": "ngram", "num_speculative_tokens": 4, ...}``);
        an unknown key is refused by name."""
        import dataclasses

        if not isinstance(d, dict):
            raise DTypeError(f"speculative_config must be a dict or a SpeculativeConfig, "
                             f"got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidArgument(f"speculative_config: unknown key(s) {unknown}; the keys "
                                  f"are {sorted(known)}")
        return cls(**d)


# ---------------------------------------------------------------------------
# The engine's options: one object, validated once, read by every entry point.
# ---------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_bytes(value, name: str = "kv_cache_memory") -> int:
    """``"256MiB"``, ``"1.5GB"``, ``"4096"`` or an int -> bytes (1 KiB = 1024, 1 KB = 1000)."""
    import re

    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise InvalidArgument(f"{name}: cannot read {value!r} as a size; write e.g. "
                                  "'256MiB', '1GiB' or a number of bytes")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        try:
            n = check_int(name, value)
        except DTypeError:
            raise DTypeError(f"{name} must be a number of bytes or a str like '256MiB', got "
                             f"{type(value).__name__}") from None
    if n <= 0:
        raise InvalidArgument(f"{name} must be > 0 bytes, got {value!r}")
    return n


def _option(default, help: str, **cli):
    """A field of :class:`EngineConfig` with the help and choices its command-line flag shows."""
    return field(default=default, metadata=dict(help=help, **cli))


@dataclass(frozen=True)
class EngineConfig:
    """Every option of the serving engine, in one place (vLLM's ``EngineArgs``).

    :class:`~paged_np.Engine`, :class:`~paged_np.LLM`, ``python -m paged_np
    serve`` and every other command build one of these and nothing else: an
    option added here reaches all of them, and each command's flags are made
    from these fields (:func:`paged_np.cli.options.add_engine_args`), so a
    field cannot lack a flag. Validated once, at construction; the shapes the
    cache needs from a model come from :meth:`cache_config`.

    Example
    -------
    >>> cfg = EngineConfig(num_pages=64, prefix_cache="radix", schedule="lpm")
    >>> cfg.cache_config(ModelConfig()).bytes_per_page
    16384
    """

    num_pages: int | None = _option(
        None, "KV cache size in pages (instead of --kv-cache-memory)")
    kv_cache_memory: int | str | None = _option(
        None, "KV cache budget in bytes or like '256MiB' (the default when neither is given)")
    page_size: int = _option(16, "tokens per page")
    kv_cache_dtype: str = _option(
        "auto", "what a page stores: float32 (auto), float16, or 8-bit codes with a scale "
        "per token and kv head (int8, fp8_e4m3)", choices=tuple(KV_CACHE_DTYPES))
    max_num_seqs: int = _option(8, "most sequences running at once")
    max_num_batched_tokens: int = _option(
        256, "most tokens in one step (prefill chunks plus decodes)")
    preemption_mode: str = _option(
        "recompute", "what a preempted request keeps: nothing, or its pages on the host",
        choices=PREEMPTION_MODES)
    swap_pages: int | None = _option(
        None, "pages of host swap space for --preemption-mode swap (default: num_pages)")
    schedule: str = _option(
        "fcfs", "admission order: arrival, or longest cached prefix first", choices=SCHEDULES)
    prefix_cache: str = _option(
        "hash", "how cached prefixes are found: vLLM's hash chain or SGLang's radix tree",
        choices=PREFIX_CACHES)
    eviction_policy: object = _option(
        "lru", "which cached page is evicted first", choices=EVICTION_POLICIES)
    backend: str = _option("auto", "paged attention backend", choices="engine-backends")
    record_events: bool = _option(False, "keep the cache's event log (for drawings)")
    speculative_config: SpeculativeConfig | dict | None = _option(
        None, "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", "
        "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 1}'",
        json=True)

    #: Used when neither num_pages nor kv_cache_memory is given.
    DEFAULT_KV_CACHE_MEMORY = "256MiB"

    def __post_init__(self):
        from .registry import check_backend

        if self.num_pages is not None and self.kv_cache_memory is not None:
            raise InvalidArgument("EngineConfig: give num_pages or kv_cache_memory, not both")
        if self.num_pages is not None:
            object.__setattr__(self, "num_pages",
                               check_positive_int("num_pages", self.num_pages))
        if self.kv_cache_memory is not None:
            parse_bytes(self.kv_cache_memory)
        for name in ("page_size", "max_num_seqs", "max_num_batched_tokens"):
            object.__setattr__(self, name, check_positive_int(name, getattr(self, name)))
        check_choice("kv_cache_dtype", self.kv_cache_dtype, tuple(KV_CACHE_DTYPES))
        check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        if self.swap_pages is not None:
            object.__setattr__(self, "swap_pages", check_int("swap_pages", self.swap_pages, 0))
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("prefix_cache", self.prefix_cache, PREFIX_CACHES)
        check_eviction_policy("eviction_policy", self.eviction_policy)
        check_backend(self.backend, "backend", engine=True)
        if not isinstance(self.record_events, (bool, np.bool_)):
            raise DTypeError(f"record_events must be a bool, got "
                             f"{type(self.record_events).__name__}")
        spec = self.speculative_config
        if spec is not None and not isinstance(spec, SpeculativeConfig):
            object.__setattr__(self, "speculative_config", SpeculativeConfig.from_dict(spec))

    @classmethod
    def from_options(cls, config: EngineConfig | None = None, /, **options) -> EngineConfig:
        """``config`` with ``options`` replaced (a fresh default one when None).

        Unknown option names are refused with the list of known ones.
        """
        import dataclasses

        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidArgument(f"unknown engine option(s) {unknown}; the options are "
                                  f"{sorted(known)}")
        if config is None:
            return cls(**options)
        if not isinstance(config, cls):
            raise DTypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        if "num_pages" in options and "kv_cache_memory" not in options:
            options["kv_cache_memory"] = None       # one size replaces the other
        if "kv_cache_memory" in options and "num_pages" not in options:
            options["num_pages"] = None
        return dataclasses.replace(config, **options)

    def cache_config(self, model_cfg: ModelConfig, dtype=None) -> CacheConfig:
        """The arena for this model: its layers and heads, these pages.

        The page count is ``num_pages``, or ``kv_cache_memory`` divided by the
        bytes of one page, which :attr:`CacheConfig.bytes_per_page` alone computes
        (so an 8-bit ``kv_cache_dtype`` gets about 3.8x the pages of float32 in
        the same memory). ``dtype`` (optional) overrides ``kv_cache_dtype``.
        """
        shape = dict(page_size=self.page_size, num_layers=model_cfg.num_layers,
                     num_kv_heads=model_cfg.num_kv_heads, head_dim=model_cfg.head_dim,
                     dtype=self.kv_cache_dtype if dtype is None else dtype,
                     eviction_policy=self.eviction_policy,
                     prefix_cache=self.prefix_cache)
        num_pages = self.num_pages
        if num_pages is None:
            budget = parse_bytes(self.kv_cache_memory or self.DEFAULT_KV_CACHE_MEMORY)
            per_page = CacheConfig(num_pages=1, **shape).bytes_per_page
            num_pages = budget // per_page
            if num_pages < 1:
                raise InvalidArgument(f"kv_cache_memory={self.kv_cache_memory!r} is less than "
                                      f"one page ({per_page:,} bytes)")
        return CacheConfig(num_pages=num_pages, **shape)
