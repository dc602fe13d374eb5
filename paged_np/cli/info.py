"""``python -m paged_np info``: versions, attention backends, every choice, and the machine.

Answers "what will ``backend="auto"`` pick here, and why not the others?"
without compiling a kernel: each backend of the registry
(:data:`paged_np.registry.ATTENTION_BACKENDS`) is only imported, and listed with
whether the serving engine runs it. Then every registry of
:data:`paged_np.registry.REGISTRIES` (eviction policies, prefix indexes, KV
formats, schedules, ...) by the option that chooses from it, each name with
its line of ``about``: what the flags and ``EngineConfig`` accept right now,
choices registered from outside the package included.
"""

from __future__ import annotations

import os
import platform
import sys


def backends() -> dict[str, str]:
    """backend name -> "available" or the reason it is not, for every registered backend."""
    from ..attention import load_backend
    from ..errors import PagedNPError
    from ..registry import ATTENTION_BACKENDS

    status = {}
    for name in ATTENTION_BACKENDS:
        try:
            load_backend(name)
            status[name] = "available"
        except (PagedNPError, ImportError) as e:
            status[name] = f"unavailable: {str(e).splitlines()[0]}"
    return status


def engine_use(name: str) -> str:
    """Whether ``Engine(backend=name)`` runs it, and if not why (from the registry)."""
    from ..registry import ATTENTION_BACKENDS

    spec = ATTENTION_BACKENDS[name]
    return "engine: yes" if spec.engine else f"engine: no ({spec.why_not_engine})"


def choice_lines() -> list[str]:
    """Every registry, by its option, then each of its names with the entry's ``about``."""
    from ..registry import REGISTRIES

    lines = []
    for option, registry in REGISTRIES.items():
        lines.append(f"  {option} ({registry.what}):")
        width = max((len(name) for name in registry), default=0)
        lines += [f"    {name:<{width}}  {entry.about}" for name, entry in registry.items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m paged_np info",
                            description="Versions, attention backends, every registered "
                                        "choice and the machine.").parse_args(argv)
    import numba
    import numpy as np

    from .. import __version__

    print(f"paged_np {__version__}")
    print(f"python   {sys.version.split()[0]} ({platform.machine()}, {platform.system()})")
    print(f"numpy    {np.__version__}")
    print(f"numba    {numba.__version__} (threads: {numba.get_num_threads()})")
    print(f"cpus     {os.cpu_count()}")
    from ..registry import ATTENTION_BACKENDS

    print("backends (paged_np.registry.ATTENTION_BACKENDS):")
    for name, state in backends().items():
        print(f"  {name:<6} {state}")
        print(f"  {'':<6} {ATTENTION_BACKENDS[name].about}; {engine_use(name)}")
    print("choices, by the option that picks one (paged_np.registry.REGISTRIES):")
    print("\n".join(choice_lines()))
    return 0
