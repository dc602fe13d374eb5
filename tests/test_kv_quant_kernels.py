"""Paged attention over 8-bit pages (kv_cache_dtype int8 and fp8_e4m3), every CPU backend.

Each backend reads the codes and scales and must equal dense attention on the
*dequantized* K/V within :data:`attention_cases.TOL` (the same bar as float
pages): the kernels add no error of their own. The error of the format itself
(against the float32 K/V the pages were made from) is bounded loosely here
and reported per format in ``benchmarks/kv_dtype.md``.
"""

from __future__ import annotations

import numpy as np
import pytest
from attention_cases import (
    HEAD_DIMS,
    HEADS,
    PAGE_SIZES,
    TOL,
    available_backends,
    make_paged_case,
    prefill_query_counts,
    quantize_case,
    rel_error,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paged_np as pnp

BACKENDS = available_backends()
FORMATS = ("int8", "fp8_e4m3")


def check_quantized(qcase, backend, sliding_window=None, **knobs):
    """The backend on the codes equals dense attention on the dequantized K/V."""
    case = qcase.case
    out, lse = pnp.paged_attention(*case.args(), sliding_window=sliding_window, backend=backend,
                                   return_lse=True, **qcase.kwargs())
    ref_out, ref_lse = case.reference(sliding_window=sliding_window)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    assert rel_error(out, ref_out) <= TOL, f"out error {rel_error(out, ref_out):.2e}"
    assert rel_error(lse, ref_lse) <= TOL, f"lse error {rel_error(lse, ref_lse):.2e}"
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_quantized_pages_match_dequantized_reference(backend, fmt, mode):
    lens = [1, 15, 16, 17, 137, 300]
    n_queries = None if mode == "decode" else prefill_query_counts(lens)
    case = make_paged_case(lens, n_queries, num_heads=8, num_kv_heads=2, head_dim=64,
                           page_size=16, seed=3)
    check_quantized(quantize_case(case, fmt), backend)


@pytest.mark.parametrize("fmt", FORMATS)
def test_blas_prefill_path_reads_quantized_pages(fmt):
    """A long chunk goes to the BLAS path (numba_prefill), which gathers and dequantizes."""
    case = make_paged_case([300, 200], [300, 150], num_heads=6, num_kv_heads=3, head_dim=64,
                           page_size=16, seed=5)
    from paged_np.attention import numba_cpu, validate_paged_attention_inputs
    from paged_np.attention.numba_plan import make_plan

    qcase = quantize_case(case, fmt)
    args = validate_paged_attention_inputs(*qcase.case.args())
    plan = make_plan(args.seq_lens.astype(np.int64), args.query_start_loc.astype(np.int64), 6,
                     3, 16, 1, 64, 0, blas_min_queries=64)
    assert list(plan.blas_seqs) == [0, 1]                       # both go to BLAS
    out, _ = numba_cpu.forward(*args, True, blas_min_queries=64, **qcase.kwargs())
    ref, _ = qcase.case.reference()
    assert rel_error(out, ref) <= TOL


@pytest.mark.parametrize("fmt, bound", [("int8", 0.02), ("fp8_e4m3", 0.1)])
def test_error_against_float32_is_the_formats_own(fmt, bound):
    """Against float32 K/V the output moves by the format's rounding only (loose bound:
    int8 keeps ~8 bits a row, fp8 e4m3 ~4), and float16 pages stay far closer."""
    case = make_paged_case([137, 300], num_heads=8, num_kv_heads=2, head_dim=64, page_size=16,
                           seed=11)
    out = check_quantized(quantize_case(case, fmt), "numpy")
    ref, _ = case.reference()
    assert 1e-4 < rel_error(out, ref) < bound


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page_size=st.sampled_from(PAGE_SIZES), heads=st.sampled_from(HEADS),
       head_dim=st.sampled_from(HEAD_DIMS), fmt=st.sampled_from(FORMATS),
       lens=st.lists(st.integers(1, 300), min_size=1, max_size=4), prefill=st.booleans(),
       window=st.one_of(st.none(), st.integers(1, 320)), seed=st.integers(0, 2**16))
def test_hypothesis_quantized_matches_dequantized(backend, page_size, heads, head_dim, fmt,
                                                  lens, prefill, window, seed):
    n_queries = prefill_query_counts(lens) if prefill else None
    case = make_paged_case(lens, n_queries, num_heads=heads[0], num_kv_heads=heads[1],
                           head_dim=head_dim, page_size=page_size, seed=seed)
    check_quantized(quantize_case(case, fmt), backend, sliding_window=window)


# ------------------------------------------------------------------ refusals
@pytest.fixture
def int8_case():
    return quantize_case(make_paged_case([20, 5], page_size=8, seed=1), "int8")


def test_scales_are_required_with_8bit_pages(int8_case):
    with pytest.raises(pnp.InvalidArgument, match="k_scales is required"):
        pnp.paged_attention(*int8_case.case.args(), backend="numpy")


def test_scales_are_refused_with_float_pages(int8_case):
    with pytest.raises(pnp.InvalidArgument, match="k_scales/v_scales are for int8 or fp8"):
        pnp.paged_attention(*int8_case.float_case.args(), backend="numpy", **int8_case.kwargs())


@pytest.mark.parametrize("bad, err, match", [
    (lambda s: s[:-1], pnp.ShapeError, "k_scales must have shape"),
    (lambda s: s.astype(np.float64), pnp.DTypeError, "k_scales must be float32"),
    (lambda s: list(s), pnp.DTypeError, "k_scales must be a numpy array"),
])
def test_bad_scales_are_refused_by_name(int8_case, bad, err, match):
    with pytest.raises(err, match=match):
        pnp.paged_attention(*int8_case.case.args(), backend="numpy",
                            k_scales=bad(int8_case.k_scales), v_scales=int8_case.v_scales)
