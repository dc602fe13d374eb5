"""Every choice the package offers, named once: one :class:`Registry` per choice.

A choice (an attention backend, a prefix index, an eviction policy, ...) is a
name mapped to *where its code lives*, written as ``"module:attribute"`` and
imported only when chosen, so the core never imports a plug-in it does not
run. Config validation (:mod:`paged_np.config`), every command's flags
(:mod:`paged_np.cli.options`), the simulations, ``python -m paged_np info``
and the docs all read these tables: a name is spelled here and nowhere else.

A user adds a choice without editing the package::

    import paged_np as pnp

    class MRU(pnp.EvictionPolicy):
        def priority(self, entry):
            return -entry.last_access_time

    pnp.registry.EVICTION_POLICIES.register("mru", MRU, "most recently used first")
    llm = pnp.LLM(model="tiny-random", eviction_policy="mru")   # and --eviction-policy mru

The seams a learner fills (``docs/design.md``, "Seams") are registries too:
:data:`ATTENTION_BACKENDS` (the attention function), :data:`PREFIX_INDEXES`
(prefix lookup), :data:`EVICTION_POLICIES` (the eviction priority),
:data:`KV_CACHES` (slot allocation and copy-on-write: :class:`PagedKVCache`'s
``allocate_slots`` and ``copy_on_write``), :data:`SCHEDULERS` (the decision to
admit or preempt), :data:`SAMPLERS` and :data:`ENGINE_STEPS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import InvalidArgument, ModelLoadError

__all__ = [
    "ARCHITECTURES", "ATTENTION_BACKENDS", "ATTENTION_THREADS", "AUTO", "DEVICES", "ENGINE_STEPS",
    "EVICTION_POLICIES", "Entry", "KV_CACHES", "KV_FORMATS", "KV_LAYOUTS", "KV_TIERS",
    "PREEMPTION_MODES", "PREFIX_INDEXES", "REGISTRIES", "Registry", "SAMPLERS", "SCHEDULERS",
    "SCHEDULES", "SPEC_METHODS", "TIER_WRITE_POLICIES", "WEIGHT_QUANTIZATIONS",
    "architecture_for", "backend_names", "check_backend", "model_class", "supported_names",
]


@dataclass(frozen=True)
class Entry:
    """One named choice: ``target`` (an object, or ``"module:attr"`` / ``"module"`` to
    import on demand), a line ``about`` it, and facts its users read (``meta``),
    which are also readable as attributes (``ATTENTION_BACKENDS["cuda"].engine``)."""

    name: str
    target: object
    about: str = ""
    meta: dict = field(default_factory=dict)

    def __getattr__(self, key):
        meta = object.__getattribute__(self, "meta")
        if key in meta:
            return meta[key]
        raise AttributeError(f"{self.name!r} has no {key!r}")

    def load(self):
        """The object itself, importing its module the first time it is asked for."""
        if not isinstance(self.target, str):
            return self.target
        module, _, attr = self.target.partition(":")
        obj = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
        return obj


class Registry(Mapping):
    """Names -> :class:`Entry`, in the order registered. ``option`` is the config field
    or flag that chooses one (used in error messages)."""

    def __init__(self, option: str, what: str):
        self.option, self.what = option, what
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, target, about: str = "", *, replace: bool = False,
                 **meta) -> Entry:
        """Add a choice (from inside or outside the package); returns its entry."""
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidArgument(f"{self.option}: a name must be an identifier, got {name!r}")
        if name in self._entries and not replace:
            raise InvalidArgument(f"{self.option}: {name!r} is registered already "
                                  "(pass replace=True to replace it)")
        self._entries[name] = entry = Entry(name, target, about, meta)
        return entry

    def unregister(self, name: str) -> None:
        """Remove a choice (a test's or a notebook's, when it is done with it)."""
        self._entries.pop(self.check(name), None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def check(self, value, owner: str | None = None) -> str:
        """``value`` if it names a choice, else InvalidArgument naming ``owner``."""
        if not isinstance(value, str) or value not in self._entries:
            raise InvalidArgument(f"{owner or self.option} must be one of {self.names()}, "
                                  f"got {value!r}")
        return value

    def load(self, name: str):
        """The chosen object (class, function or module), imported now."""
        return self._entries[self.check(name)].load()

    def __getitem__(self, name: str) -> Entry:
        return self._entries[name]

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.option!r}: {', '.join(self._entries)})"


# --------------------------------------------------------------- the cache
#: The attention function (``paged_attention(..., backend=)``, ``EngineConfig.backend``).
#: A backend is a module with a ``forward(...)`` (see :mod:`paged_np.attention`);
#: ``engine`` says whether the serving engine (host arena, NumPy model) can run it.
ATTENTION_BACKENDS = Registry("backend", "paged attention backends")
ATTENTION_BACKENDS.register("numpy", "paged_np.attention.numpy_paged",
                            "the lesson, page by page", engine=True)
ATTENTION_BACKENDS.register("numba", "paged_np.attention.numba_cpu",
                            "jitted, parallel CPU", engine=True)
ATTENTION_BACKENDS.register(
    "cuda", "paged_np.attention.numba_cuda", "optional numba.cuda", engine=False,
    why_not_engine="the engine keeps its arena in host memory; call "
                   "paged_attention(..., backend='cuda') on a device arena "
                   "(PagedKVCache(cfg, device='cuda')) instead")
#: Not a backend but a rule, resolved per call: cuda for device arrays, else numba, else numpy.
AUTO = "auto"

#: Whose threads run the numba backend's work items (``AttentionMetadata.threads``).
ATTENTION_THREADS = Registry("threads", "who runs the numba backend's work items")
ATTENTION_THREADS.register("python", None, "a pool of Python threads (nogil kernels)")
ATTENTION_THREADS.register("numba", None, "numba's own prange threads")

#: Prefix lookup (``CacheConfig.prefix_cache``): classes of :class:`~paged_np.cache.PrefixIndex`.
PREFIX_INDEXES = Registry("prefix_cache", "prefix indexes")
PREFIX_INDEXES.register("hash", "paged_np.cache.hash_index:HashIndex", "vLLM's page-hash chain")
PREFIX_INDEXES.register("radix", "paged_np.cache.radix:RadixIndex", "SGLang's radix tree")

#: The eviction priority (``eviction_policy``): subclasses of :class:`~paged_np.EvictionPolicy`.
EVICTION_POLICIES = Registry("eviction_policy", "eviction policies")
EVICTION_POLICIES.register("lru", "paged_np.cache.eviction:LRUPolicy",
                           "least recently used first (vLLM, SGLang)")
EVICTION_POLICIES.register("fifo", "paged_np.cache.eviction:FIFOPolicy",
                           "oldest contents first")
EVICTION_POLICIES.register("lfu", "paged_np.cache.eviction:LFUPolicy",
                           "fewest hits first, then least recent")

#: What a page stores (``kv_cache_dtype``, vLLM's name): a named format, never a bare dtype.
#: ``storage``: the NumPy dtype of one element; ``qmax``: the 8-bit formats' largest code
#: (they keep a float32 scale per token and kv head, :mod:`paged_np.cache.kv_quant`).
KV_FORMATS = Registry("kv_cache_dtype", "KV page formats")
KV_FORMATS.register("float32", None, "4 bytes an element", storage="float32", qmax=None)
KV_FORMATS.register("float16", None, "2 bytes, half the pages' memory",
                    storage="float16", qmax=None)
KV_FORMATS.register("int8", None, "1 byte + a scale per token-head",
                    storage="int8", qmax=127.0)
KV_FORMATS.register("fp8_e4m3", None, "1 byte (e4m3 bits) + a scale per token-head",
                    storage="uint8", qmax=448.0)

#: How a page lays out K (``kv_layout``; V is as in hnd): the host arena class that stores it.
KV_LAYOUTS = Registry("kv_layout", "KV page layouts")
KV_LAYOUTS.register("hnd", "paged_np.cache.arena:Arena", "K, V [page, head_dim]", label="K hnd")
KV_LAYOUTS.register("k_transposed", "paged_np.cache.kv_layouts:KTransposedArena",
                    "K pages [head_dim, page_size]: vLLM's key cache, a page's scores as FMAs",
                    label="K transposed")

#: Where the arena lives (``PagedKVCache(cfg, device=)``): classes with the
#: :class:`~paged_np.cache.arena.Arena` methods (write, copy_page, read_pages, write_slots).
DEVICES = Registry("device", "arena devices")
DEVICES.register("cpu", "paged_np.cache.arena:Arena", "a NumPy array in host memory")
DEVICES.register("cuda", "paged_np.attention.numba_cuda:DeviceArena",
                 "a numba.cuda device array (optional)")

#: Slot allocation and copy-on-write: the class behind the cache's calls
#: (override ``allocate_slots`` or ``copy_on_write`` in a subclass to replace one).
KV_CACHES = Registry("kv_cache", "KV cache classes")
KV_CACHES.register("paged", "paged_np.cache.kv_cache:PagedKVCache",
                   "pages of one arena, block tables, copy-on-write")

#: The tiers below the arena, top down: where a cached page the arena evicts is kept
#: (``host_cache_memory``, ``disk_cache_dir``), plug-ins of :mod:`paged_np.cache.tiers`
#: built only when configured. ``option``: the field that turns one on; ``label``: its words.
KV_TIERS = Registry("kv_tier", "tiers below the arena")
KV_TIERS.register("host", "paged_np.cache.host_tier:HostPool",
                  "a bounded pool in host memory (vLLM's CPU offloading)",
                  option="host_cache_memory", label="host memory")
KV_TIERS.register("disk", "paged_np.cache.disk_tier:DiskStore",
                  "one file per page under a directory, kept across restarts",
                  option="disk_cache_dir", label="disk")

#: When a page is written to the disk tier (``disk_write_policy``; SGLang HiCache's names).
TIER_WRITE_POLICIES = Registry("disk_write_policy", "disk write policies")
TIER_WRITE_POLICIES.register("write_through", None,
                             "as soon as it is computed: a restart finds every page",
                             write_through=True)
TIER_WRITE_POLICIES.register("write_back", None,
                             "only when the host tier evicts it: fewer writes, lost at exit",
                             write_through=False)

# --------------------------------------------------------------- the engine
#: The decision to admit, schedule or preempt (``scheduler``): Scheduler classes.
SCHEDULERS = Registry("scheduler", "schedulers")
SCHEDULERS.register("vllm", "paged_np.engine.scheduler:Scheduler",
                    "vLLM v1's: running first, preempt the newest, chunked prefill")

#: In which order waiting requests are admitted (``schedule``): functions of
#: :mod:`paged_np.engine.admission`.
SCHEDULES = Registry("schedule", "admission orders")
SCHEDULES.register("fcfs", "paged_np.engine.admission:fcfs", "arrival order (vLLM)")
SCHEDULES.register("lpm", "paged_np.engine.admission:lpm",
                   "longest cached prefix first (SGLang), starvation bounded")

#: What a preempted request keeps (``preemption_mode``).
PREEMPTION_MODES = Registry("preemption_mode", "preemption modes")
PREEMPTION_MODES.register("recompute", None, "nothing: its tokens are prefilled again")
PREEMPTION_MODES.register("swap", "paged_np.engine.swap:SwapArena",
                          "its pages, copied to host swap space")

#: How a token is drawn from logits (``sampler``): ``fn(logits [S, V], params, rngs) -> [S]``.
SAMPLERS = Registry("sampler", "samplers")
SAMPLERS.register("vllm", "paged_np.engine.sampling:sample_tokens",
                  "greedy, temperature, top-k, top-p, min-p, seeds")

#: One engine step (``engine_step``): ``fn(engine) -> list[RequestOutput]``.
ENGINE_STEPS = Registry("engine_step", "engine steps")
ENGINE_STEPS.register("vllm", "paged_np.engine.engine:continuous_batching_step",
                      "schedule, run the model, sample, append, finish")

#: How draft tokens are proposed (``speculative_config.method``).
SPEC_METHODS = Registry("speculative_config.method", "speculative methods")
SPEC_METHODS.register("ngram", "paged_np.engine.spec_decode:NgramProposer",
                      "prompt lookup: the tokens that followed the last n-gram")

# --------------------------------------------------------------- the model
#: How a checkpoint's weights are held (``quantization``); "none" is float32.
WEIGHT_QUANTIZATIONS = Registry("quantization", "weight quantizations")
#: ``file_blocks``: the loader keeps a ``.gguf`` file's quantized blocks as they are.
WEIGHT_QUANTIZATIONS.register("gguf", None, "the file's own blocks, float32 inputs",
                              file_blocks=True)
WEIGHT_QUANTIZATIONS.register("gguf_a8", None,
                              "the same blocks times int8 inputs (llama.cpp's arithmetic)",
                              file_blocks=True)
WEIGHT_QUANTIZATIONS.register("q8_0", None, "quantize to Q8_0 on load", file_blocks=False)
WEIGHT_QUANTIZATIONS.register("none", None, "float32 weights", file_blocks=False)

#: Model families: the class that runs each and the names checkpoints give it.
ARCHITECTURES = Registry("architecture", "model architectures")
ARCHITECTURES.register("llama", "paged_np.models.llama:LlamaModel",
                       "RMSNorm, RoPE, GQA, SwiGLU", gguf_names=("llama",),
                       hf_names=("LlamaForCausalLM", "MistralForCausalLM"))

#: Every registry, by the option that chooses from it (for ``info`` and the docs).
REGISTRIES = {r.option: r for r in (
    ATTENTION_BACKENDS, ATTENTION_THREADS, PREFIX_INDEXES, EVICTION_POLICIES, KV_FORMATS,
    KV_LAYOUTS, DEVICES, KV_CACHES, KV_TIERS, TIER_WRITE_POLICIES, SCHEDULERS, SCHEDULES,
    PREEMPTION_MODES, SAMPLERS, ENGINE_STEPS, SPEC_METHODS, WEIGHT_QUANTIZATIONS,
    ARCHITECTURES)}


# ------------------------------------------------------------ backend rules
def backend_names(engine: bool = False) -> tuple[str, ...]:
    """The names a caller may pass: every backend, or those the engine runs, then "auto"."""
    return tuple(n for n, e in ATTENTION_BACKENDS.items()
                 if e.meta.get("engine", True) or not engine) + (AUTO,)


def check_backend(name, owner: str = "backend", engine: bool = False) -> str:
    """``name`` if it is a backend (one the engine runs, with ``engine=True``), else raise.

    Every entry point refuses the same names with the same reason.
    """
    if isinstance(name, str) and engine and name in ATTENTION_BACKENDS \
            and not ATTENTION_BACKENDS[name].meta.get("engine", True):
        raise InvalidArgument(f"{owner}={name!r} is not an engine backend: "
                              f"{ATTENTION_BACKENDS[name].why_not_engine}")
    allowed = backend_names(engine)
    if not isinstance(name, str) or name not in allowed:
        raise InvalidArgument(f"{owner} must be one of {allowed}, got {name!r}")
    return name


# ------------------------------------------------------------ architectures
def architecture_for(checkpoint_name: str, fmt: str) -> str | None:
    """Our family name for a checkpoint's own architecture name (``fmt``: "gguf" or "hf")."""
    for family, entry in ARCHITECTURES.items():
        if checkpoint_name in entry.meta.get(f"{fmt}_names", ()):
            return family
    return None


def supported_names(fmt: str) -> tuple[str, ...]:
    """Every checkpoint architecture name a loader of ``fmt`` accepts."""
    return tuple(n for e in ARCHITECTURES.values() for n in e.meta.get(f"{fmt}_names", ()))


def model_class(architecture: str):
    """The model class of a family in :data:`ARCHITECTURES` (imported on demand)."""
    if architecture not in ARCHITECTURES:
        raise ModelLoadError(f"architecture {architecture!r} is not supported (supported: "
                             f"{', '.join(ARCHITECTURES)})")
    return ARCHITECTURES.load(architecture)
