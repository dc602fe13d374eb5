"""Package faces that import on first use (PEP 562).

``import paged_np`` loads only the errors and this module; ``pnp.Engine``
imports the engine the first time it is asked for, and ``pnp.viz`` the
drawings. So a float32 NumPy step never pays for (or waits on) a plug-in it
does not run: the Numba kernels, the radix tree, the tokenizer, the server.
Each package's ``__init__`` lists its public names and the module that
defines each, and calls :func:`lazy_exports`.
"""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a public name to the
    module (relative to ``package``) that defines it; any other name that is a
    submodule (``paged_np.registry``, ``paged_np.viz``) is imported when asked for."""

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(exports[name], package), name)
            setattr(sys.modules[package], name, value)     # asked once, then a plain global
            return value
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":          # a real import error inside it
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(exports) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
