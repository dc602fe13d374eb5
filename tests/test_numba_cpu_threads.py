"""The Numba CPU backend's threads: every block of the plan runs, a forked child still works."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from paged_np.attention import numba_cpu  # numba is a dependency: no skip

ROOT = Path(__file__).resolve().parents[1]

FORK_CHILD = textwrap.dedent("""
    import multiprocessing as mp
    import numba
    import numpy as np
    import paged_np as pnp
    from paged_np.attention import numba_cpu, numba_plan

    rng = np.random.default_rng(0)
    k = rng.standard_normal((8, 2, 4, 16), dtype=np.float32)
    v = rng.standard_normal((8, 2, 4, 16), dtype=np.float32)
    q = rng.standard_normal((3, 4, 16), dtype=np.float32)
    tables = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [7, 6, 5, 4]])
    lens = np.array([16, 13, 9])

    def attend():
        return pnp.paged_attention(q, k, v, tables, lens, backend="numba")

    def child(queue):
        queue.put(attend())

    if __name__ == "__main__":
        numba_plan.MIN_BYTES_PER_THREAD = 1           # so small a case runs on 3 threads
        want = attend()                              # the parent starts OpenMP's threads
        assert numba.threading_layer() == "omp", numba.threading_layer()
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,), daemon=True)  # killed on a hang
        proc.start()
        got = queue.get(timeout=60)                  # a hang shows up as queue.Empty
        proc.join(timeout=60)
        assert proc.exitcode == 0, proc.exitcode
        np.testing.assert_array_equal(got, want)
        print("FORK-OK")
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")
def test_forked_child_can_call_the_numba_backend(tmp_path):
    """A fork child of a parent whose attention ran on OpenMP's threads: GNU OpenMP kills
    such a child on its first parallel loop, so the child's calls run on its own thread
    (with the earlier Python thread pool, the child waited forever)."""
    script = tmp_path / "fork_child.py"
    script.write_text(FORK_CHILD)
    env = dict(os.environ, NUMBA_NUM_THREADS="3",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "FORK-OK" in res.stdout, res.stderr[-3000:]


def test_threads_run_every_block_of_the_plan():
    """The parallel driver (thread ``th``: block ``th``) writes what running every item on
    one thread writes: no block dropped or run twice, the same bits."""
    from paged_np.attention import numba_plan

    rng = np.random.default_rng(3)
    H, Hkv, P, D = 6, 3, 4, 16
    k = rng.standard_normal((40, Hkv, P, D), dtype=np.float32)
    v = rng.standard_normal((40, Hkv, P, D), dtype=np.float32)
    tables = rng.permutation(40).reshape(4, 10).astype(np.int32)
    lens = np.array([37, 9, 22, 30], np.int64)
    qsl = np.array([0, 3, 4, 9, 10], np.int64)
    q2 = rng.standard_normal((10, H, D), dtype=np.float32)
    for threads in (2, 3):
        plan = numba_plan.make_plan(lens, qsl, H, Hkv, P, 4, D, 0, num_threads=threads,
                                    num_splits=1)
        assert plan.num_threads == threads and len(plan.items) % threads == 0
        got = np.full((1, 10, H, D), np.nan, np.float32), np.full((1, 10, H), np.nan, np.float32)
        want = np.full((1, 10, H, D), np.nan, np.float32), np.full((1, 10, H), np.nan, np.float32)
        rows = plan.q_tile * (H // Hkv)
        numba_cpu._attend_items(q2, k, v, tables, lens, qsl, plan.items, threads, rows, 0,
                                *got, plan.heads_per_item)
        numba_cpu._run_items(q2, k, v, tables, lens, qsl, plan.items, 0, len(plan.items), rows,
                             0, *want, plan.heads_per_item, None, None)
        assert not np.isnan(want[0]).any()                # every row written
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
