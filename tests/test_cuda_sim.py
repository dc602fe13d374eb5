"""The cuda backend from the main test run: both checks run in a subprocess.

- tests/cudasim runs in its own pytest process with NUMBA_ENABLE_CUDASIM=1 (the
  simulator must be switched on before numba is imported, so not in this one),
  started by conftest.py as soon as collection ends so that it overlaps the rest
  of the run (it is single-threaded and takes minutes);
- without the simulator and without a GPU, importing the cuda backend raises
  CudaUnavailable, whose message names the extra and the simulator switch.
"""

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    """This process's environment for a child: the simulator off unless ``extra`` switches
    it on, and this checkout first on the import path."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(args, extra_env, timeout):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(**extra_env),
                          capture_output=True, text=True, timeout=timeout)


class SimulatorRun:
    """``tests/cudasim`` running in a subprocess, its output going to a temporary file."""

    def __init__(self):
        self.out = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "tests/cudasim", "-q", "-p", "no:cacheprovider"],
            cwd=ROOT, env=_env(NUMBA_ENABLE_CUDASIM="1"), stdout=self.out,
            stderr=subprocess.STDOUT, text=True)

    def result(self, timeout: float) -> tuple[int, str]:
        """(return code, everything it printed), once it has ended."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.out.seek(0)
        return rc, self.out.read()


#: Where conftest.py keeps the run it started when collection ended.
SIMULATOR_RUN = pytest.StashKey()


@pytest.mark.cudasim
def test_cuda_kernels_on_the_simulator(request):
    run = request.config.stash.get(SIMULATOR_RUN, None) or SimulatorRun()
    rc, out = run.result(timeout=900)
    assert rc == 0, f"simulator tests failed:\n{out[-9000:]}"
    assert " passed" in out and "skipped" not in out, out[-3000:]


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
