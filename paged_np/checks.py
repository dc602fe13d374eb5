"""Argument checks: one set, called once where a value enters the package.

Every public function and constructor (the configs, the cache, the pool, the
arena, the model, the engine, sampling, attention) checks its integer arguments
and its token ids with these few functions, once, where the value comes in, so
the same mistake gets the same error everywhere.
Each returns the value normalised (an ``int``, a list of ints, bytes) or raises
a named error from :mod:`paged_np.errors` whose message starts with the
argument's name:

- not an integer (a float, a bool, a string): :class:`~paged_np.errors.DTypeError`,
  ``"<name> must be an int, got float"``;
- below the least allowed value: :class:`~paged_np.errors.InvalidArgument`,
  ``"<name> must be >= 1, got 0"``;
- outside an index range ``[low, high)`` (a layer, a page id):
  :class:`~paged_np.errors.IndexOutOfRange`, ``"<name> 7 is outside [0, 4)"``.

Array arguments (query tensors, block tables, slots) are checked by their own
module, which knows their shapes: :mod:`paged_np.attention` and
:mod:`paged_np.cache.arena`.
"""

from __future__ import annotations

import numpy as np

from .errors import DTypeError, IndexOutOfRange, InvalidArgument, ShapeError


def check_int(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """Validate an integer (Python or NumPy, never a bool); return it as an ``int``.

    With ``high`` the value must lie in ``[low, high)`` (``low`` defaults to 0)
    and an index outside raises :class:`IndexOutOfRange`; with ``low`` alone a
    value below it raises :class:`InvalidArgument`.
    """
    if type(value) is not int:  # the common case skips the slower checks
        if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__"):
            raise DTypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    if high is not None:
        low = 0 if low is None else low
        if not low <= value < high:
            raise IndexOutOfRange(f"{name} {value} is outside [{low}, {high})")
    elif low is not None and value < low:
        raise InvalidArgument(f"{name} must be >= {low}, got {value}")
    return value


def check_positive_int(name: str, value) -> int:
    """Validate a count or a size ``>= 1``; return it as an ``int``."""
    return check_int(name, value, low=1)


def as_token_ids(x, name: str, allow_empty: bool = False) -> list:
    """Validate a 1-D sequence of non-negative integer token ids; return a list of ints."""
    if type(x) is list and x and all(type(t) is int for t in x):  # the engine's fast path
        if min(x) < 0:
            raise InvalidArgument(f"{name} holds a negative token id ({min(x)})")
        return list(x)
    arr = np.asarray(x)
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
    return arr.tolist()


def as_extra_key(key) -> bytes | None:
    """The prefix-hash extra key as bytes (None stays None)."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, (str, int)):
        return str(key).encode()
    raise DTypeError(f"extra_key must be bytes, str or int, got {type(key).__name__}")
