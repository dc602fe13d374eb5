"""paged_np: a paged KV cache and paged attention in NumPy and Numba.

``import paged_np as pnp`` gives the public names listed in ``__all__``; the
design (architecture, page lifecycle, invariants, errors) is in
``docs/design.md``.

How to read the package, core first:

1. :mod:`paged_np.cache` -- the memory model: the arena of pages, the page pool
   with ref counts and the prefix index, the eviction policies, one sequence's
   block table, and :class:`PagedKVCache` over all of them;
2. :mod:`paged_np.attention` -- attention that reads K/V through block tables:
   the dense reference, the NumPy lesson with the online softmax, then the
   Numba CPU and ``numba.cuda`` kernels;
3. :mod:`paged_np.models` -- a Llama-style model in NumPy that runs on the cache;
4. :mod:`paged_np.engine` -- the serving engine: sampling, the scheduler with
   preemption, outputs, and :class:`Engine` that steps them.

Nothing is imported until it is asked for (:mod:`paged_np.lazy`): ``import
paged_np`` is cheap, and a float32 NumPy step imports none of the plug-ins
(:mod:`paged_np.registry` names them). ``docs/reading.md`` lists the files of
one step in reading order.

Then the tools built on that core: :mod:`paged_np.sim` (the vLLM paper's memory
figures), :mod:`paged_np.viz` (drawings) and :mod:`paged_np.cli` (the
``python -m paged_np`` subcommands). :mod:`paged_np.config`,
:mod:`paged_np.errors` and :mod:`paged_np.checks` sit at the top and are used by
all of them.
"""

from typing import TYPE_CHECKING as _STATIC

from .errors import (
    BackendUnavailable,
    ChatTemplateError,
    CudaUnavailable,
    DTypeError,
    DuplicateSequence,
    IndexOutOfRange,
    InvalidArgument,
    InvalidBlockTable,
    ModelFetchError,
    ModelLoadError,
    OutOfPages,
    PagedNPError,
    SequenceTooLong,
    ShapeError,
    StalePage,
    UnknownRequest,
    UnknownSequence,
)
from .lazy import lazy_exports

if _STATIC:  # what the names are, for static readers (mkdocstrings, IDEs); never run
    from .attention import AttentionMetadata, paged_attention
    from .attention.split_k import merge_attention_states
    from .cache.batch import BatchMetadata
    from .cache.events import Event
    from .cache.eviction import EvictionPolicy, FIFOPolicy, LFUPolicy, LRUPolicy
    from .cache.hash_index import HashIndex
    from .cache.kv_cache import PagedKVCache
    from .cache.page_pool import PagePool
    from .cache.prefix_index import PrefixIndex, make_prefix_index
    from .cache.radix import RadixIndex
    from .config import CacheConfig, ModelConfig
    from .engine.config import EngineConfig, SpeculativeConfig
    from .engine.engine import Engine
    from .engine.llm import LLM
    from .engine.logprobs import Logprob
    from .engine.sampling import SamplingParams
    from .models.llama import LlamaModel
    from .models.load import load_model
    from .models.tokenizer import IncrementalDetokenizer, Tokenizer

#: Public name -> the module that defines it (imported on first use).
_EXPORTS = {
    "BatchMetadata": ".cache.batch", "Event": ".cache.events",
    "EvictionPolicy": ".cache.eviction", "FIFOPolicy": ".cache.eviction",
    "LFUPolicy": ".cache.eviction", "LRUPolicy": ".cache.eviction",
    "PagePool": ".cache.page_pool", "PrefixIndex": ".cache.prefix_index",
    "make_prefix_index": ".cache.prefix_index", "HashIndex": ".cache.hash_index",
    "RadixIndex": ".cache.radix", "PagedKVCache": ".cache.kv_cache",
    "AttentionMetadata": ".attention", "paged_attention": ".attention",
    "merge_attention_states": ".attention.split_k",
    "LlamaModel": ".models.llama", "load_model": ".models.load",
    "Tokenizer": ".models.tokenizer", "IncrementalDetokenizer": ".models.tokenizer",
    "Engine": ".engine.engine", "LLM": ".engine.llm", "SamplingParams": ".engine.sampling",
    "Logprob": ".engine.logprobs",
    "CacheConfig": ".config", "ModelConfig": ".config",
    "EngineConfig": ".engine.config", "SpeculativeConfig": ".engine.config",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
del lazy_exports

__version__ = "0.1.0"

__all__ = [*_EXPORTS, "BackendUnavailable", "ChatTemplateError", "CudaUnavailable",
           "DTypeError", "DuplicateSequence", "IndexOutOfRange", "InvalidArgument",
           "InvalidBlockTable", "ModelFetchError", "ModelLoadError", "OutOfPages",
           "PagedNPError", "SequenceTooLong", "ShapeError", "StalePage", "UnknownRequest",
           "UnknownSequence", "__version__"]
