"""The Numba CPU kernel beyond the shared parity sweep.

``test_attention_sweep.py`` already runs every configuration on
``backend="numba"``. Here: the kernel's own knobs (split-K, query tile size)
must not change the answer, its helpers (``exp2``, float16 widening) are exact
enough, poisoned slots never leak, and the whole file also runs with
``NUMBA_DISABLE_JIT=1`` so the jitted code stays covered as plain Python.
Shapes are small so that the no-JIT run stays fast.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from attention_cases import TOL, make_paged_case, prefill_query_counts, rel_error

from paged_np.attention import numba_cpu
from paged_np.attention.numba_kernels import exp2, half_to_f32


def run(case, *, window=0, **knobs):
    """numba_cpu.forward on a case (scale 1/sqrt(D)); returns (out, lse)."""
    scale = case.q.shape[2] ** -0.5
    return numba_cpu.forward(case.q, case.k_pages, case.v_pages, case.block_tables,
                             case.seq_lens, case.qsl, scale, window, True, **knobs)


def assert_matches_reference(case, out, lse, window=0):
    ref_out, ref_lse = case.reference(sliding_window=window or None)
    assert np.isfinite(out).all() and np.isfinite(lse).all()  # no NaN leaked in
    assert rel_error(out, ref_out) <= TOL
    assert rel_error(lse, ref_lse) <= TOL


@pytest.mark.parametrize("splits", [1, 2, 3, 7])
@pytest.mark.parametrize("window", [0, 11])
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_split_k_equals_unsplit(splits, window, kv_dtype):
    """Forcing split-K (decode, long and short sequences) changes nothing but rounding."""
    case = make_paged_case([70, 3, 41], num_heads=4, num_kv_heads=2, head_dim=16,
                           page_size=4, kv_dtype=kv_dtype, seed=splits)
    whole_out, whole_lse = run(case, window=window, num_splits=1)
    out, lse = run(case, window=window, num_splits=splits)
    np.testing.assert_allclose(out, whole_out, rtol=0, atol=2e-6)
    np.testing.assert_allclose(lse, whole_lse, rtol=0, atol=2e-6)
    assert_matches_reference(case, out, lse, window)


@pytest.mark.parametrize("q_tile", [1, 2, 5, 64])
@pytest.mark.parametrize("splits", [1, 3])
def test_chunked_prefill_any_tile_and_split(q_tile, splits):
    """Prefill tiles of any size, with split-K on top, match the reference."""
    lens = [37, 9, 20, 1]
    case = make_paged_case(lens, prefill_query_counts(lens), num_heads=6, num_kv_heads=2,
                           head_dim=8, page_size=8, seed=q_tile)
    out, lse = run(case, window=6, q_tile=q_tile, num_splits=splits)
    assert_matches_reference(case, out, lse, window=6)


@pytest.mark.parametrize("page_size", [1, 8, 16, 32])
def test_mqa_decode_with_poisoned_slots(page_size):
    """MQA (one kv head), NaN in every unused slot and padding page, huge pad ids."""
    case = make_paged_case([1, page_size + 1, 50], num_heads=4, num_kv_heads=1, head_dim=8,
                           page_size=page_size, seed=page_size, pad_value=2**31 - 1)
    out, lse = run(case)
    assert_matches_reference(case, out, lse)


def test_empty_split_parts_leave_no_trace():
    """A window shorter than a split part makes parts with no visible key: weight 0."""
    case = make_paged_case([64], num_heads=2, num_kv_heads=1, head_dim=8, page_size=4, seed=5)
    out, lse = run(case, window=3, num_splits=8)
    assert_matches_reference(case, out, lse, window=3)


def test_choose_num_splits_fills_the_threads():
    assert numba_cpu.choose_num_splits(64, 128, 2) == 1  # enough items already
    assert numba_cpu.choose_num_splits(1, 512, 2) == 8  # one long sequence
    assert numba_cpu.choose_num_splits(1, 15, 2) == 1  # too short to be worth it
    assert numba_cpu.choose_num_splits(2, 40, 4) == 5  # capped by pages per part


def test_exp2_accuracy_and_zero_floor():
    xs = np.linspace(-126.0, 0.0, 20001, dtype=np.float32)
    got = np.array([exp2(x) for x in xs[::50]], np.float64)
    want = np.exp2(xs[::50].astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 1e-6
    assert exp2(np.float32(-1e30)) == 0.0 and exp2(np.float32(-127.0)) == 0.0


def test_half_to_f32_is_exact_for_every_finite_float16():
    bits = np.arange(0, 2**16, 97, dtype=np.uint16)  # a spread of all bit patterns
    halves = bits.view(np.float16)
    finite = np.isfinite(halves)
    got = np.array([half_to_f32(b) for b in bits[finite]], np.float32)
    np.testing.assert_array_equal(got, halves[finite].astype(np.float32))


def test_decode_batch_of_zero_queries():
    case = make_paged_case([5, 0], [0, 0], num_heads=2, num_kv_heads=1, head_dim=8,
                           page_size=4)
    out, lse = run(case)
    assert out.shape == (0, 2, 8) and lse.shape == (0, 2)


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="already no-JIT")
def test_this_file_passes_without_jit():
    """Run this file as plain Python (NUMBA_DISABLE_JIT=1) in a subprocess."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        os.path.join(here, "test_numba_cpu.py")],
                       env=env, capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(here))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
