"""Every validation rule of paged_attention: one bad input each, the right error
class, and a message that names the argument. Nothing reaches a kernel."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from attention_cases import make_paged_case

import paged_np as pnp
from paged_np.attention import (
    AttentionMetadata,
    BackendUnavailable,
    validate_paged_attention_inputs,
)
from paged_np.errors import DTypeError, InvalidArgument, InvalidBlockTable, ShapeError


@pytest.fixture
def case():
    # 3 sequences, page_size 4: 9 tokens = 3 pages, 4 tokens = 1 page, 1 token = 1 page.
    return make_paged_case([9, 4, 1], [3, 4, 1], num_heads=4, num_kv_heads=2, head_dim=8,
                           page_size=4, seed=0)


def kwargs(case, **changes):
    args = dict(q=case.q, k_pages=case.k_pages, v_pages=case.v_pages,
                block_tables=case.block_tables, seq_lens=case.seq_lens,
                query_start_loc=case.query_start_loc, backend="numpy")
    args.update(changes)
    return args


def refuse(case, error, match, **changes):
    with pytest.raises(error, match=match):
        pnp.paged_attention(**kwargs(case, **changes))


def test_good_case_runs(case):
    assert pnp.paged_attention(**kwargs(case)).shape == case.q.shape


# --- backend and flags -------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch", "", None, 3])
def test_unknown_backend(case, backend):
    refuse(case, InvalidArgument, "backend", backend=backend)


def test_return_lse_not_bool(case):
    with pytest.raises(DTypeError, match="return_lse"):
        pnp.paged_attention(**kwargs(case), return_lse=1)


# --- q ------------------------------------------------------------------------
def test_q_not_an_array(case):
    refuse(case, DTypeError, "q must be a numpy array", q=case.q.tolist())


def test_q_wrong_ndim(case):
    refuse(case, ShapeError, "q must be 3-D", q=case.q.reshape(len(case.q), -1))


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.complex64])
def test_q_not_float(case, dtype):
    refuse(case, DTypeError, "q must have a float dtype", q=case.q.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_q_other_floats_are_cast_to_float32(case, dtype):
    """Documented choice: float16/float64 q is cast (copied) to float32."""
    q = case.q.astype(dtype)
    out = pnp.paged_attention(**kwargs(case, q=q))
    ref = pnp.paged_attention(**kwargs(case, q=q.astype(np.float32)))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, ref)


def test_q_head_dim_mismatch(case):
    refuse(case, ShapeError, "q head_dim", q=np.zeros((8, 4, 16), np.float32))


def test_gqa_not_divisible(case):
    refuse(case, ShapeError, "num_heads", q=np.zeros((8, 3, 8), np.float32))


def test_q_token_count_differs_from_query_start_loc(case):
    refuse(case, InvalidArgument, r"query_start_loc\[-1\]", q=case.q[:-1])


def test_decode_needs_one_query_per_sequence(case):
    refuse(case, ShapeError, "query_start_loc=None", query_start_loc=None)


# --- pages --------------------------------------------------------------------
def test_pages_wrong_ndim(case):
    refuse(case, ShapeError, "k_pages must be 4-D", k_pages=case.k_pages[0])


def test_pages_not_an_array(case):
    refuse(case, DTypeError, "v_pages must be a numpy array", v_pages=None)


@pytest.mark.parametrize("dtype", [np.float64, np.int16])
def test_pages_bad_dtype(case, dtype):
    pages = np.zeros(case.k_pages.shape, dtype)
    refuse(case, DTypeError, "k_pages", k_pages=pages, v_pages=pages)


def test_pages_dtype_mismatch(case):
    refuse(case, DTypeError, "v_pages dtype", v_pages=case.v_pages.astype(np.float16))


def test_pages_shape_mismatch(case):
    refuse(case, ShapeError, "v_pages shape", v_pages=case.v_pages[:-1])


def test_pages_zero_sized_dims(case):
    empty = np.zeros((4, 2, 0, 8), np.float32)
    refuse(case, ShapeError, "k_pages", k_pages=empty, v_pages=empty)


def test_non_contiguous_inputs_are_copied(case):
    """Documented choice: strided q/pages/tables are made contiguous, same result."""
    big = np.full(case.k_pages.shape[:-1] + (16,), np.nan, np.float32)
    k, v = big.copy(), big.copy()
    k[..., :8], v[..., :8] = case.k_pages, case.v_pages
    q = np.repeat(case.q, 2, axis=0)[::2]
    bt = np.repeat(case.block_tables, 2, axis=1)[:, ::2]
    out = pnp.paged_attention(**kwargs(case, q=q, k_pages=k[..., :8], v_pages=v[..., :8],
                                       block_tables=bt))
    np.testing.assert_array_equal(out, pnp.paged_attention(**kwargs(case)))


# --- block tables -------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.bool_])
def test_block_tables_not_integer(case, dtype):
    refuse(case, DTypeError, "block_tables", block_tables=case.block_tables.astype(dtype))


def test_block_tables_wrong_ndim(case):
    refuse(case, ShapeError, "block_tables must be 2-D", block_tables=case.block_tables[0])


def test_block_tables_too_narrow(case):
    refuse(case, InvalidBlockTable, "block_tables has 2 columns",
           block_tables=case.block_tables[:, :2])


def test_page_id_out_of_range(case):
    bt = case.block_tables.copy()
    bt[0, 2] = len(case.k_pages)
    refuse(case, InvalidBlockTable, r"block_tables\[0, 2\].*outside", block_tables=bt)


def test_page_id_negative(case):
    bt = case.block_tables.copy()
    bt[1, 0] = -7
    refuse(case, InvalidBlockTable, r"block_tables\[1, 0\]", block_tables=bt)


def test_hole_inside_a_sequence(case):
    bt = case.block_tables.copy()
    bt[0, 1] = -1
    refuse(case, InvalidBlockTable, r"block_tables\[0, 1\] is -1", block_tables=bt)


def test_entries_past_a_sequence_are_ignored(case):
    bt = case.block_tables.astype(np.int64)
    bt[1, 1:] = 10**12                      # past sequence 1's single page
    np.testing.assert_array_equal(pnp.paged_attention(**kwargs(case, block_tables=bt)),
                                  pnp.paged_attention(**kwargs(case)))


# --- seq_lens -----------------------------------------------------------------
def test_seq_lens_wrong_length(case):
    refuse(case, ShapeError, "seq_lens has 2 entries", seq_lens=case.seq_lens[:2])


def test_seq_lens_negative(case):
    refuse(case, InvalidArgument, "seq_lens must be >= 0", seq_lens=np.array([9, -1, 1]))


@pytest.mark.parametrize("bad", [np.array([9.0, 4.0, 1.0]), np.array([True, True, True])])
def test_seq_lens_not_integer(case, bad):
    refuse(case, DTypeError, "seq_lens", seq_lens=bad)


def test_seq_lens_wrong_ndim(case):
    refuse(case, ShapeError, "seq_lens must be 1-D", seq_lens=case.seq_lens[None])


def test_seq_lens_as_list_is_accepted(case):
    np.testing.assert_array_equal(pnp.paged_attention(**kwargs(case, seq_lens=[9, 4, 1])),
                                  pnp.paged_attention(**kwargs(case)))


# --- query_start_loc ----------------------------------------------------------
def test_query_start_loc_wrong_length(case):
    refuse(case, ShapeError, "query_start_loc must have B\\+1", query_start_loc=[0, 3, 8])


def test_query_start_loc_not_integer(case):
    refuse(case, DTypeError, "query_start_loc", query_start_loc=[0.0, 3.0, 7.0, 8.0])


def test_query_start_loc_first_not_zero(case):
    refuse(case, InvalidArgument, r"query_start_loc\[0\]", query_start_loc=[1, 3, 7, 8])


def test_query_start_loc_decreasing(case):
    refuse(case, InvalidArgument, "nondecreasing", query_start_loc=[0, 5, 4, 8])


def test_more_queries_than_tokens(case):
    # sequence 1 has 4 tokens but would get 5 queries
    refuse(case, InvalidArgument, "query_start_loc/seq_lens: sequence 1",
           query_start_loc=[0, 2, 7, 8])


def test_decode_on_empty_sequence(case):
    refuse(case, InvalidArgument, "seq_lens == 0", seq_lens=[9, 4, 0])


# --- scale and sliding_window -------------------------------------------------
@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_scale_bad_value(case, scale):
    refuse(case, InvalidArgument, "scale", scale=scale)


@pytest.mark.parametrize("scale", ["0.1", True, np.array(0.1)])
def test_scale_bad_type(case, scale):
    refuse(case, DTypeError, "scale", scale=scale)


@pytest.mark.parametrize("window", [0, -3])
def test_sliding_window_below_one(case, window):
    refuse(case, InvalidArgument, "sliding_window must be >= 1", sliding_window=window)


@pytest.mark.parametrize("window", [True, 2.0, "4"])
def test_sliding_window_not_int(case, window):
    refuse(case, DTypeError, "sliding_window", sliding_window=window)


# --- backends that are not there ----------------------------------------------
@pytest.mark.parametrize("backend", ["numba", "cuda"])
def test_unavailable_backend_is_a_clear_error(case, backend, monkeypatch):
    # Make the backend's module fail to import, as it does on a machine without it.
    from paged_np import attention
    module = {"numba": "numba_cpu", "cuda": "numba_cuda"}[backend]
    monkeypatch.setitem(sys.modules, f"paged_np.attention.{module}", None)
    monkeypatch.setattr(attention, "_load_errors", {})
    refuse(case, BackendUnavailable, f"backend='{backend}'", backend=backend)


# --- the validator itself -----------------------------------------------------
def test_validator_normalises(case):
    q = case.q[:3]                                        # decode: one query each
    args = validate_paged_attention_inputs(q, case.k_pages, case.v_pages,
                                           case.block_tables.astype(np.int64), [9, 4, 1])
    assert args.block_tables.dtype == np.int32 and args.block_tables.flags.c_contiguous
    assert args.seq_lens.dtype == np.int32
    np.testing.assert_array_equal(args.query_start_loc, [0, 1, 2, 3])  # None = decode
    assert args.scale == pytest.approx(1 / np.sqrt(8)) and args.sliding_window == 0
    assert args.q is q                               # already fine: no copy


# --- dispatch: a stand-in backend module records what it is given -------------
class _FakeBackend:
    def __init__(self):
        self.calls = []

    def forward(self, *args):
        self.calls.append(args)
        q = args[0]
        return np.zeros(q.shape, np.float32), np.zeros(q.shape[:2], np.float32)


@pytest.fixture
def fake_backends(monkeypatch):
    import sys

    import paged_np.attention as attention
    fakes = {"numba": _FakeBackend(), "cuda": _FakeBackend()}
    monkeypatch.setitem(sys.modules, "paged_np.attention.numba_cpu", fakes["numba"])
    monkeypatch.setitem(sys.modules, "paged_np.attention.numba_cuda", fakes["cuda"])
    monkeypatch.setattr(attention, "_load_errors", {})
    return fakes


def test_dispatch_passes_normalised_args(case, fake_backends):
    pnp.paged_attention(**kwargs(case, backend="numba", block_tables=case.block_tables
                                 .astype(np.int64), seq_lens=[9, 4, 1], sliding_window=3),
                        return_lse=True)
    (args,) = fake_backends["numba"].calls
    q, k, v, bt, sl, qsl, scale, window, return_lse = args
    assert q.dtype == np.float32 and q.flags.c_contiguous and k is case.k_pages
    for a in (bt, sl, qsl):
        assert a.dtype == np.int32 and a.flags.c_contiguous
    assert isinstance(scale, float) and window == 3 and return_lse is True


def test_auto_prefers_numba_when_it_imports(case, fake_backends):
    pnp.paged_attention(**kwargs(case, backend="auto"))
    assert len(fake_backends["numba"].calls) == 1 and not fake_backends["cuda"].calls


class _DeviceArray:
    """Looks like a device array: only __cuda_array_interface__, shape and dtype."""

    def __init__(self, host):
        self.shape, self.dtype = host.shape, host.dtype
        self.__cuda_array_interface__ = dict(shape=host.shape, typestr=host.dtype.str,
                                             strides=None, data=(0, False), version=3)


def test_auto_picks_cuda_for_device_arrays(case, fake_backends):
    dq, dk, dv = (_DeviceArray(x) for x in (case.q, case.k_pages, case.v_pages))
    pnp.paged_attention(**kwargs(case, q=dq, k_pages=dk, v_pages=dv, backend="auto"))
    (args,) = fake_backends["cuda"].calls
    assert args[0] is dq and args[1] is dk                # device arrays pass through


def test_device_arrays_are_validated(case, fake_backends):
    bad = _DeviceArray(case.q.astype(np.float64))
    refuse(case, DTypeError, "q on the device must be float32", q=bad, backend="cuda")
    refuse(case, DTypeError, "q must be a numpy array", q=_DeviceArray(case.q),
           backend="numba")


# ---------------------------------------------------------------------------
# AttentionMetadata: checked once per step, then only q and the pages per layer.
# ---------------------------------------------------------------------------
def build(case, **changes):
    args = dict(block_tables=case.block_tables, seq_lens=case.seq_lens,
                query_start_loc=case.query_start_loc, num_pages=case.k_pages.shape[0],
                page_size=case.k_pages.shape[2])
    args.update(changes)
    return AttentionMetadata.build(**args)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_metadata_gives_the_same_answer(case, backend):
    meta = build(case, sliding_window=5)
    want = pnp.paged_attention(**kwargs(case, backend=backend, sliding_window=5))
    for _ in range(2):  # the second call reuses the numba backend's plan
        got = pnp.paged_attention(case.q, case.k_pages, case.v_pages, metadata=meta,
                                  backend=backend)
        np.testing.assert_array_equal(got, want)
    assert len(meta.plans) == (1 if backend == "numba" else 0)


@pytest.mark.parametrize(("changes", "error", "match"), [
    (dict(block_tables=np.array([[0, 1, 9], [3, 0, 0], [4, 0, 0]])), InvalidBlockTable,
     r"block_tables\[0, 2\] is 9"),
    (dict(seq_lens=[9, 4, -1]), InvalidArgument, "seq_lens must be >= 0"),
    (dict(query_start_loc=[0, 3, 2, 8]), InvalidArgument, "query_start_loc must be "
     "nondecreasing"),
    (dict(sliding_window=0), InvalidArgument, "sliding_window"),
    (dict(num_pages=-1), InvalidArgument, "num_pages"),
    (dict(page_size=0), InvalidArgument, "page_size"),
    (dict(num_pages=2.0), DTypeError, "num_pages"),
])
def test_metadata_build_refuses_what_paged_attention_refuses(case, changes, error, match):
    with pytest.raises(error, match=match):
        build(case, **changes)


def test_metadata_must_match_the_layer(case):
    meta = build(case)
    q, k, v = case.q, case.k_pages, case.v_pages
    with pytest.raises(ShapeError, match="q has 7 query tokens but metadata"):
        pnp.paged_attention(q[:7], k, v, metadata=meta, backend="numpy")
    with pytest.raises(ShapeError, match="k_pages has 5 pages of 4 tokens but metadata"):
        pnp.paged_attention(q, k[:5], v[:5], metadata=meta, backend="numpy")
    with pytest.raises(InvalidArgument, match="seq_lens must be None when metadata"):
        pnp.paged_attention(q, k, v, seq_lens=case.seq_lens, metadata=meta, backend="numpy")
    with pytest.raises(DTypeError, match="metadata must be an AttentionMetadata"):
        pnp.paged_attention(q, k, v, metadata={"block_tables": 0}, backend="numpy")
    with pytest.raises(ShapeError, match="q head_dim"):  # the layer's own arrays are checked
        pnp.paged_attention(q[:, :, :4], k, v, metadata=meta, backend="numpy")


def test_metadata_page_ids_are_checked_against_its_own_arena(case):
    """A metadata built for a bigger arena refuses a smaller one (its ids were checked there)."""
    big = build(case, num_pages=case.k_pages.shape[0] + 8)
    with pytest.raises(ShapeError, match="metadata was built for"):
        pnp.paged_attention(case.q, case.k_pages, case.v_pages, metadata=big, backend="numpy")


def test_metadata_keeps_read_only_copies(case):
    """Changing the caller's table after the check cannot reach the kernel."""
    tables = case.block_tables.astype(np.int32)
    meta = build(case, block_tables=tables)
    tables[0, 0] = 10**6                                  # after the check
    assert meta.block_tables[0, 0] != 10**6
    with pytest.raises(ValueError, match="read-only"):
        meta.block_tables[0, 0] = 10**6


def test_metadata_made_directly_is_checked_too(case):
    with pytest.raises(InvalidBlockTable, match=r"block_tables\[0, 2\] is 9"):
        AttentionMetadata(np.array([[0, 1, 9], [3, 0, 0], [4, 0, 0]]), case.seq_lens,
                          case.query_start_loc, 0, case.k_pages.shape[0], 4)
