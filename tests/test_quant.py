"""paged_np.quant: every kernel against the NumPy reference, over formats and shapes.

The reference chain: ``gguf.quants.quantize`` (llama.cpp's own Python) writes
the file's bytes; ``gguf.quants.dequantize`` reads them back; our
:func:`parse_blocks` + :func:`dequantize_blocks` must read the same floats,
and every Numba kernel (rows for 1-3 input rows, batch from 4: its four-row passes,
the 1-3 rows left over and a second group of 16, embedding rows) must
give ``x @ W`` of those floats within 1e-5 relative.
"""

from __future__ import annotations

import gguf
import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paged_np as pnp
from paged_np.quant import (
    FEW_ROWS,
    Q4,
    Q8,
    QUANT_FORMATS,
    QuantMatrix,
    dequantize_blocks,
    dequantize_raw,
    parse_blocks,
    quantize_q8_0,
)
from paged_np.quant import kernels as K
from paged_np.quant import passes as PASSES
from paged_np.quant.formats import kind_of

FORMATS = sorted(QUANT_FORMATS)


def file_bytes(w: np.ndarray, fmt: str) -> np.ndarray:
    """What a GGUF file holds for ``w`` [out, in] in ``fmt`` (llama.cpp's quantizer)."""
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[fmt])


def random_matrix(rng, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[:, :32] *= 4.0                                             # blocks of different scales
    return w


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.mark.parametrize("fmt", FORMATS)
def test_parse_blocks_reads_what_gguf_dequantizes(fmt):
    w = random_matrix(np.random.default_rng(1), 7, 96)
    raw = file_bytes(w, fmt)
    expect = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt])   # [7, 96]
    np.testing.assert_array_equal(dequantize_raw(raw, fmt, 7, 96), expect)
    assert np.abs(expect - w).max() < np.abs(w).max() / (6 if fmt != "Q8_0" else 100)


def test_quantize_q8_0_is_llama_cpps_rule():
    w = random_matrix(np.random.default_rng(2), 5, 64)
    q, d, m = quantize_q8_0(w)
    ref = gguf.quants.dequantize(file_bytes(w, "Q8_0"), gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_allclose(dequantize_blocks(q, d, m), ref, rtol=0,
                               atol=float(d.max()) * 1.01)           # a step at most
    assert np.abs(q).max() <= 127


@pytest.mark.parametrize("fmt", FORMATS)
def test_repacking_round_trips_the_blocks(fmt):
    w = random_matrix(np.random.default_rng(3), 45, 64)          # 45 rows: not a multiple of 32
    q, d, m = parse_blocks(file_bytes(w, fmt), fmt, 45, 64)
    qm = QuantMatrix.from_blocks(fmt, q, d, m)
    q2, d2, m2 = qm.blocks()
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(d2, d)
    np.testing.assert_array_equal(m2, m)
    assert qm.shape == (64, 45) and qm.size == 64 * 45


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(FORMATS),
       rows=st.one_of(st.integers(1, 100), st.sampled_from([128, 256])),   # 256: 4 groups
       nb=st.integers(1, 5),
       T=st.sampled_from([1, 2, FEW_ROWS, FEW_ROWS + 1, 7, 16, 17, 40]),
       threads=st.integers(1, numba.config.NUMBA_NUM_THREADS), seed=st.integers(0, 2**16))
def test_every_kernel_equals_the_reference(fmt, rows, nb, T, threads, seed):
    rng = np.random.default_rng(seed)
    cols = nb * 32
    raw = file_bytes(random_matrix(rng, rows, cols), fmt)
    w = dequantize_raw(raw, fmt, rows, cols)                     # [out, in], the reference
    qm = QuantMatrix.from_blocks(fmt, *parse_blocks(raw, fmt, rows, cols))
    x = rng.standard_normal((T, cols)).astype(np.float32)
    old = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        y = x @ qm                                               # [T, rows]
        ids = rng.integers(0, rows, size=5)
        emb = qm[ids]                                            # [5, cols]
    finally:
        numba.set_num_threads(old)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert y.shape == (T, rows) and y.dtype == np.float32
    # float32 sums of 32 nb products: the error scales with the products' size, not with
    # the result (a sum that cancels to 0.38 from terms of 3 is as right as it gets).
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.T.astype(np.float64))
    assert np.abs(y - ref).max() / scale.max() < 1e-5
    np.testing.assert_array_equal(emb, w[ids])                   # same formula, exact
    np.testing.assert_array_equal(qm.dequantize(), w.T)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [45, 64, 256])                    # 1, 1 and 4 groups
