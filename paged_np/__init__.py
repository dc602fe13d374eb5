"""paged_np: a paged KV cache and paged attention in NumPy and Numba.

Public names only; see DESIGN.md (the contract) and the README.
"""

from .attention import merge_attention_states, paged_attention
from .cache.eviction import FIFOPolicy, LFUPolicy, LRUPolicy
from .cache.kv_cache import BatchMetadata, Event, PagedKVCache
from .cache.page_pool import PagePool
from .config import CacheConfig, ModelConfig
from .engine.engine import Engine
from .engine.llm import LLM
from .engine.sampling import SamplingParams
from .errors import (
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
    ShapeError,
    StalePage,
    UnknownSequence,
)
from .models import load_model
from .models.llama import LlamaModel, TinyLlama
from .models.tokenizer import IncrementalDetokenizer, Tokenizer

__version__ = "0.1.0"
