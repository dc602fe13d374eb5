"""paged_np: a paged KV cache and paged attention in NumPy and Numba.

Public names only; see DESIGN.md (the contract) and the README.
"""

from .attention import merge_attention_states, paged_attention
from .config import CacheConfig, ModelConfig
from .engine import Engine
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
from .eviction import FIFOPolicy, LFUPolicy, LRUPolicy
from .kv_cache import BatchMetadata, Event, PagedKVCache
from .model import TinyLlama
from .page_pool import PagePool
from .sampling import SamplingParams

__version__ = "0.1.0"