def test_every_row_gets_the_bits_of_a_one_row_product(fmt, rows):
    # Batch invariance: a row's result must not depend on how many rows share the call,
    # so that a verify step scores each draft as a decode step would. T = 1-3 run `rows`
    # (one, two or three rows sharing each code's conversion, over 64, 32 or 16 lanes),
    # T >= 4 `batch` in chunks and passes that differ with T (3-5 rows, <= 16 a chunk).
    rng = np.random.default_rng(rows)
    raw = file_bytes(random_matrix(rng, rows, 96), fmt)
    qm = QuantMatrix.from_blocks(fmt, *parse_blocks(raw, fmt, rows, 96))
    ref_w = dequantize_raw(raw, fmt, rows, 96).T.astype(np.float64)
    x = rng.standard_normal((40, 96)).astype(np.float32)
    alone = np.concatenate([x[t:t + 1] @ qm for t in range(40)])          # one row a call
    scale = (np.abs(x.astype(np.float64)) @ np.abs(ref_w)).max()
    assert np.abs(alone - x.astype(np.float64) @ ref_w).max() / scale < 1e-5
    for T in [*range(2, 21), 33, 40]:
        np.testing.assert_array_equal(x[:T] @ qm, alone[:T], err_msg=f"T={T}")
    for size in range(4, 17):                    # a chunk's passes never read past it
        left = size
        while left:
            n = PASSES.pass_rows(left)
            assert 3 <= n <= min(left, 5), (size, left, n)
            left -= n
    w = qm.packed                                          # the kernels' record
    inputs = K.inputs(x[:9], kind_of(fmt))                  # any cut of the lanes into
    for parts in (1, 2, 3, 7, 1000):                        # parts: the same bits
        y = np.empty((9, w.padded_rows), np.float32)
        K.batch(w, inputs, y, parts)
        np.testing.assert_array_equal(y[:, :rows], alone[:9], err_msg=f"parts={parts}")
    with pytest.raises(pnp.ShapeError, match="at least 4"):        # its passes need 3+ rows
        K.batch(w, K.inputs(x[:3], w.kind), np.empty((3, w.padded_rows), np.float32), 2)
    with pytest.raises(pnp.ShapeError, match="1 to 3"):            # it would drop the 4th
        K.rows(w, K.inputs(x[:4], w.kind), np.empty((4, w.padded_rows), np.float32))


@numba.njit
def _codes_tile(qf, qb, R, kind, wf):
    """A block's codes tile as the first pass of ``batch`` builds it, row by row."""
    for c in range(0, R, 16):
        if kind == Q4:
            for j in range(16):
                PASSES.tile_row(qf, qb + j * R + c, wf, 2 * j * R + c, True, PASSES.LOW)
                PASSES.tile_row(qf, qb + j * R + c, wf, (2 * j + 1) * R + c, True, PASSES.BYTE)
        else:
            for j in range(32):
                PASSES.tile_row(qf, qb + j * R + c, wf, j * R + c, True, PASSES.SIGNED)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [45, 256])                        # 1 and 4 groups
