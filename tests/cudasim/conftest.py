"""Tests that run the numba.cuda kernels: on the CUDA simulator or a real GPU.

They run only in their own pytest process, where the simulator can be switched
on before numba is imported (tests/test_cuda_sim.py starts that process):

    NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cudasim -q     # no GPU
    PAGED_NP_CUDA_TESTS=1 python -m pytest tests/cudasim -q      # a real GPU

In any other run (plain ``python -m pytest``) this folder is not collected, so
numba.cuda is never imported in the main test process.
"""

import os
import sys

_ENABLED = (os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
            or os.environ.get("PAGED_NP_CUDA_TESTS", "0") not in ("", "0"))

if not _ENABLED:
    collect_ignore_glob = ["test_*.py"]
else:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [_HERE, os.path.dirname(_HERE)]      # dense_ref, attention_cases
