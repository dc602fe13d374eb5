"""The engine's options: one object, validated once, read by every entry point.

:class:`EngineConfig` is vLLM's ``EngineArgs``: :class:`~paged_np.Engine`,
:class:`~paged_np.LLM` and every command build one and pass it on, never a
dict rebuilt downstream. Each field names a choice in a registry
(:mod:`paged_np.registry`), so a choice registered from outside the package is
accepted here, by the commands' flags and by ``info`` alike.
:class:`SpeculativeConfig` holds the speculative-decoding keys.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import numpy as np

from ..checks import check_int, check_positive_int, parse_bytes, replace_fields
from ..config import CacheConfig, ModelConfig, check_choice, check_eviction_policy
from ..errors import DTypeError, InvalidArgument
from ..registry import (
    ENGINE_STEPS,
    EVICTION_POLICIES,
    KV_CACHES,
    KV_FORMATS,
    KV_LAYOUTS,
    PREEMPTION_MODES,
    PREFIX_INDEXES,
    SAMPLERS,
    SCHEDULERS,
    SCHEDULES,
    SPEC_METHODS,
    TIER_WRITE_POLICIES,
    check_backend,
)

__all__ = ["EngineConfig", "SpeculativeConfig", "parse_bytes"]


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
        if not isinstance(d, dict):
            raise DTypeError(f"speculative_config must be a dict or a SpeculativeConfig, "
                             f"got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidArgument(f"speculative_config: unknown key(s) {unknown}; the keys "
                                  f"are {sorted(known)}")
        return cls(**d)


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
        "per token and kv head (int8, fp8_e4m3)", choices=KV_FORMATS)
    kv_layout: str = _option("hnd", "K pages [page_size, head_dim], or transposed",
                             choices=KV_LAYOUTS)
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
        choices=PREFIX_INDEXES)
    eviction_policy: object = _option(
        "lru", "which cached page is evicted first", choices=EVICTION_POLICIES)
    backend: str = _option("auto", "paged attention backend", choices="engine-backends")
    sliding_window: int | None = _option(
        None, "tokens of recent context each query sees, overriding the model's own (default: "
        "the model's); pages wholly behind it go back to the pool")
    attention_sinks: int = _option(
        0, "first tokens every query sees forever beside the sliding window (StreamingLLM's "
        "attention sinks, seen from cache-relative positions); their pages stay pinned")
    record_events: bool = _option(False, "keep the cache's event log (for drawings)")
    # The seams (docs/design.md, "Seams"): each names an entry of its registry, so a
    # learner's class or function, registered from outside, replaces the package's.
    kv_cache: str = _option("paged", "the cache class (slot allocation, copy-on-write)",
                            choices=KV_CACHES)
    scheduler: str = _option("vllm", "the scheduler class (admit, schedule, preempt)",
                             choices=SCHEDULERS)
    sampler: str = _option("vllm", "the sampler function", choices=SAMPLERS)
    engine_step: str = _option("vllm", "the engine step function", choices=ENGINE_STEPS)
    # The tiers below the arena (cache/tiers.py): where the arena's evicted pages are kept.
    host_cache_memory: int | str | None = _option(
        None, "a host-memory tier for pages the arena evicts, in bytes or like '1GiB' "
        "(off by default)", type=str)
    disk_cache_dir: str | None = _option(
        None, "a disk tier for pages, one file each under this directory, kept across "
        "restarts (off by default)", type=str)
    disk_cache_memory: int | str | None = _option(
        None, "the disk tier's budget in bytes or like '4GiB' (default 4GiB)", type=str)
    disk_write_policy: str = _option(
        "write_through", "when a page is written to disk: as it is computed, or only when "
        "the host tier evicts it", choices=TIER_WRITE_POLICIES)
    tier_eviction_policy: object = _option(
        "lru", "which page the host and disk tiers evict first", choices=EVICTION_POLICIES)
    tier_reuse_gate: int = _option(
        0, "keep a page in the tiers only once more than this many prompts asked for it "
        "(vLLM's reuse gate: 1; 0 keeps every page)")
    speculative_config: SpeculativeConfig | dict | None = _option(
        None, "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", "
        "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 1}'",
        json=True)

    #: Used when neither num_pages nor kv_cache_memory is given.
    DEFAULT_KV_CACHE_MEMORY = "256MiB"
    #: The disk tier's budget when disk_cache_dir is given without disk_cache_memory.
    DEFAULT_DISK_CACHE_MEMORY = "4GiB"

    def __post_init__(self):
        if self.num_pages is not None and self.kv_cache_memory is not None:
            raise InvalidArgument("EngineConfig: give num_pages or kv_cache_memory, not both")
        if self.num_pages is not None:
            object.__setattr__(self, "num_pages",
                               check_positive_int("num_pages", self.num_pages))
        if self.kv_cache_memory is not None:
            parse_bytes(self.kv_cache_memory)
        for name in ("page_size", "max_num_seqs", "max_num_batched_tokens"):
            object.__setattr__(self, name, check_positive_int(name, getattr(self, name)))
        check_choice("kv_cache_dtype", self.kv_cache_dtype, ("auto", *KV_FORMATS))
        check_choice("kv_layout", self.kv_layout, KV_LAYOUTS)
        check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        if self.swap_pages is not None:
            object.__setattr__(self, "swap_pages", check_int("swap_pages", self.swap_pages, 0))
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("prefix_cache", self.prefix_cache, PREFIX_INDEXES)
        check_eviction_policy("eviction_policy", self.eviction_policy)
        for name, registry in (("kv_cache", KV_CACHES), ("scheduler", SCHEDULERS),
                               ("sampler", SAMPLERS), ("engine_step", ENGINE_STEPS)):
            check_choice(name, getattr(self, name), registry)
        check_backend(self.backend, "backend", engine=True)
        if self.sliding_window is not None:
            object.__setattr__(self, "sliding_window",
                               check_positive_int("sliding_window", self.sliding_window))
        object.__setattr__(self, "attention_sinks",
                           check_int("attention_sinks", self.attention_sinks, low=0))
        self.attention_window(None)                 # sinks <= window, when both are given
        if not isinstance(self.record_events, (bool, np.bool_)):
            raise DTypeError(f"record_events must be a bool, got "
                             f"{type(self.record_events).__name__}")
        self._check_tiers()
        spec = self.speculative_config
        if spec is not None and not isinstance(spec, SpeculativeConfig):
            object.__setattr__(self, "speculative_config", SpeculativeConfig.from_dict(spec))

    def _check_tiers(self) -> None:
        if self.host_cache_memory is not None:
            parse_bytes(self.host_cache_memory, "host_cache_memory")
        if self.disk_cache_memory is not None:
            parse_bytes(self.disk_cache_memory, "disk_cache_memory")
        if self.disk_cache_dir is not None:
            if not isinstance(self.disk_cache_dir, (str, os.PathLike)) or not str(
                    self.disk_cache_dir):
                raise DTypeError(f"disk_cache_dir must be a path, got {self.disk_cache_dir!r}")
            object.__setattr__(self, "disk_cache_dir", os.fspath(self.disk_cache_dir))
        check_choice("disk_write_policy", self.disk_write_policy, TIER_WRITE_POLICIES)
        check_eviction_policy("tier_eviction_policy", self.tier_eviction_policy)
        object.__setattr__(self, "tier_reuse_gate",
                           check_int("tier_reuse_gate", self.tier_reuse_gate, 0))

    @property
    def tiers(self) -> bool:
        """Whether a tier below the arena is configured (host memory or disk)."""
        return self.host_cache_memory is not None or self.disk_cache_dir is not None

    @classmethod
    def from_options(cls, config: EngineConfig | None = None, /, **options) -> EngineConfig:
        """``config`` with ``options`` replaced (a fresh default one when None).

        Unknown option names are refused with the list of known ones.
        """
        if config is not None:                      # one size replaces the other
            if "num_pages" in options and "kv_cache_memory" not in options:
                options["kv_cache_memory"] = None
            if "kv_cache_memory" in options and "num_pages" not in options:
                options["num_pages"] = None
        return replace_fields(cls, config, options, "engine")

    def attention_window(self, model_cfg: ModelConfig | None) -> tuple[int | None, int]:
        """``(sliding_window, attention_sinks)`` the engine serves ``model_cfg`` with: the
        window is this config's, else the model's (None: none); sinks only with a window,
        and at most the window (refused by name)."""
        window = self.sliding_window
        if window is None and model_cfg is not None:
            window = model_cfg.sliding_window
        if window is not None and self.attention_sinks > window:
            raise InvalidArgument(
                f"attention_sinks={self.attention_sinks} is larger than sliding_window="
                f"{window}: sinks are a few first tokens kept beside a longer window "
                f"(StreamingLLM keeps 4 beside ~1,000)")
        return window, (self.attention_sinks if window is not None else 0)

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
                     prefix_cache=self.prefix_cache, kv_layout=self.kv_layout)
        num_pages = self.num_pages
        if num_pages is None:
            budget = parse_bytes(self.kv_cache_memory or self.DEFAULT_KV_CACHE_MEMORY)
            per_page = CacheConfig(num_pages=1, **shape).bytes_per_page
            num_pages = budget // per_page
            if num_pages < 1:
                raise InvalidArgument(f"kv_cache_memory={self.kv_cache_memory!r} is less than "
                                      f"one page ({per_page:,} bytes)")
        return CacheConfig(num_pages=num_pages, **shape)