def test_codes_tile_and_inputs_pair_each_code_with_its_input(fmt, rows):
    # The tile row j holds the codes that multiply xp[:, 32 b + j]: Q8's code j; for Q4
    # byte row j's low code (weight j) in row 2j, its whole byte in row 2j + 1, and xp
    # pairs them with x_j - x_{j+16}/16 and x_{j+16}/16 (lo x_j + hi x_{j+16} exactly).
    rng = np.random.default_rng(rows)
    q, d, m = parse_blocks(file_bytes(random_matrix(rng, rows, 96), fmt), fmt, rows, 96)
    qm = QuantMatrix.from_blocks(fmt, q, d, m)
    w = qm.packed
    G, nb, J, R = w.groups, w.blocks, w.code_rows, w.lanes
    q = np.pad(q, ((0, G * R - rows), (0, 0), (0, 0))).astype(np.float32)   # [G*R, nb, 32]
    wf = np.empty(32 * R, np.float32)
    for g in range(G):
        for b in range(nb):
            _codes_tile(w.codes, (g * nb + b) * J * R, R, w.kind, wf)
            codes = q[g * R:(g + 1) * R, b].T                              # [32, R]
            if fmt != "Q8_0":                                  # lo_j, lo_j + 16 hi_j = byte
                codes = np.stack([codes[:16], codes[:16] + 16 * codes[16:]], 1).reshape(32, R)
            np.testing.assert_array_equal(wf.reshape(32, R), codes, err_msg=f"{g} {b}")
    x = rng.standard_normal((5, 96)).astype(np.float32)
    xp, xs = K.inputs(x, kind_of(fmt))
    if kind_of(fmt) == Q8:
        assert xp is x and xs.shape == (5, 0)
        return
    np.testing.assert_allclose(xs, x.reshape(5, 3, 32).sum(axis=2), rtol=1e-6)
    lo, hi = x.reshape(5, 3, 2, 16)[:, :, 0], x.reshape(5, 3, 2, 16)[:, :, 1]
    pairs = xp.reshape(5, 3, 16, 2)
    np.testing.assert_array_equal(pairs[..., 1], hi * np.float32(0.0625))  # exact: 2**-4
    np.testing.assert_array_equal(pairs[..., 0], lo - hi * np.float32(0.0625))  # one rounding


