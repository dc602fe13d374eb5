"""Argument checks shared by the cache and the model.

Each returns the value normalised (a list of ints, an int, bytes) or raises a
named error from :mod:`paged_np.errors` whose message names the argument.
"""

from __future__ import annotations

import numpy as np

from .errors import DTypeError, InvalidArgument, ShapeError

_INT64_MAX = int(np.iinfo(np.int64).max)


def as_token_ids(x, name: str, allow_empty: bool = False) -> list:
    """Validate a 1-D sequence of token ids in ``[0, 2**63)``; return a list of ints.

    The upper bound is int64's: the prefix hash packs ids as int64, and the
    model's embedding lookup indexes with them (it checks its own vocabulary).
    """
    if type(x) in (list, tuple) and x and all(type(t) is int for t in x):  # the engine's path
        lo, hi = min(x), max(x)
        if lo < 0:
            raise InvalidArgument(f"{name} holds a negative token id ({lo})")
        if hi > _INT64_MAX:
            raise InvalidArgument(f"{name} holds token id {hi}, beyond int64 (max {_INT64_MAX})")
        return list(x)
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError, OverflowError) as e:     # ragged, or not numbers
        raise DTypeError(f"{name} must be a 1-D sequence of integer token ids: {e}") from e
    if arr.ndim != 1:
        raise ShapeError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        if allow_empty:
            return []
        raise InvalidArgument(f"{name} must not be empty")
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise InvalidArgument(f"{name} holds a negative token id ({int(arr.min())})")
    if int(arr.max()) > _INT64_MAX:                          # uint64 beyond int64
        raise InvalidArgument(f"{name} holds token id {int(arr.max())}, beyond int64 "
                              f"(max {_INT64_MAX})")
    return arr.tolist()


def check_count(n, name: str) -> int:
    """Validate a count ``>= 1``; return it as an int."""
    if type(n) is int and n >= 1:  # the common case, checked cheaply
        return n
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise DTypeError(f"{name} must be an int, got {type(n).__name__}")
    if int(n) < 1:
        raise InvalidArgument(f"{name} must be >= 1, got {int(n)}")
    return int(n)


def as_extra_key(key) -> bytes | None:
    """The prefix-hash extra key as bytes (None stays None)."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, (str, int)):
        return str(key).encode()
    raise DTypeError(f"extra_key must be bytes, str or int, got {type(key).__name__}")
