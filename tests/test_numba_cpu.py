"""The Numba CPU kernel beyond the shared parity sweep.

``test_attention_sweep.py`` already runs every configuration on
``backend="numba"``. Here: the kernel's own knobs (split-K, query tile size,
the BLAS prefill path and its tile size) must not change the answer, its
helpers (``exp2``, float16 widening) are exact enough, the planner hands out
every piece of work once, poisoned slots never leak, and the whole file also
runs with ``NUMBA_DISABLE_JIT=1`` so the jitted code stays covered as plain
Python. Shapes are small so that the no-JIT run stays fast.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from attention_cases import TOL, make_paged_case, prefill_query_counts, rel_error
from numba import njit

from paged_np.attention import numba_cpu, numba_kernels, numba_kt, numba_plan, numba_prefill
from paged_np.attention.numba_kernels import exp2
from paged_np.attention.numba_widen import _half_bits_to_f32, half_to_f32, to_f32
from paged_np.registry import KV_LAYOUTS

#: Every K page layout; the kernel's tests run on each (``k_transposed``: the same keys).
LAYOUTS = KV_LAYOUTS.names()


def run(case, *, window=0, layout="hnd", **knobs):
    """numba_cpu.forward on a case (scale 1/sqrt(D)) with its K pages in ``layout``;
    returns (out, lse)."""
    scale = case.q.shape[2] ** -0.5
    k_pages = case.k_pages
    if layout == "k_transposed":
        k_pages = np.ascontiguousarray(k_pages.transpose(0, 1, 3, 2))  # [pages, Hkv, D, P]
    return numba_cpu.forward(case.q, k_pages, case.v_pages, case.block_tables,
                             case.seq_lens, case.qsl, scale, window, True, kv_layout=layout,
                             **knobs)


def assert_matches_reference(case, out, lse, window=0):
    ref_out, ref_lse = case.reference(sliding_window=window or None)
    assert np.isfinite(out).all() and np.isfinite(lse).all()  # no NaN leaked in
    assert rel_error(out, ref_out) <= TOL
    assert rel_error(lse, ref_lse) <= TOL


@pytest.mark.parametrize("splits", [1, 2, 3, 7])
@pytest.mark.parametrize("window", [0, 11])
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout, page_size", [("hnd", 4), ("k_transposed", 4),
                                               ("k_transposed", 16)])
def test_split_k_equals_unsplit(splits, window, kv_dtype, layout, page_size):
    """Forcing split-K (decode, long and short sequences) changes nothing but rounding.
    (Transposed K pages of 16 float32 keys take the vector tile; of 4, the loop.)"""
    case = make_paged_case([70, 3, 41], num_heads=4, num_kv_heads=2, head_dim=16,
                           page_size=page_size, kv_dtype=kv_dtype, seed=splits)
    whole_out, whole_lse = run(case, window=window, num_splits=1, layout=layout)
    out, lse = run(case, window=window, num_splits=splits, layout=layout)
    np.testing.assert_allclose(out, whole_out, rtol=0, atol=2e-6)
    np.testing.assert_allclose(lse, whole_lse, rtol=0, atol=2e-6)
    assert_matches_reference(case, out, lse, window)


@pytest.mark.parametrize("q_tile", [1, 2, 5, 64])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("layout, page_size, head_dim", [("hnd", 8, 8), ("k_transposed", 8, 8),
                                                         ("k_transposed", 16, 16)])
def test_chunked_prefill_any_tile_and_split(q_tile, splits, layout, page_size, head_dim):
    """Prefill tiles of any size, with split-K on top, match the reference."""
    lens = [37, 9, 20, 1]
    case = make_paged_case(lens, prefill_query_counts(lens), num_heads=6, num_kv_heads=2,
                           head_dim=head_dim, page_size=page_size, seed=q_tile)
    out, lse = run(case, window=6, q_tile=q_tile, num_splits=splits, layout=layout)
    assert_matches_reference(case, out, lse, window=6)


@pytest.mark.parametrize("num_heads", [4, 6, 16])  # G = 2, 3 (rows padded to 4), 8
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_items_of_two_kv_heads(num_heads, splits, window, kv_dtype, layout):
    """Items that take two kv heads each give the one-head answer (and the reference)."""
    case = make_paged_case([45, 2, 30], num_heads=num_heads, num_kv_heads=2, head_dim=16,
                           page_size=16, kv_dtype=kv_dtype, seed=num_heads + splits)
    one_out, one_lse = run(case, window=window, num_splits=splits, heads_per_item=1,
                           layout=layout)
    out, lse = run(case, window=window, num_splits=splits, heads_per_item=2, layout=layout)
    np.testing.assert_allclose(out, one_out, rtol=0, atol=2e-6)
    np.testing.assert_allclose(lse, one_lse, rtol=0, atol=2e-6)
    assert_matches_reference(case, out, lse, window)


def test_choose_heads_per_item_pairs_only_decode_with_items_to_spare():
    assert numba_plan.choose_heads_per_item(8, 8, 1, 2) == 2  # the bench case: 32 items
    assert numba_plan.choose_heads_per_item(1, 8, 1, 2) == 1  # 4 pairs cannot fill 2 threads
    assert numba_plan.choose_heads_per_item(8, 7, 1, 2) == 1  # odd kv heads
    assert numba_plan.choose_heads_per_item(64, 8, 16, 2) == 1  # prefill tiles


@pytest.mark.parametrize("page_size", [1, 8, 16, 32])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mqa_decode_with_poisoned_slots(page_size, layout):
    """MQA (one kv head), NaN in every unused slot and padding page, huge pad ids.
    (A transposed page's vector tile scores all 16 keys of a vector, NaN slots too:
    the scores past the last key must be masked or never read.)"""
    case = make_paged_case([1, page_size + 1, 50], num_heads=4, num_kv_heads=1, head_dim=16,
                           page_size=page_size, seed=page_size, pad_value=2**31 - 1)
    out, lse = run(case, layout=layout)
    assert_matches_reference(case, out, lse)


def test_empty_split_parts_leave_no_trace():
    """A window shorter than a split part makes parts with no visible key: weight 0."""
    case = make_paged_case([64], num_heads=2, num_kv_heads=1, head_dim=8, page_size=4, seed=5)
    out, lse = run(case, window=3, num_splits=8)
    assert_matches_reference(case, out, lse, window=3)


def test_choose_num_splits_fills_the_threads():
    assert numba_plan.choose_num_splits(64, 128, 2) == 1  # enough items already
    assert numba_plan.choose_num_splits(1, 512, 2) == 8  # one long sequence
    assert numba_plan.choose_num_splits(1, 15, 2) == 1  # too short to be worth it
    assert numba_plan.choose_num_splits(2, 40, 4) == 5  # capped by pages per part
    assert numba_plan.choose_num_splits(1, 512, 1) == 1  # one thread: nothing to fill


def test_choose_num_threads_wakes_a_thread_per_share_of_work():
    """A small call stays on the calling thread: waking a worker costs more than it saves."""
    per = numba_plan.MIN_BYTES_PER_THREAD
    assert numba_plan.choose_num_threads(0, 4) == 1
    assert numba_plan.choose_num_threads(per - 1, 4) == 1
    assert numba_plan.choose_num_threads(2 * per, 4) == 2
    assert numba_plan.choose_num_threads(100 * per, 4) == 4  # never more than there are


def test_exp2_accuracy_and_zero_floor():
    xs = np.linspace(-126.0, 0.0, 20001, dtype=np.float32)
    got = np.array([exp2(x) for x in xs[::50]], np.float64)
    want = np.exp2(xs[::50].astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 1e-6
    assert exp2(np.float32(-1e30)) == 0.0 and exp2(np.float32(-127.0)) == 0.0


@njit
def _widen_all(bits):
    """``to_f32`` over an array of float16 bits, inside jitted code (LLVM fpext)."""
    out = np.empty(bits.size, np.float32)
    for i in range(bits.size):
        out[i] = to_f32(bits[i])
    return out


@njit
def _bits_fallback_all(bits):
    out = np.empty(bits.size, np.float32)
    for i in range(bits.size):
        out[i] = _half_bits_to_f32(bits[i])
    return out


def test_half_to_f32_is_exact_for_every_finite_float16():
    bits = np.arange(0, 2**16, 97, dtype=np.uint16)  # a spread of all bit patterns
    halves = bits.view(np.float16)
    finite = np.isfinite(halves)
    want = halves[finite].astype(np.float32)
    np.testing.assert_array_equal(_widen_all(bits[finite]), want)  # jitted
    np.testing.assert_array_equal([half_to_f32(b) for b in bits[finite]], want)  # Python twin
    # the integer fallback for CPUs without F16C, every float16 including inf and nan
    every = np.arange(2**16, dtype=np.uint16)
    got = _bits_fallback_all(every)
    np.testing.assert_array_equal(got.view(np.uint32)[np.isfinite(got)],
                                  every.view(np.float16).astype(np.float32)[np.isfinite(got)]
                                  .view(np.uint32))  # bit for bit: -0.0 too
    np.testing.assert_array_equal(np.isnan(got), np.isnan(every.view(np.float16)))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(every.view(np.float16)))


@pytest.mark.parametrize("window", [0, 9])
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_blas_prefill_equals_kernel(monkeypatch, window, kv_dtype):
    """Long chunks on BLAS (tiles of 8 queries here) give the kernel's answer."""
    monkeypatch.setattr(numba_prefill, "Q_TILE", 8)
    lens = [45, 20, 6]
    case = make_paged_case(lens, [30, 20, 6], num_heads=4, num_kv_heads=2, head_dim=16,
                           page_size=4, kv_dtype=kv_dtype, seed=3)
    blas_out, blas_lse = run(case, window=window, blas_min_queries=1)
    out, lse = run(case, window=window, blas_min_queries=10**9)
    np.testing.assert_allclose(blas_out, out, rtol=0, atol=2e-6)
    np.testing.assert_allclose(blas_lse, lse, rtol=0, atol=2e-6)
    assert_matches_reference(case, blas_out, blas_lse, window)


