"""``python -m paged_np info``: versions, attention backends and the machine.

Answers "what will ``backend="auto"`` pick here, and why not the others?"
without compiling a kernel: each backend is only imported.
"""

from __future__ import annotations

import os
import platform
import sys


def backends() -> dict[str, str]:
    """backend name -> "available" or the reason it is not."""
    from ..attention import load_backend
    from ..errors import PagedNPError

    status = {}
    for name in ("numpy", "numba", "cuda"):
        try:
            load_backend(name)
            status[name] = "available"
        except (PagedNPError, ImportError) as e:
            status[name] = f"unavailable: {str(e).splitlines()[0]}"
    return status


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m paged_np info",
                            description="Versions, attention backends and the machine.",
                            ).parse_args(argv)
    import numba
    import numpy as np

    from .. import __version__

    print(f"paged_np {__version__}")
    print(f"python   {sys.version.split()[0]} ({platform.machine()}, {platform.system()})")
    print(f"numpy    {np.__version__}")
    print(f"numba    {numba.__version__} (threads: {numba.get_num_threads()})")
    print(f"cpus     {os.cpu_count()}")
    print("backends:")
    for name, state in backends().items():
        print(f"  {name:<6} {state}")
    return 0
