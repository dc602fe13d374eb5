"""The cuda backend from the main test run: both checks run in a subprocess.

- tests/cudasim runs in its own pytest process with NUMBA_ENABLE_CUDASIM=1 (the
  simulator must be switched on before numba is imported, so not in this one);
- without the simulator and without a GPU, importing the cuda backend raises
  CudaUnavailable, whose message names the extra and the simulator switch.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args, extra_env, timeout):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(extra_env)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.cudasim
def test_cuda_kernels_on_the_simulator():
    res = _run(["-m", "pytest", "tests/cudasim", "-q", "-p", "no:cacheprovider"],
               {"NUMBA_ENABLE_CUDASIM": "1"}, timeout=900)
    assert res.returncode == 0, (
        f"simulator tests failed:\n{res.stdout[-6000:]}\n{res.stderr[-3000:]}")
    assert " passed" in res.stdout and "skipped" not in res.stdout


def test_cuda_backend_without_gpu_raises_named_error():
    code = textwrap.dedent("""
        from numba import cuda
        if cuda.is_available():
            print("GPU-PRESENT")
            raise SystemExit(0)
        from paged_np.errors import CudaUnavailable, PagedNPError
        try:
            import paged_np.attention.numba_cuda  # noqa: F401
        except CudaUnavailable as e:
            assert isinstance(e, PagedNPError) and isinstance(e, ImportError)
            print("MESSAGE:", e)
        else:
            raise SystemExit("imported without a GPU or the simulator")
        import numpy as np
        import paged_np as pnp
        z = np.zeros((1, 1, 1, 8), np.float32)
        try:
            pnp.paged_attention(np.zeros((1, 1, 8), np.float32), z, z,
                                np.zeros((1, 1), np.int32), np.ones(1, np.int32),
                                backend="cuda")
        except CudaUnavailable as e:
            print("PUBLIC:", e)
    """)
    res = _run(["-c", code], {}, timeout=120)
    assert res.returncode == 0, res.stderr
    if "GPU-PRESENT" in res.stdout:
        pytest.skip("a real GPU is present: numba.cuda is usable")
    msg = res.stdout
    assert "PUBLIC:" in msg, "paged_attention(backend='cuda') did not raise CudaUnavailable"
    assert 'pip install "paged-np[cuda]"' in msg
    assert "numba-cuda[cu12]" in msg and "numba-cuda[cu13]" in msg
    assert "NUMBA_ENABLE_CUDASIM=1" in msg