def test_mixed_batch_decode_split_and_blas_prefill():
    """A decode row with split-K beside a BLAS prefill chunk: the merge leaves it alone."""
    case = make_paged_case([70, 40], [1, 40], num_heads=4, num_kv_heads=4, head_dim=8,
                           page_size=2, seed=4)
    out, lse = run(case, num_splits=3, blas_min_queries=16)
    assert_matches_reference(case, out, lse)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_plan_hands_out_every_piece_once(threads):
    """Every (query tile, kv head, split part) appears once; padding rows are empty."""
    seq_lens = np.array([50, 0, 9, 33], np.int64)
    qsl = np.array([0, 50, 50, 51, 58], np.int64)
    n_q = np.diff(qsl)
    items = numba_plan.plan_items(seq_lens, qsl, n_q, 4, 2, 16, 2, 0, threads)
    assert len(items) % threads == 0
    real = items[items[:, 2] > 0]
    keys = {(int(b), int(q0), int(h), int(sp)) for b, q0, _, h, _, _, sp in real}
    assert len(keys) == len(real)  # no piece twice
    for h in range(2):  # per kv head, each query is covered by parts whose keys tile [0, pos]
        for b, (t0, t1) in enumerate(zip(qsl[:-1], qsl[1:])):
            mine = real[(real[:, 0] == b) & (real[:, 3] == h)]
            queries = sorted(int(q) for q0, nq in mine[:, 1:3] for q in range(q0, q0 + nq))
            assert set(queries) == set(range(t0, t1))
            for q0 in set(mine[:, 1]):
                parts = mine[mine[:, 1] == q0]
                spans = sorted((int(lo), int(hi)) for lo, hi in parts[:, 4:6])
                assert spans[0][0] == 0 and all(a[1] == b_[0] for a, b_ in zip(spans, spans[1:]))
                nq = parts[0, 2]
                assert spans[-1][1] == seq_lens[b] - (t1 - q0) + nq  # one past the tile's last


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


