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

import re

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


def as_extra_key(key) -> bytes | None:
    """The prefix-hash extra key as bytes (None stays None)."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, (str, int)):
        return str(key).encode()
    raise DTypeError(f"extra_key must be bytes, str or int, got {type(key).__name__}")


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_bytes(value, name: str = "kv_cache_memory") -> int:
    """``"256MiB"``, ``"1.5GB"``, ``"4096"`` or an int -> bytes (1 KiB = 1024, 1 KB = 1000)."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise InvalidArgument(f"{name}: cannot read {value!r} as a size; write e.g. "
                                  "'256MiB', '1GiB' or a number of bytes")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        try:
            n = check_int(name, value)
        except DTypeError:
            raise DTypeError(f"{name} must be a number of bytes or a str like '256MiB', got "
                             f"{type(value).__name__}") from None
    if n <= 0:
        raise InvalidArgument(f"{name} must be > 0 bytes, got {value!r}")
    return n


def replace_fields(cls, config, options: dict, what: str):
    """``config`` (an instance of the frozen dataclass ``cls``, or None for its defaults)
    with ``options`` replacing fields; an unknown option is refused with the known ones.
    How :meth:`EngineConfig.from_options` and ``ServerConfig.from_options`` take keywords."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidArgument(f"unknown {what} option(s) {unknown}; the options are "
                              f"{sorted(known)}")
    if config is None:
        return cls(**options)
    if not isinstance(config, cls):
        raise DTypeError(f"config must be a{'n' if cls.__name__[0] in 'AEIOU' else ''} "
                         f"{cls.__name__}, got {type(config).__name__}")
    return dataclasses.replace(config, **options)