@pytest.mark.parametrize("rows", [256, 192, 45])
def test_groups_are_64_rows_wide_and_the_last_is_padded(rows):
    rng = np.random.default_rng(rows)
    raw = file_bytes(random_matrix(rng, rows, 64), "Q4_1")
    qm = QuantMatrix.from_blocks("Q4_1", *parse_blocks(raw, "Q4_1", rows, 64))
    assert qm.packed.lanes == 64 and qm.packed.groups == -(-rows // 64)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ref = x.astype(np.float64) @ dequantize_raw(raw, "Q4_1", rows, 64).T.astype(np.float64)
    assert rel_err(x @ qm, ref) < 1e-5


def test_concat_fuses_along_outputs():
    rng = np.random.default_rng(4)
    parts = [QuantMatrix.from_blocks("Q4_1", *parse_blocks(
        file_bytes(random_matrix(rng, r, 64), "Q4_1"), "Q4_1", r, 64)) for r in (40, 8, 8)]
    fused = QuantMatrix.concat(parts)
    np.testing.assert_array_equal(fused.dequantize(),
                                  np.concatenate([p.dequantize() for p in parts], axis=1))
    mixed = QuantMatrix.concat([parts[0], QuantMatrix.from_float(parts[1].dequantize())])
    assert mixed.fmt == "F32" and mixed.shape == (64, 48)


def test_dense_formats_multiply_with_blas():
    w = np.random.default_rng(5).standard_normal((64, 10)).astype(np.float32)   # [in, out]
    qm = QuantMatrix.dense(w, "F16")
    x = np.ones((3, 64), np.float32)
    np.testing.assert_allclose(x @ qm, x @ w, rtol=1e-6)
    np.testing.assert_array_equal(qm[np.array([2])], w.T[[2]])


@pytest.mark.parametrize("fmt", FORMATS)
def test_refused_inputs_get_named_errors(fmt):
    raw = file_bytes(random_matrix(np.random.default_rng(6), 4, 64), fmt)
    qm = QuantMatrix.from_blocks(fmt, *parse_blocks(raw, fmt, 4, 64))
    with pytest.raises(pnp.DTypeError, match="x must be float32"):
        np.ones((1, 64), np.float64) @ qm
    with pytest.raises(pnp.ShapeError, match=r"x must be \[T, 64\]"):
        np.ones((1, 63), np.float32) @ qm
    with pytest.raises(pnp.ShapeError, match=r"x must be \[T, 64\]"):
        np.ones(64, np.float32) @ qm
    with pytest.raises(pnp.IndexOutOfRange, match="ids"):
        qm[np.array([4])]
    with pytest.raises(pnp.IndexOutOfRange, match="ids"):
        qm[np.array([-1])]
    with pytest.raises(pnp.ShapeError, match="raw"):
        parse_blocks(raw[:-1], fmt, 4, 64)
    with pytest.raises(pnp.ShapeError, match="cols"):
        parse_blocks(raw, fmt, 4, 48)
    with pytest.raises(pnp.DTypeError, match="fmt"):
        parse_blocks(raw, "Q4_K", 4, 64)
    with pytest.raises(pnp.ShapeError, match="w"):
        quantize_q8_0(np.ones((4, 40), np.float32))


def test_empty_input_gives_an_empty_result():
    qm = QuantMatrix.from_float(np.ones((32, 5), np.float32))
    assert (np.zeros((0, 32), np.float32) @ qm).shape == (0, 5)


def test_the_float_words_compute_alike_jitted_and_in_python():
    # simd's float32 words have NumPy twins (so kernels written with them run under
    # NUMBA_DISABLE_JIT): jitted, they must give the same bits as the twins.
    from numba import njit

    from paged_np.quant import simd

    def words(a, b, out):
        va, vb = simd.load_f32(a, 0), simd.load_f32(b, 16)
        simd.store_f32(out, 0, simd.add(va, vb))
        simd.store_f32(out, 16, simd.maximum(va, vb))
        simd.store_f32(out, 32, simd.add(simd.zeros_f32(), simd.splat(a[3])))
        return simd.lane(simd.maximum(va, vb), 5)

    rng = np.random.default_rng(0)
    a = rng.standard_normal(32).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    b[16:20] = a[:4]                                             # ties for maximum
    jit_out, py_out = np.empty(48, np.float32), np.empty(48, np.float32)
    jit_lane, py_lane = njit(words)(a, b, jit_out), words(a, b, py_out)
    np.testing.assert_array_equal(jit_out, py_out)
    np.testing.assert_array_equal(py_out[:16], a[:16] + b[16:])
    np.testing.assert_array_equal(py_out[16:32], np.maximum(a[:16], b[16:]))
    np.testing.assert_array_equal(py_out[32:], np.full(16, a[3]))
    assert jit_lane == py_lane == max(a[5], b[21])


def test_formats_are_named_once():
    # One table each: the model's quantization choices are read from
    # paged_np.registry ("none" is None there), the block formats from
    # paged_np.quant.formats, and every block format has a kind the kernels know.
    from paged_np.models import QUANTIZATIONS
    from paged_np.quant.formats import BLOCK_FORMATS, KINDS
    from paged_np.registry import WEIGHT_QUANTIZATIONS

    assert QUANTIZATIONS == tuple(None if q == "none" else q for q in WEIGHT_QUANTIZATIONS)
    assert QUANT_FORMATS == {name: f.bytes for name, f in BLOCK_FORMATS.items()}
    assert {f.kind for f in BLOCK_FORMATS.values()} == set(KINDS) == {Q4, Q8}


_REFERENCE = r":(?:mod|func|data|class|meth|attr):`~?([\w.]+)`"


def _resolves(name: str, module: str) -> bool:
    """Whether a docstring's ``:role:`name``` names something that exists, read as
    Sphinx does: ``.x`` from the package, a bare name from the module, else absolute."""
    import importlib

    if name.startswith("."):
        name = "paged_np.quant" + name
    candidates = [name] if name.startswith("paged_np") else [f"{module}.{name}", name]
    mod = importlib.import_module(module)
    if "." not in name and any(hasattr(c, name) for c in vars(mod).values()
                               if isinstance(c, type) and c.__module__ == module):
        return True                                              # a method, from its class
    for full in candidates:
        parts = full.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
                return True
            except AttributeError:
                break
    return False


def test_the_quant_modules_name_only_what_exists():
    # No dead references: every :mod:/:func:/:data:/:class: a docstring or comment of
    # paged_np.quant points to resolves (a BATCH_KERNEL that was renamed away fails here).
    import re
    from pathlib import Path

    import paged_np.quant

    root = Path(paged_np.quant.__file__).parent
    dead = []
    for path in sorted(root.glob("*.py")):
        module = "paged_np.quant" + ("" if path.stem == "__init__" else f".{path.stem}")
        for name in re.findall(_REFERENCE, path.read_text()):
            if not _resolves(name, module):
                dead.append(f"{path.name}: {name}")
    assert not dead, dead