_GENERIC_PROBE = """
import re, sys
import numpy as np
from numba.core import config
from attention_cases import TOL, make_paged_case, rel_error
from paged_np.attention import numba_cpu

assert config.CPU_NAME == "generic", config.CPU_NAME
worst = 0.0
for lens, n_q, kv_dtype, knobs in [
        ([40, 9, 33], None, np.float32, {}),  # decode
        ([40, 9, 33], None, np.float16, {"heads_per_item": 2}),  # float16 bits, two kv heads
        ([70], None, np.float32, {"num_splits": 3}),  # split-K and its merge
        ([30, 12], [30, 5], np.float32, {}),  # prefill and chunked prefill in the kernel
        ([30, 12], [30, 5], np.float16, {"blas_min_queries": 8}),  # the BLAS prefill path
        ([40, 9, 33], None, np.float32, {"kv_layout": "k_transposed", "page_size": 16})]:
    layout = knobs.pop("kv_layout", "hnd")
    ps = knobs.pop("page_size", 4)
    case = make_paged_case(lens, n_q, num_heads=8, num_kv_heads=2, head_dim=16, page_size=ps,
                           kv_dtype=kv_dtype, seed=len(lens))
    k_pages = case.k_pages if layout == "hnd" else np.ascontiguousarray(
        case.k_pages.transpose(0, 1, 3, 2))
    out, lse = numba_cpu.forward(case.q, k_pages, case.v_pages, case.block_tables,
                                 case.seq_lens, case.qsl, 0.25, 0, True, kv_layout=layout,
                                 **knobs)
    ref_out, ref_lse = case.reference()
    worst = max(worst, rel_error(out, ref_out), rel_error(lse, ref_lse))
asm = "".join(numba_cpu._run_items.inspect_asm().values())
print(worst, len(re.findall("%[yz]mm", asm)), "fmadd" in asm)
"""


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="needs the JIT")
def test_kernels_right_on_a_generic_x86_64_target(tmp_path):
    """NUMBA_CPU_NAME=generic (no AVX, no FMA, no F16C): the same answers.

    In a fresh process, since the target is read before anything compiles, and
    with an empty cache, so that no host-tuned machine code is reused. The
    generated code must really be generic: no 256/512-bit registers, no FMA.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    env.pop("NUMBA_CPU_FEATURES", None)
    r = subprocess.run([sys.executable, "-c", _GENERIC_PROBE], env=env, capture_output=True,
                       text=True, timeout=600, cwd=os.path.dirname(here))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    worst, wide_registers, fma = r.stdout.split()[-3:]
    assert float(worst) <= TOL
    assert int(wide_registers) == 0 and fma == "False"


@pytest.mark.parametrize("n_keys", [16, 7, 1])
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_both_score_tiles_agree_with_numpy(n_keys, kv_dtype):
    """The AVX-512 (4 rows x 4 keys) and AVX2 (4 x 2) score tiles: same scores as NumPy.

    Only one of them runs in the kernel on a given CPU; both run here.
    """
    rng = np.random.default_rng(n_keys)
    qt = rng.standard_normal((8, 32), np.float32)
    kp = rng.standard_normal((3, 2, 16, 32), np.float32).astype(kv_dtype)
    bits = kp.view(np.uint16) if kv_dtype == np.float16 else kp
    want = qt[4:8] @ kp[2, 1, :n_keys].astype(np.float32).T  # rows 4..7, page 2, kv head 1
    for tile, step in ((numba_kernels.tile_scores_4x4, 4), (numba_kernels.tile_scores_4x2, 2)):
        s = np.full((8, 24), np.nan, np.float32)
        tile(qt, bits, 2, 1, s, 4, 8, 5, n_keys, 0)  # columns 5.., prefetching page 0
        np.testing.assert_allclose(s[4:8, 5:5 + n_keys], want, rtol=1e-5, atol=1e-5)
        # A short last pass repeats the last key's score in the columns up to the next
        # multiple of ``step`` (the caller's spare columns); nothing else is written.
        end = 5 + -(-n_keys // step) * step
        assert np.all(s[4:8, 5 + n_keys:end] == s[4:8, 4 + n_keys:5 + n_keys])
        assert np.isnan(s[:4]).all() and np.isnan(s[4:8, end:]).all()


@pytest.mark.parametrize("page_size, n_keys", [(16, 16), (32, 19), (16, 1), (8, 5)])
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_transposed_score_tile_and_vector_values_agree_with_numpy(page_size, n_keys, kv_dtype):
    """``tile_scores_kt`` (the vector tile for float32 pages of 16k keys, else the loop) and
    ``accumulate_pv_kt`` give NumPy's scores and weighted sums, and write only where told."""
    rng = np.random.default_rng(page_size + n_keys)
    qt = rng.standard_normal((8, 32), np.float32)
    kp = rng.standard_normal((3, 2, 32, page_size), np.float32).astype(kv_dtype)  # [.., D, P]
    bits = kp.view(np.uint16) if kv_dtype == np.float16 else kp
    want = qt[4:8] @ kp[2, 1, :, :n_keys].astype(np.float32)  # rows 4..7, page 2, kv head 1
    s = np.full((8, 48), np.nan, np.float32)
    kw = np.empty((1, 1, 32, page_size), np.float32)  # a float16 page is widened here
    numba_kt.tile_scores_kt(qt, np.ascontiguousarray(qt.T), bits, 2, 1, s, 4, 8, 5, n_keys, 0,
                            kw)
    np.testing.assert_allclose(s[4:8, 5:5 + n_keys], want, rtol=1e-5, atol=1e-5)
    assert np.isnan(s[:4]).all() and np.isnan(s[4:8, 5 + page_size:]).all()
    vp = rng.standard_normal((3, 2, page_size, 32), np.float32).astype(kv_dtype)
    p = rng.random((8, 48), np.float32)
    acc = rng.standard_normal((8, 32), np.float32)
    want = acc[4:8] + p[4:8, 5:5 + n_keys] @ vp[0, 1, :n_keys].astype(np.float32)
    vbits = vp.view(np.uint16) if kv_dtype == np.float16 else vp
    before = acc.copy()
    numba_kt.accumulate_pv_kt(p, vbits, 0, 1, acc, 4, 8, 5, n_keys, 2,
                              np.empty((1, 1, page_size, 32), np.float32))
    np.testing.assert_allclose(acc[4:8], want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(acc[:4], before[:4])


def test_fp8_bit_widening_equals_the_table_for_every_code():
    """The jitted fp8 e4m3 widening (bit operations) equals the 256-entry table, sign and all."""
    from numba import njit

    from paged_np.cache.kv_quant import FP8_E4M3

    @njit
    def widen_all(codes):
        out = np.empty(codes.size, np.float32)
        for i in range(codes.size):
            out[i] = to_f32(codes[i])
        return out

    codes = np.arange(256, dtype=np.uint8)
    stored = (codes & 0x7F) != 0x7F                          # 0x7F, 0xFF: NaN, never stored
    got = widen_all(codes)[stored]
    np.testing.assert_array_equal(got, FP8_E4M3[stored])
    np.testing.assert_array_equal(np.signbit(got), np.signbit(FP8_E4M3[stored]))


@pytest.mark.parametrize("knobs", [{}, {"num_threads": 2}, {"num_splits": 3},
                                   {"num_threads": 2, "window": 13}])
@pytest.mark.parametrize("num_heads, num_kv_heads, page_size", [(4, 2, 4), (6, 2, 16),
                                                                (3, 3, 5)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_verify_rows_have_the_bits_of_decode_rows(knobs, num_heads, num_kv_heads, page_size,
                                                  layout):
    """A speculative verify step (a few queries per sequence) computes each query exactly
    as the decode step at its position would: same items, parts and order, so the same
    bits whatever the number of drafts (greedy speculative decoding relies on it)."""
    knobs = dict(knobs)
    window = knobs.pop("window", 0)
    n_q = [9, 4, 1]
    case = make_paged_case([150, 40, 9], n_q, num_heads=num_heads, num_kv_heads=num_kv_heads,
                           head_dim=16, page_size=page_size, seed=page_size)
    verify, _ = run(case, window=window, layout=layout, **knobs)
    k_pages = case.k_pages if layout == "hnd" else np.ascontiguousarray(
        case.k_pages.transpose(0, 1, 3, 2))
    starts = np.asarray(case.qsl[:-1])
    for i in range(max(n_q)):  # decode step i: every sequence, one query each
        rows = [int(starts[b]) + min(i, n - 1) for b, n in enumerate(n_q)]
        lens = [int(case.seq_lens[b]) - n + 1 + min(i, n - 1) for b, n in enumerate(n_q)]
        q = np.ascontiguousarray(case.q[rows])
        out, _ = numba_cpu.forward(q, k_pages, case.v_pages, case.block_tables,
                                   np.array(lens, np.int64), np.arange(len(n_q) + 1),
                                   case.q.shape[2] ** -0.5, window, True, kv_layout=layout,
                                   **knobs)
        assert np.array_equal(out, verify[rows]), f"decode step {i} differs"


@pytest.mark.parametrize("verify_bytes, decode_bytes", [(1, 1 << 40), (1 << 40, 1)])
def test_threads_and_query_tiles_leave_the_bits_alone(verify_bytes, decode_bytes,
                                                      monkeypatch):
    """On Numba's threads the automatic plan runs a verify step on more threads (and cuts
    its queries into tiles for them) than the decode steps at its positions, or fewer:
    the bits stay. (Python's threads are counted as split-K counts them, from the
    sequences alone, so decode and verify get the same count.)"""
    from paged_np.attention import numba_plan

    threads, least = "numba", "MIN_BYTES_PER_NUMBA_THREAD"
    monkeypatch.setattr(numba_plan.numba, "get_num_threads", lambda: 2)  # any machine
    n_q = [9]                                     # one sequence: 3 items, so tiles of queries
    case = make_paged_case([130], n_q, num_heads=6, num_kv_heads=3, head_dim=16,
                           page_size=8, seed=11)
    monkeypatch.setattr(numba_plan, least, verify_bytes)
    plan = numba_plan.make_plan(case.seq_lens.astype(np.int64), case.qsl.astype(np.int64),
                                6, 3, 8, 4, 16, 0, threads=threads)
    if verify_bytes == 1:                         # the case this test is about
        assert (plan.num_threads, plan.q_tile, plan.threads) == (2, 5, threads), plan
    assert plan.num_splits == 1
    verify, _ = run(case, threads=threads)
    monkeypatch.setattr(numba_plan, least, decode_bytes)
    starts = np.asarray(case.qsl[:-1])
    for i in range(max(n_q)):
        rows = [int(starts[b]) + min(i, n - 1) for b, n in enumerate(n_q)]
        lens = [int(case.seq_lens[b]) - n + 1 + min(i, n - 1) for b, n in enumerate(n_q)]
        out, _ = numba_cpu.forward(np.ascontiguousarray(case.q[rows]), case.k_pages,
                                   case.v_pages, case.block_tables, np.array(lens, np.int64),
                                   np.arange(2), case.q.shape[2] ** -0.5, 0, True,
                                   threads=threads)
        assert np.array_equal(out, verify[rows]), f"decode step {i} differs"
