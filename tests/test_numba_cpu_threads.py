"""The Numba CPU backend's threads: Python's pool (fork-safe, thread-safe,
exception-safe) and Numba's OpenMP workers (every block runs; a forked child still works)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
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

    from paged_np.quant.matrix import QuantMatrix
    w = QuantMatrix.from_float(rng.standard_normal((64, 48), dtype=np.float32))
    w8 = w.with_int8_activations()
    x = rng.standard_normal((9, 64), dtype=np.float32)

    def attend():
        out = []
        for threads in ("python", "numba"):
            meta = pnp.AttentionMetadata.build(tables, lens, num_pages=8, page_size=4,
                                               threads=threads)
            out.append(pnp.paged_attention(q, k, v, metadata=meta, backend="numba"))
        # the quantized products: Numba parallel loops too (rows, batch, int8 inputs)
        products = [x[:1] @ w, x @ w, x @ w8]
        return np.concatenate([np.ravel(a) for a in out + products])

    def child(queue):
        queue.put(attend())

    if __name__ == "__main__":
        numba_plan.MIN_BYTES_PER_THREAD = 1          # so small a case wakes both kinds
        numba_plan.MIN_BYTES_PER_NUMBA_THREAD = 1
        want = attend()                              # the parent: a pool, OpenMP's threads
        assert numba_cpu._POOLS, "the parent's call did not use the thread pool"
        assert numba.threading_layer() == "omp", numba.threading_layer()
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,), daemon=True)  # killed on a hang
        proc.start()
        got = queue.get(timeout=60)                  # a hang or a kill: queue.Empty
        proc.join(timeout=60)
        assert proc.exitcode == 0, proc.exitcode
        np.testing.assert_array_equal(got, want)
        print("FORK-OK")
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")
def test_forked_child_can_call_the_numba_backend(tmp_path):
    """A fork child of a parent that already ran both attention drivers and the quantized
    products: the Python pool's child used to wait forever on the parent's dead
    workers, and GNU OpenMP kills a child on its first parallel loop, so the child
    makes its own pool and runs the parallel kernels' serial twins (paged_np.forks)."""
    script = tmp_path / "fork_child.py"
    script.write_text(FORK_CHILD)
    env = dict(os.environ, NUMBA_NUM_THREADS="3",      # a pool with 2 workers
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "FORK-OK" in res.stdout, res.stderr[-3000:]


@pytest.mark.parametrize("threads", ["python", "numba"])
def test_threads_run_every_block_of_the_plan(threads):
    """Each driver (thread ``th``: block ``th``) writes what running every item on one
    thread writes: no block dropped or run twice, the same bits."""
    from paged_np.attention import numba_plan

    rng = np.random.default_rng(3)
    H, Hkv, P, D = 6, 3, 4, 16
    k = rng.standard_normal((40, Hkv, P, D), dtype=np.float32)
    v = rng.standard_normal((40, Hkv, P, D), dtype=np.float32)
    tables = rng.permutation(40).reshape(4, 10).astype(np.int32)
    lens = np.array([37, 9, 22, 30], np.int64)
    qsl = np.array([0, 3, 4, 9, 10], np.int64)
    q2 = rng.standard_normal((10, H, D), dtype=np.float32)
    for n in (2, 3):
        plan = numba_plan.make_plan(lens, qsl, H, Hkv, P, 4, D, 0, num_threads=n,
                                    num_splits=1, threads=threads)
        assert plan.num_threads == n and len(plan.items) % n == 0
        got = np.full((1, 10, H, D), np.nan, np.float32), np.full((1, 10, H), np.nan, np.float32)
        want = np.full((1, 10, H, D), np.nan, np.float32), np.full((1, 10, H), np.nan, np.float32)
        rows = plan.q_tile * (H // Hkv)
        numba_cpu._attend_items(q2, k, v, tables, lens, qsl, plan.items, n, rows, 0, *got,
                                plan.heads_per_item, None, None, threads)
        numba_cpu._run_items(q2, k, v, tables, lens, qsl, plan.items, 0, len(plan.items), rows,
                             0, *want, plan.heads_per_item, None, None, q2, 0, False)
        assert not np.isnan(want[0]).any()                # every row written
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_metadata_refuses_an_unknown_kind_of_threads():
    import paged_np as pnp
    from paged_np.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="threads must be one of"):
        pnp.AttentionMetadata.build(np.zeros((1, 1), np.int32), [1], num_pages=1, page_size=4,
                                    threads="openmp")


def test_pool_is_made_once_when_threads_race(monkeypatch):
    """Eight threads ask for the same pool at once: one pool, shared by all."""
    made = []

    class SlowExecutor:                                 # a slow constructor widens the race
        def __init__(self, *args, **kwargs):
            time.sleep(0.05)
            made.append(self)

    monkeypatch.setattr(numba_cpu, "ThreadPoolExecutor", SlowExecutor)
    monkeypatch.setattr(numba_cpu, "_POOLS", {})
    barrier = threading.Barrier(8)
    got = []

    def ask():
        barrier.wait()
        got.append(numba_cpu._pool(5))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(p is made[0] for p in got)


def test_driver_waits_for_workers_when_its_own_share_raises(monkeypatch):
    """The caller's block fails at once; the workers' blocks must be done before it returns."""
    finished = []

    def fake_run_items(*args):
        w0 = args[7]
        if w0 == 0:                                     # the calling thread's block
            raise RuntimeError("caller block failed")
        time.sleep(0.3)
        finished.append(w0)

    monkeypatch.setattr(numba_cpu, "_run_items", fake_run_items)
    items = np.zeros((3, 8), np.int64)                  # 3 threads, one item each
    with pytest.raises(RuntimeError, match="caller block failed"):
        numba_cpu._attend_items(None, None, None, None, None, None, items, 3, 1, 0,
                                None, None)
    assert sorted(finished) == [1, 2]


def test_driver_raises_a_workers_exception(monkeypatch):
    def fake_run_items(*args):
        if args[7] == 1:
            raise RuntimeError("worker block failed")

    monkeypatch.setattr(numba_cpu, "_run_items", fake_run_items)
    items = np.zeros((2, 8), np.int64)
    with pytest.raises(RuntimeError, match="worker block failed"):
        numba_cpu._attend_items(None, None, None, None, None, None, items, 2, 1, 0,
                                None, None)
