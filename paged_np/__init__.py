"""paged_np: a paged KV cache and paged attention in NumPy and Numba.

Public names only; see DESIGN.md (the contract) and the README.
"""

from .config import CacheConfig, ModelConfig
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

__version__ = "0.1.0"
