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

Then the tools built on that core: :mod:`paged_np.sim` (the vLLM paper's memory
figures), :mod:`paged_np.viz` (drawings) and :mod:`paged_np.cli` (the
``python -m paged_np`` subcommands). :mod:`paged_np.config`,
:mod:`paged_np.errors` and :mod:`paged_np.checks` sit at the top and are used by
all of them.
"""

from .attention import AttentionMetadata, paged_attention
from .attention.split_k import merge_attention_states
from .cache.eviction import EvictionPolicy, FIFOPolicy, LFUPolicy, LRUPolicy
from .cache.hash_index import HashIndex
from .cache.kv_cache import BatchMetadata, Event, PagedKVCache
from .cache.page_pool import PagePool
from .cache.prefix_index import PrefixIndex, make_prefix_index
from .cache.radix import RadixCache
from .config import CacheConfig, ModelConfig
from .engine.config import EngineConfig, SpeculativeConfig
from .engine.engine import Engine
from .engine.llm import LLM
from .engine.logprobs import Logprob
from .engine.sampling import SamplingParams
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
from .models import load_model
from .models.llama import LlamaModel
from .models.tokenizer import IncrementalDetokenizer, Tokenizer

__version__ = "0.1.0"

__all__ = [
    # cache
    "BatchMetadata",
    "Event",
    "EvictionPolicy",
    "FIFOPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "PagePool",
    "PrefixIndex",
    "HashIndex",
    "RadixCache",
    "make_prefix_index",
    "PagedKVCache",
    # attention
    "AttentionMetadata",
    "merge_attention_states",
    "paged_attention",
    # models
    "LlamaModel",
    "load_model",
    "Tokenizer",
    "IncrementalDetokenizer",
    # engine
    "Engine",
    "LLM",
    "SamplingParams",
    "Logprob",
    # configuration
    "CacheConfig",
    "EngineConfig",
    "ModelConfig",
    "SpeculativeConfig",
    # errors
    "BackendUnavailable",
    "ChatTemplateError",
    "CudaUnavailable",
    "DTypeError",
    "DuplicateSequence",
    "IndexOutOfRange",
    "InvalidArgument",
    "InvalidBlockTable",
    "ModelFetchError",
    "ModelLoadError",
    "OutOfPages",
    "PagedNPError",
    "SequenceTooLong",
    "ShapeError",
    "StalePage",
    "UnknownRequest",
    "UnknownSequence",
    "__version__",
]
