"""paged_np: a paged KV cache and paged attention in NumPy and Numba.

Public names only; see DESIGN.md (the contract) and the README.
"""

from .attention import merge_attention_states, paged_attention
from .config import CacheConfig, ModelConfig
from .engine.engine import Engine
from .errors import (
    CudaUnavailable,
    DTypeError,
    DuplicateSequence,
    IndexOutOfRange,
    InvalidArgument,
    InvalidBlockTable,
    OutOfPages,
    PagedNPError,
    ShapeError,
    StalePage,
    UnknownSequence,
)
from .cache.eviction import FIFOPolicy, LFUPolicy, LRUPolicy
from .cache.kv_cache import BatchMetadata, Event, PagedKVCache
from .models.llama import TinyLlama
from .cache.page_pool import PagePool
from .engine.sampling import SamplingParams

__version__ = "0.1.0"
