"""The demo's first run compiles everything in its warm-up, and its second run compiles nothing.

``python -m paged_np demo`` prints tokens/s for its serving loop only, after a
warm-up whose time it prints apart ("JIT compile + first calls"). That split
is honest only if no kernel compiles inside the loop: before, the first run's
LM head compiled its 4-or-more-rows kernel there (25 s of a 30 s loop,
``benchmarks/compile_log.md``). Each test below runs the demo in a fresh
process, on an empty ``NUMBA_CACHE_DIR`` and then on the cache that run wrote,
under :func:`paged_np.cli.compile_log.log_demo`, which records every Numba
compilation with the phase it fell in.

The demo is run shortened (``--max-tokens 12 --no-verify``): the same 16
chats on the same 24 pages (prefill, prefix hits, decode batches of 1 to 16,
preemption), fewer tokens each. It needs the real model, fetched once into
``PAGED_NP_HOME``; if it cannot be fetched the test fails with the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import paged_np as pnp
from paged_np.models.hub import fetch_model

ARGV = ["--max-tokens", "12", "--no-verify"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The compile logs of two demo runs on one Numba cache, empty at the first."""
    try:
        fetch_model("smollm2-135m-instruct")
    except pnp.ModelFetchError as e:
        pytest.fail(f"the first-run test needs SmolLM2-135M-Instruct and could not fetch it: {e}")
    tmp = tmp_path_factory.mktemp("first_run")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp / "numba_cache"))
    runs = []
    for name in ("cold", "warm"):
        out = tmp / f"{name}.json"
        proc = subprocess.run([sys.executable, "-m", "paged_np.cli.compile_log", str(out), *ARGV,
                               "--out", str(tmp / f"{name}.png")],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"the {name} demo failed:\n{proc.stdout}\n{proc.stderr}"
        runs.append(json.loads(out.read_text()))
    return runs


def _listing(records) -> str:
    return "\n".join(f"  {r['name']}({r['signature']}): {r['self_s']:.2f} s" for r in records)


def test_first_run_compiles_nothing_while_serving(two_runs):
    cold = two_runs[0]
    assert any(r["phase"] == "warm-up" for r in cold["records"]), "the cache was not empty"
    late = [r for r in cold["records"] if r["phase"] not in ("load", "warm-up")]
    assert not late, ("kernels compiled after the warm-up, inside the timed serving loop "
                      "(make paged_np.engine.replay.warm_up take their path):\n"
                      + _listing(late))
    # And nothing was even loaded from the cache then: the dispatchers' counts stood still.
    assert cold["stats"]["serving"] == cold["stats"]["warm-up"]


def test_second_run_compiles_nothing(two_runs):
    warm = two_runs[1]
    assert not warm["records"], ("the second run compiled again (a kernel Numba does not "
                                 "cache?):\n" + _listing(warm["records"]))
    stats = warm["stats"]["serving"]
    assert sum(h for h, _ in stats.values()) > 0                 # it loaded them instead
    assert sum(m for _, m in stats.values()) == 0
