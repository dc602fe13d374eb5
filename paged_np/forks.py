"""Numba's OpenMP threads and ``fork``: parallel kernels run serially in a forked child.

GNU OpenMP, the threading layer Numba uses here, kills a forked child on the
child's first parallel loop if the parent had started OpenMP's threads
("fork() called from a process already using GNU OpenMP, this is unsafe"). A
server that forks workers after loading a quantized model would lose every
worker at its first product. So after a fork, :func:`serial` hands out each
parallel kernel's *serial twin*: the same Python function compiled without
``parallel=True`` (its ``prange`` loops become plain ``range`` loops), on the
calling thread. The parent keeps its threads; only the child runs on one core.

Usage, where a parallel kernel is called::

    serial(kernels.rows)(qs, d, m, xp, xs, y)     # kernels.rows itself, unless forked
"""

from __future__ import annotations

import os

from numba import njit

_FORKED = False
_TWINS: dict = {}


def serial(kernel):
    """``kernel`` (a ``@njit(parallel=True)`` dispatcher), or in a forked child its serial
    twin, compiled on first use with the same options but ``parallel``."""
    if not _FORKED:
        return kernel
    twin = _TWINS.get(kernel)
    if twin is None:
        options = {k: v for k, v in kernel.targetoptions.items()
                   if k not in ("parallel", "nopython")}
        twin = _TWINS[kernel] = njit(**options)(kernel.py_func)
    return twin


def _after_fork_in_child():
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
