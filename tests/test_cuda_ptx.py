"""The cuda kernels compile to PTX for a real GPU (sm_90), where NVVM is installed.

The simulator runs the kernels as Python, so it cannot catch what only Numba's
nopython CUDA compiler refuses (a type that does not unify, an unsupported
builtin). This test compiles every kernel for float32, float16, int8 and uint8
(fp8 e4m3) pages, with no
GPU and no driver, and checks two properties of the attention kernel's PTX:
no float64 arithmetic (all math in float32) and no local memory (the
accumulator lives in registers). Skipped where libnvvm is missing.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import types as pytypes
    from numba import cuda, types
    from numba.cuda.cudadrv import nvvm
    try:
        nvvm.NVVM()
    except Exception as e:
        print("NO-NVVM", e)
        raise SystemExit(0)
    import numba.cuda.dispatcher as dispatcher
    # Device functions ask the current device for its compute capability; there
    # is no device here, so answer for the target we compile for.
    dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))
    from paged_np.attention import cuda_kernels as K

    def A(dt, nd):
        return types.Array(dt, nd, "C")

    f32, i32, i64 = types.float32, types.int32, types.int64
    for page in (f32, types.float16, types.int8, types.uint8):
        kv = f32 if page in (f32, types.float16) else page   # what the write path stores
        sigs = {
            "paged_attention_kernel": (A(f32, 3), A(page, 4), A(page, 4), A(i32, 2), A(i32, 1),
                                       A(i32, 1), A(i32, 1), A(i32, 1), f32, i64, i64,
                                       A(f32, 4), A(f32, 3), A(f32, 3), A(f32, 3), A(f32, 1),
                                       i64, A(f32, 3), i64, i64),  # codes, qs, sinks, k_transposed
            "merge_splits_kernel": (A(f32, 4), A(f32, 3), A(f32, 3), A(f32, 2)),
            "reshape_and_cache_kernel": (A(page, 4), A(page, 4), A(i64, 1), A(kv, 3), A(kv, 3),
                                         i64),                      # ..., k_transposed
            "copy_pages_kernel": (A(page, 6), A(i32, 1), A(i32, 1)),
            "fill_zero_kernel": (A(page, 1),),
        }
        for name, sig in sigs.items():
            ptx, _ = cuda.compile_ptx(getattr(K, name).py_func, sig, cc=(9, 0))
            if name == "paged_attention_kernel":
                assert ".f64" not in ptx, f"{page}: float64 arithmetic in the attention kernel"
                assert ".local" not in ptx, f"{page}: the attention kernel spills to local memory"
                assert "shfl.sync.bfly" in ptx, "warp reductions missing"
            print("OK", name, page)
""")


@pytest.mark.cudasim
def test_kernels_compile_to_ptx_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    if "NO-NVVM" in res.stdout:
        pytest.skip(f"libnvvm not found: {res.stdout.strip()}")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("OK ") == 20
