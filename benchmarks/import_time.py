"""Where the warm "import + first call" time goes, and what SciPy adds to it.

Run from the repository root::

    python benchmarks/import_time.py

``python -m paged_np bench`` reports one figure for a process that imports
paged_np and makes its first numba call with a warm JIT cache (the target of
issue 19 is 1 s). This script splits it, in fresh processes sharing one
temporary ``NUMBA_CACHE_DIR`` (a first process fills it, its time is the cold
compile of the decode kernel for float32 pages):

- ``import numba``, ``import paged_np`` (which imports the backends);
- the first float32 decode call: Numba loads the cached machine code, and the
  first load in a process also imports the typing and lowering registries of
  ``numba.np``, among them ``numba.np.arraymath``, which imports SciPy (to
  look for a BLAS) when SciPy is installed;
- the same with SciPy hidden (``sys.modules["scipy"] = None``), as in an
  environment that installed only paged_np's dependencies (SciPy is not one).

Prints a markdown table, best of three warm processes per row.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

PROBE = """
import sys, time
if {hide_scipy}:
    sys.modules["scipy"] = None  # import scipy now raises ImportError
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
import numpy as np
import paged_np
from paged_np.attention import numba_cpu
t2 = time.perf_counter()
rng = np.random.default_rng(0)
k = rng.standard_normal((16, 8, 16, 128), dtype=np.float32)
q = rng.standard_normal((8, 32, 128), dtype=np.float32)
tables = np.arange(16, dtype=np.int32).reshape(8, 2)
numba_cpu.forward(q, k, k, tables, np.full(8, 32, np.int32), np.arange(9, dtype=np.int32),
                  0.1, 0, True)
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, "scipy" in sys.modules and sys.modules["scipy"] is not None)
"""


def run(cache_dir: str, hide_scipy: bool) -> list:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", PROBE.format(hide_scipy=hide_scipy)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return [float(x) for x in out[:3]] + [out[3] == "True"]


def main() -> int:
    with tempfile.TemporaryDirectory() as cache_dir:
        cold = run(cache_dir, hide_scipy=True)
        rows = {}
        for hide in (False, True):
            runs = [run(cache_dir, hide) for _ in range(3)]
            rows[hide] = min(runs, key=lambda r: sum(r[:3]))
    print(f"Cold: the first process compiled the float32 decode kernel in {cold[2]:.1f} s.\n")
    print("| warm process | import numba s | import paged_np s | first call s | total s | "
          "SciPy imported |")
    print("|---|---|---|---|---|---|")
    for hide, r in rows.items():
        name = "SciPy hidden" if hide else "SciPy as installed"
        print(f"| {name} | {r[0]:.2f} | {r[1]:.2f} | {r[2]:.2f} | {sum(r[:3]):.2f} | "
              f"{'yes' if r[3] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
