"""The Numba debug switch: ``PAGED_NP_BOUNDSCHECK=1`` compiles the kernels with bounds checks.

One subprocess (a fresh interpreter, so the switch is read at import; a fresh
``NUMBA_CACHE_DIR``, so nothing compiled without checks is reused) that:

1. runs the numba backend on a small chunked-prefill batch with a window and
   float16 pages, and compares it with the dense reference: the switch compiles;
2. calls the private drivers directly with indices that the public validation
   would have refused, and expects ``IndexError`` instead of a silent
   out-of-bounds read: a bad block-table entry reaching the jitted item loop
   ``_run_items`` through the threaded driver ``_attend_items``, and part
   buffers one split short handed to the jitted ``_merge_splits``.

Compiling the kernels with checks and without the cache takes ~25 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, "tests")
    from attention_cases import TOL, make_paged_case, rel_error
    from paged_np import config
    import paged_np as pnp
    from paged_np.attention import numba_cpu, numba_plan

    result = {"boundscheck": config.BOUNDSCHECK, "jit_options": repr(config.JIT_OPTIONS),
              "module": numba_cpu.__file__}
    case = make_paged_case([19, 6, 1], [5, 6, 1], num_heads=4, num_kv_heads=2, head_dim=8,
                           page_size=4, kv_dtype=np.float16, seed=1)
    out, lse = pnp.paged_attention(*case.args(), sliding_window=7, backend="numba",
                                   return_lse=True)
    ref_out, ref_lse = case.reference(sliding_window=7)
    result["error"] = max(rel_error(out, ref_out), rel_error(lse, ref_lse))
    result["tol"] = TOL

    def attempt(fn):
        try:
            fn()
            return "no error"
        except Exception as e:  # report the exception and its cause
            cause = e.__cause__ or e.__context__
            return [type(e).__name__, type(cause).__name__ if cause else None, str(e)[:200]]

    # The driver of one batch with a block-table entry far outside k_pages.
    k = case.k_pages.view(np.uint16)
    v = case.v_pages.view(np.uint16)
    bt = case.block_tables.astype(np.int32).copy()
    bt[0, 0] = 10**6
    lens = case.seq_lens.astype(np.int64)
    qsl = case.qsl.astype(np.int64)
    n_q = np.diff(qsl)
    items = numba_plan.plan_items(lens, qsl, n_q, 4, 2, 1, 1, 0, 2)
    q2 = case.q.copy()
    T, H, D = q2.shape
    part_out = np.zeros((1, T, H, D), np.float32)
    part_lse = np.full((1, T, H), -1e30, np.float32)
    result["attend_items"] = attempt(lambda: numba_cpu._attend_items(
        q2, k, v, bt, lens, qsl, items, 2, 2, 0, part_out, part_lse))
    # The merge told there are 2 split parts while the buffers hold 1.
    out, lse = np.zeros((T, H, D), np.float32), np.zeros((T, H), np.float32)
    result["merge"] = attempt(lambda: numba_cpu._merge_splits(
        np.zeros((2, T, H, D), np.float32), part_lse, out, lse))
    print("RESULT" + json.dumps(result))
""")


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="no JIT, no checks")
def test_boundscheck_switch_compiles_and_catches_bad_indices(tmp_path):
    env = dict(os.environ, PAGED_NP_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_DISABLE_JIT", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]   # no crash, no segfault
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT"))
    res = json.loads(line[len("RESULT"):])
    assert res["module"].startswith(ROOT), res["module"]            # this checkout's kernels
    assert res["boundscheck"] is True and "'boundscheck': True" in res["jit_options"]
    assert "'cache': False" in res["jit_options"]
    assert res["error"] <= res["tol"]
    assert res["attend_items"][0] == "IndexError", res["attend_items"]
    assert res["merge"][0] == "IndexError", res["merge"]


def test_boundscheck_is_off_by_default():
    """The normal run compiles without checks and with the on-disk cache."""
    if os.environ.get("PAGED_NP_BOUNDSCHECK", "0") not in ("", "0"):
        pytest.skip("this run has the switch on")
    from paged_np import config
    assert config.BOUNDSCHECK is False
    assert config.JIT_OPTIONS["boundscheck"] is False and config.JIT_OPTIONS["cache"] is True
