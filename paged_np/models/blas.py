"""Pin the thread counts of NumPy's BLAS and of Numba, from inside a running process.

A batch-1 decode is a chain of matrix-vector products, each a few
milliseconds at most. OpenBLAS threads that *spin* waiting for work are fine
on an idle machine and ruinous on a busy one (measured on a shared 2-core
box: one 576 x 3072 product took 3 ms with 1 BLAS thread and 30 ms with 2).
So measurements pin the thread count, and say which they used.

``OPENBLAS_NUM_THREADS`` only works before NumPy is imported; this module
calls the library's own setter (through ``ctypes``) instead, on whichever
OpenBLAS build NumPy loaded. Other BLAS builds (MKL, Accelerate) are left
alone and reported as such.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
            "openblas_get_num_threads64_", "openblas_get_num_threads")


def _openblas():
    """The OpenBLAS shared library NumPy loaded, or None."""
    import numpy as np  # noqa: F401  (make sure it is loaded)

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _call(names, *args):
    lib = _openblas()
    if lib is None:
        return None
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn(*args)
    return None


def get_blas_threads() -> int | None:
    """OpenBLAS's thread count, or None when NumPy's BLAS is not OpenBLAS."""
    return _call(_GETTERS)


def set_threads(n: int) -> int | None:
    """Set OpenBLAS's and Numba's thread counts to ``n``; returns the old BLAS count."""
    old = get_blas_threads()
    _call(_SETTERS, ctypes.c_int(int(n)))
    try:
        import numba

        numba.set_num_threads(min(int(n), numba.config.NUMBA_NUM_THREADS))
    except (ImportError, ValueError):
        pass
    return old


@contextmanager
def pinned_threads(n: int):
    """``with pinned_threads(1): ...`` runs the block with ``n`` BLAS and Numba threads."""
    import numba

    old_blas, old_numba = get_blas_threads(), numba.get_num_threads()
    set_threads(n)
    try:
        yield
    finally:
        if old_blas is not None:
            _call(_SETTERS, ctypes.c_int(old_blas))
        numba.set_num_threads(old_numba)
