"""The Numba CPU backend's thread-pool driver: fork-safe, thread-safe, exception-safe."""

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
        numba_plan.MIN_BYTES_PER_THREAD = 1           # so small a case still wakes the pool
        want = attend()                              # the parent makes its pool
        assert numba_cpu._POOLS, "the parent's call did not use the thread pool"
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
    """A fork child of a parent that already ran the driver used to wait forever."""
    script = tmp_path / "fork_child.py"
    script.write_text(FORK_CHILD)
    env = dict(os.environ, NUMBA_NUM_THREADS="3",      # a pool with 2 workers
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "FORK-OK" in res.stdout, res.stderr[-3000:]


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
